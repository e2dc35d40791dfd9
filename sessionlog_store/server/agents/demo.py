"""The demo agent. `DemoAgent` is built in: offline and deterministic, it streams a
reply token by token at a realistic pace (30 tokens/s by default), and for
some prompts runs a tool call and an agentic function with a growing tree, so
every in-flight kind can be seen.
"""
from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from sessionlog_store.projections.session import MessageSnapshot

from sessionlog_store.server.domain.inflight import InflightMessage

if TYPE_CHECKING:
    from sessionlog_store.server.domain.store import SessionStore


_SENTENCES = [
    "Here is how I would approach it.",
    "First, write down what must never be lost, and make that durable before anything else.",
    "An append-only log keeps every change in order, so replaying it rebuilds the state exactly.",
    "Small batches of writes share one flush to disk, which keeps durability cheap.",
    "While a reply streams, a placeholder is already on disk and its progress follows every quarter second.",
    "If the page reloads, it asks for exactly the characters it is missing and carries on.",
    "If the backend dies, the next start marks the unfinished reply as aborted and keeps its text.",
    "You can retry any reply; the old answer stays on its own branch.",
    "Let me know if you want me to go deeper into any of these steps.",
    "A checkpoint makes the next start fast, and deleting it loses nothing.",
    "Tests kill real processes to prove that nothing acknowledged is lost.",
]


class DemoAgent:
    """Deterministic offline replies. `speed` is tokens per second (0: no pauses)."""

    def __init__(self, speed: float = 30.0, tokens: tuple[int, int] = (60, 140)) -> None:
        self.speed = speed
        self.tokens = tokens

    def plan(self, prompt: str) -> tuple[list[str], bool, bool]:
        """The reply's tokens and whether it calls a tool / an agentic function.
        Replies carry Markdown as real LLM replies do: a bold opening, a list,
        a link, and in some replies a fenced code block."""
        seed = int.from_bytes(hashlib.sha256(prompt.encode("utf-8", "replace")).digest()[:8], "big")
        rng = random.Random(seed)
        n = rng.randint(*self.tokens)
        words: list[str] = ["**" + _SENTENCES[0][:-1] + "**:", "\n\n"]
        steps = rng.sample(_SENTENCES[1:], 3)
        for i, step in enumerate(steps, 1):
            words += [f"{i}."] + step.split() + ["\n"]
        words += ["\n", "See", "[the", "design", "notes](https://example.com/sessionlog/design)", "for", "more.",
                  "\n\n"]
        low = prompt.lower()
        if "code" in low or seed % 2 == 0:
            words += ["```python\nasync with open_session_store(root) as store:\n"
                      "    meta, _ = await store.create_session(first_message=\"hi\")\n```", "\n\n"]
        while len(words) < n:
            words += rng.choice(_SENTENCES).split() + ["\n\n" if rng.random() < 0.2 else ""]
        tokens = [w if w.startswith("\n") or w.endswith("\n") or w.startswith("```") else w + " "
                  for w in words[:n] if w != ""]
        tool = "tool" in low or "search" in low or seed % 3 == 0
        fn = "plan" in low or "agent" in low or seed % 4 == 0
        return tokens, tool, fn

    async def _pause(self, n: int = 1) -> None:
        await trio.sleep(n / self.speed if self.speed > 0 else 0)

    async def respond(self, store: SessionStore, session_id: str, history: Sequence[MessageSnapshot],
                      reply: InflightMessage) -> None:
        prompt = next((m.content for m in reversed(history) if m.role == "user"), "")
        tokens, tool, fn = self.plan(prompt)
        third = max(1, len(tokens) // 3)
        for i, tok in enumerate(tokens):
            reply.write(tok)
            reply.add_tokens(output=1)
            await self._pause()
            if i == third and tool:
                await self._tool_call(store, session_id, reply, prompt)
            if i == 2 * third and fn:
                await self._agentic_fn(store, session_id, reply)
        reply.add_tokens(input=sum(len(m.content.split()) for m in history))

    async def _tool_call(self, store: SessionStore, session_id: str, reply: InflightMessage, prompt: str) -> None:
        async with store.inflight(session_id, kind="tool_call", role="tool", parent_id=reply.msg_id,
                                  caller=reply.msg_id, metadata={"tool": "search"}) as call:
            call.write(f"search({prompt[:40]!r})\n")
            await self._pause(5)
            call.write("3 results: durable logs, group commit, exact resume\n")

    async def _agentic_fn(self, store: SessionStore, session_id: str, reply: InflightMessage) -> None:
        async with store.inflight(session_id, kind="agentic_fn", role="tool", parent_id=reply.msg_id,
                                  caller=reply.msg_id, metadata={"function": "plan_steps"}) as fn:
            steps: list[dict[str, str]] = []

            def tree(status: str) -> dict[str, object]:  # a fresh object each time: the log keeps it
                return {"name": "plan_steps", "status": status, "children": [dict(c) for c in steps]}
            for step in ("read the log", "fold the events", "write the answer"):
                steps.append({"name": step, "status": "running"})
                fn.set_tree(tree("running"))
                fn.write(f"- {step}\n")
                await self._pause(4)
                steps[-1]["status"] = "done"
                fn.set_tree(tree("running"))
            fn.set_tree(tree("done"))
