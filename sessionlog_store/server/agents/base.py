"""The agent interface, and loading agents named on the command line.

`Agent` is what a real LLM plugs into: `respond()` gets the store, the
session, the conversation so far and the live reply handle, and writes into
it. `sessionlog serve --agent NAME=module:factory` routes sessions whose
`agent_id` is NAME to the factory's agent.
"""
from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from sessionlog_store.projections.session import MessageSnapshot

if TYPE_CHECKING:
    from sessionlog_store.server.domain.inflight import InflightMessage
    from sessionlog_store.server.domain.store import SessionStore


class Agent(Protocol):
    async def respond(self, store: SessionStore, session_id: str, history: Sequence[MessageSnapshot],
                      reply: InflightMessage) -> None: ...


def load_agents(specs: Sequence[str]) -> dict[str, Agent]:
    """`NAME=module:factory` each: the factory (called with no argument) makes
    the agent that answers sessions whose `agent_id` is NAME."""
    out: dict[str, Agent] = {}
    for spec in specs:
        name, sep, target = spec.partition("=")
        module, sep2, attr = target.partition(":")
        if not (sep and sep2 and name and module and attr):
            raise ValueError(f"{spec!r} is not NAME=module:factory")
        out[name] = getattr(importlib.import_module(module), attr)()
    return out


