"""An agent for any OpenAI-compatible chat-completions endpoint (OpenAI,
vLLM, llama.cpp's server, Ollama), through the official `openai` package
(the optional extra: `pip install 'sessionlog-store[openai]'`).

The streamed reply maps onto the in-flight API: content deltas are written
to the reply; token usage (`stream_options.include_usage`) goes to the
reply's token counts. With tools (agents/tools.py: Python callables, their
JSON Schema from their signatures) the agent is agentic: the tools are
offered to the model, each call it makes becomes a `tool_call` message
(role `tool`, its caller the reply; metadata `tool`, `tool_call_id`, its
`arguments`, its `round` and `reply_offset`, where the reply's text stood) whose text is
the tool's result, and the model is asked again with the results until it
answers without calling (at most `max_rounds` times). The next turn's
history gives the calls and results back in the shape the Chat Completions
API expects (an assistant message with `tool_calls`, a `tool` message per
result). Without tools, a call the model makes anyway is recorded (its
arguments, no result) and the turn ends.

Plug it in with `sessionlog serve --agent NAME=sessionlog_store.server.agents.openai_compat:from_env`:
sessions created with that `agent_id` are answered by it. `from_env` reads
`SESSIONLOG_OPENAI_MODEL` (required), `OPENAI_BASE_URL` and `OPENAI_API_KEY`
(as the `openai` package does; a local server needs no key). A factory of
your own passes `tools=[...]`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from sessionlog_store.projections.session import MessageSnapshot
from sessionlog_store.server.agents.tools import Tool, ToolFailed, registry
from sessionlog_store.server.domain.inflight import InflightMessage

if TYPE_CHECKING:
    from sessionlog_store.server.domain.store import SessionStore

_ROLES = frozenset({"system", "user", "assistant"})
MAX_ROUNDS: Final = 8


class OpenAIAgent:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 system: str | None = None, client: Any = None,
                 tools: Sequence[Callable[..., Any] | Tool] = (), max_rounds: int = MAX_ROUNDS) -> None:
        if client is None:
            from openai import AsyncOpenAI  # the optional extra
            client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed")
        self.client = client
        self.model = model
        self.system = system
        self.tools = registry(tools)
        self.max_rounds = max_rounds

    def messages(self, history: Sequence[MessageSnapshot]) -> list[dict[str, Any]]:
        """The conversation in the Chat Completions shape: a reply that
        called tools is, per round, its text before the calls with their
        `tool_calls`, one `tool` message per result, then its text after."""
        out: list[dict[str, Any]] = [{"role": "system", "content": self.system}] if self.system else []
        calls: dict[str, list[MessageSnapshot]] = {}
        for m in history:
            if m.kind == "tool_call" and m.caller is not None:
                calls.setdefault(m.caller, []).append(m)
        for m in history:
            if m.role not in _ROLES:
                continue
            at = 0
            rounds: dict[tuple[int, int], list[MessageSnapshot]] = {}  # (round, offset): its calls
            for c in calls.get(m.msg_id, []) if m.role == "assistant" else []:
                offset = int(c.metadata.get("reply_offset", len(m.content)))
                rounds.setdefault((int(c.metadata.get("round", 0)), offset), []).append(c)
            for key in sorted(rounds):
                out.append({"role": "assistant", "content": m.content[at:key[1]] or None,
                            "tool_calls": [_call(c) for c in rounds[key]]})
                out += [{"role": "tool", "tool_call_id": str(c.metadata.get("tool_call_id", "")),
                         "content": c.content if "arguments" in c.metadata else ""} for c in rounds[key]]
                at = max(at, key[1])
            if m.content[at:]:
                out.append({"role": m.role, "content": m.content[at:]})
        return out

    async def respond(self, store: SessionStore, session_id: str, history: Sequence[MessageSnapshot],
                      reply: InflightMessage) -> None:
        turn: list[dict[str, Any]] = []  # this turn's rounds so far
        written = 0
        for round_no in range(self.max_rounds):
            ask: dict[str, Any] = {"model": self.model, "messages": self.messages(history) + turn, "stream": True,
                                   "stream_options": {"include_usage": True}}
            if self.tools:
                ask["tools"] = [t.spec() for t in self.tools.values()]
            stream = await self.client.chat.completions.create(**ask)
            finished, usage, text = False, None, []
            asked: dict[int, dict[str, str]] = {}  # the round's tool calls: index -> id, name, arguments
            async for chunk in stream:
                usage = getattr(chunk, "usage", None) or usage  # the last one reported counts
                for choice in chunk.choices or ():
                    finished = finished or choice.finish_reason is not None
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        reply.write(delta.content)
                        text.append(delta.content)
                        written += len(delta.content)
                    for tc in delta.tool_calls or ():
                        call = asked.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                        call["id"] = tc.id or call["id"]
                        if tc.function is not None:
                            call["name"] = tc.function.name or call["name"]
                            call["arguments"] += tc.function.arguments or ""
            if usage is not None:
                reply.add_tokens(input=int(usage.prompt_tokens or 0), output=int(usage.completion_tokens or 0))
            if not finished:  # cut off upstream (or not a stream at all): never call it done
                raise RuntimeError("the upstream stream ended without a finish_reason (the reply is cut off)")
            if not asked:
                return
            turn.append({"role": "assistant", "content": "".join(text) or None,
                         "tool_calls": [{"id": c["id"], "type": "function",
                                         "function": {"name": c["name"], "arguments": c["arguments"]}}
                                        for _, c in sorted(asked.items())]})
            for _, c in sorted(asked.items()):
                turn.append({"role": "tool", "tool_call_id": c["id"],
                             "content": await self._run(store, session_id, reply, c, written, round_no)})
            if not self.tools:
                return  # (calls of tools this agent has none of: recorded, the turn ends)
        raise RuntimeError(f"the model still called tools after {self.max_rounds} rounds")

    async def _run(self, store: SessionStore, session_id: str, reply: InflightMessage, c: dict[str, str],
                   offset: int, round_no: int) -> str:
        """One tool call as a message under the reply: its arguments in its
        metadata, the tool's result (or why it failed) as its text."""
        meta = {"tool": c["name"] or "?", "tool_call_id": c["id"], "arguments": c["arguments"],
                "reply_offset": offset, "round": round_no}
        async with store.inflight(session_id, kind="tool_call", role="tool", parent_id=reply.msg_id,
                                  caller=reply.msg_id, metadata=meta) as call:
            if not self.tools:
                return ""
            tool = self.tools.get(c["name"])
            try:
                if tool is None:
                    raise ToolFailed(f"no tool named {c['name']!r}")
                result = await tool.call(c["arguments"])
            except ToolFailed as e:
                result = f"error: {e}"
            call.write(result)
            return result


def _call(c: MessageSnapshot) -> dict[str, Any]:
    return {"id": str(c.metadata.get("tool_call_id", "")), "type": "function",
            "function": {"name": str(c.metadata.get("tool", "")),
                         "arguments": str(c.metadata.get("arguments", c.content))}}


def from_env() -> OpenAIAgent:
    model = os.environ.get("SESSIONLOG_OPENAI_MODEL")
    if not model:
        raise ValueError("the OpenAI-compatible agent needs $SESSIONLOG_OPENAI_MODEL (a model name)")
    return OpenAIAgent(model, base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"),
                       system=os.environ.get("SESSIONLOG_OPENAI_SYSTEM"))
