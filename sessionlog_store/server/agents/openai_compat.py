"""An agent for any OpenAI-compatible chat-completions endpoint (OpenAI,
vLLM, llama.cpp's server, Ollama), through the official `openai` package
(the optional extra: `pip install 'sessionlog-store[openai]'`).

The streamed reply maps onto the in-flight API: content deltas are written to
the reply; each tool call the model makes becomes a `tool_call` message
(role `tool`, its caller the reply) holding the call's arguments as they
stream, with `{"tool": name, "tool_call_id": id}` in its metadata; token
usage (`stream_options.include_usage`) goes to the reply's token counts.

Plug it in with `sessionlog serve --agent NAME=sessionlog_store.server.agents.openai_compat:from_env`:
sessions created with that `agent_id` are answered by it. `from_env` reads
`SESSIONLOG_OPENAI_MODEL` (required), `OPENAI_BASE_URL` and `OPENAI_API_KEY`
(as the `openai` package does; a local server needs no key).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from sessionlog_store.projections.session import MessageSnapshot

from sessionlog_store.server.domain.inflight import InflightMessage

if TYPE_CHECKING:
    from sessionlog_store.server.domain.store import SessionStore

_ROLES = frozenset({"system", "user", "assistant"})


class OpenAIAgent:
    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None,
                 system: str | None = None, client: Any = None) -> None:
        if client is None:
            from openai import AsyncOpenAI  # the optional extra
            client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed")
        self.client = client
        self.model = model
        self.system = system

    def messages(self, history: Sequence[MessageSnapshot]) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += [{"role": m.role, "content": m.content} for m in history if m.role in _ROLES and m.content]
        return out

    async def respond(self, store: SessionStore, session_id: str, history: Sequence[MessageSnapshot],
                      reply: InflightMessage) -> None:
        stream = await self.client.chat.completions.create(
            model=self.model, messages=self.messages(history), stream=True,
            stream_options={"include_usage": True})
        finished = False
        usage = None
        async with AsyncExitStack() as calls:
            open_calls: dict[int, InflightMessage] = {}
            async for chunk in stream:
                usage = getattr(chunk, "usage", None) or usage  # the last one reported counts
                for choice in chunk.choices or ():
                    finished = finished or choice.finish_reason is not None
                    delta = choice.delta
                    if delta is None:
                        continue
                    if delta.content:
                        reply.write(delta.content)
                    for tc in delta.tool_calls or ():
                        call = open_calls.get(tc.index)
                        fn = tc.function
                        if call is None:
                            meta = {"tool": (fn.name if fn is not None and fn.name else "?"),
                                    "tool_call_id": tc.id or ""}
                            call = await calls.enter_async_context(store.inflight(
                                session_id, kind="tool_call", role="tool", parent_id=reply.msg_id,
                                caller=reply.msg_id, metadata=meta))
                            open_calls[tc.index] = call
                        if fn is not None and fn.arguments:
                            call.write(fn.arguments)
        if usage is not None:
            reply.add_tokens(input=int(usage.prompt_tokens or 0), output=int(usage.completion_tokens or 0))
        if not finished:  # cut off upstream (or not a stream at all): never call it done
            raise RuntimeError("the upstream stream ended without a finish_reason (the reply is cut off)")


def from_env() -> OpenAIAgent:
    model = os.environ.get("SESSIONLOG_OPENAI_MODEL")
    if not model:
        raise ValueError("the OpenAI-compatible agent needs $SESSIONLOG_OPENAI_MODEL (a model name)")
    return OpenAIAgent(model, base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"),
                       system=os.environ.get("SESSIONLOG_OPENAI_SYSTEM"))
