"""An agent for the page tests: replies with the user's message verbatim (so
a test can make a reply carry any Markdown or HTML it wants)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class EchoAgent:
    async def respond(self, store: Any, session_id: str, history: Sequence[Any], reply: Any) -> None:
        prompt = next((m.content for m in reversed(history) if m.role == "user"), "")
        reply.write(prompt)
