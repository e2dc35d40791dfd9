"""Tools an agent offers its model: plain Python callables (sync or
async), each described to the model by the JSON Schema of its signature
(msgspec makes it from the parameters' annotations; the docstring's first
paragraph is the description) and called with the model's arguments
decoded and checked against the same types. A simple registry, not MCP:
the factory that makes the agent names its tools."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec
import trio

_ENCODER = msgspec.json.Encoder()


class ToolFailed(Exception):
    """A tool call that could not be made (unknown tool, bad arguments) or
    that raised: its text goes back to the model as the call's result."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]       # JSON Schema of the arguments (an object)
    arguments: type[msgspec.Struct]  # what the model's arguments decode into
    fn: Callable[..., Any]

    def spec(self) -> dict[str, Any]:
        """As the Chat Completions API's `tools` list takes it."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    async def call(self, arguments: str) -> str:
        """Run it with the model's arguments (JSON text); its result as text
        (a str as it is, anything else as JSON). ToolFailed says why not."""
        try:
            args = msgspec.json.decode(arguments or "{}", type=self.arguments)
        except msgspec.DecodeError as e:
            raise ToolFailed(f"bad arguments for {self.name}: {e}") from None
        kwargs = {f: getattr(args, f) for f in args.__struct_fields__}
        try:
            if inspect.iscoroutinefunction(self.fn):
                result = await self.fn(**kwargs)
            else:  # (a blocking callable: off the event loop)
                result = await trio.to_thread.run_sync(lambda: self.fn(**kwargs))
        except Exception as e:  # noqa: BLE001 - the model is told, and may try otherwise
            raise ToolFailed(f"{self.name} failed: {type(e).__name__}: {e}") from None
        return result if isinstance(result, str) else _ENCODER.encode(result).decode()


def tool(fn: Callable[..., Any], *, name: str | None = None) -> Tool:
    """A Tool from a callable: every parameter annotated (its JSON Schema
    type), those with defaults optional."""
    hints = get_type_hints(fn)
    fields: list[Any] = []
    for p in inspect.signature(fn).parameters.values():
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} has no type annotation")
        fields.append((p.name, hints[p.name]) if p.default is inspect.Parameter.empty
                      else (p.name, hints[p.name], p.default))
    struct = msgspec.defstruct(f"{fn.__name__}_arguments", fields, forbid_unknown_fields=True)
    schema = msgspec.json.schema(struct)
    parameters = schema["$defs"][struct.__name__] if "$defs" in schema else schema
    parameters.pop("title", None)
    doc = inspect.getdoc(fn) or ""
    return Tool(name or fn.__name__, doc.split("\n\n")[0].replace("\n", " "), parameters, struct, fn)


def registry(tools: Sequence[Callable[..., Any] | Tool]) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for t in tools:
        made = t if isinstance(t, Tool) else tool(t)
        if made.name in out:
            raise ValueError(f"two tools named {made.name!r}")
        out[made.name] = made
    return out
