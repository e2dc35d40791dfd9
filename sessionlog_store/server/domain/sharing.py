"""What the session store asks of a worker when its event log is shared
with other processes (a replicated stream other `sessionlog serve` workers
write too). The domain names only this contract; the JetStream worker that
keeps it lives in server/scaleout/ (leases, the tail of other workers'
records, the sweeper, checkpoints in the object bucket), so a backend of
another kind brings its own and touches no domain module.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


from sessionlog_store.server.domain.subscriptions import MsgUpdate


class SharedLog(Protocol):
    @property
    def backend(self) -> str:
        """Its kind, for operators ("jetstream")."""
    @property
    def name(self) -> str:
        """The shared log's name (a stream's)."""
    @property
    def start_seconds(self) -> float:
        """How long the start's replay took."""

    def figures(self) -> list[tuple[str, str, str, float]]:
        """What it counts, for /metrics: (kind "counter" or "gauge", name, help, value)."""

    # -- replies streamed here ------------------------------------------------
    async def reply_starting(self, sid: str, msg_id: str, turn: bool = False) -> None:
        """Before a reply's placeholder is written: take its ownership (raises
        when another worker holds it, or the log does not answer); with
        `turn`, the session's turn too (Conflict `reply_running` while
        another turn's reply runs on any worker), given up when it ends."""
    async def reply_ended(self, sid: str, msg_id: str) -> None:
        """After a reply's finalize (or a failed start): give its ownership up."""
    def stop_pending(self, sid: str, msg_id: str) -> bool:
        """Another worker asked to stop this reply before it went live."""
    async def stop_elsewhere(self, sid: str, msg_id: str) -> bool:
        """Ask the worker streaming the reply to stop it; False: none answered."""
    def others_running(self) -> Iterable[tuple[tuple[str, str], dict[str, Any]]]:
        """The replies other workers stream: ((session, message), row)."""

    # -- what clients are told ------------------------------------------------
    def hold(self, update: MsgUpdate) -> None:
        """A progress update of this worker's, told once the log holds it."""
    def stream_end(self, sid: str, update: MsgUpdate) -> MsgUpdate:
        """The terminal update to tell, now that its finalize is durable."""

    # -- reads (the reads themselves, its checkpoints and its background work
    # are the keeper's: a worker is the store's keeper too, domain/keeping.py)
    def reload_needed(self, sid: str) -> bool:
        """Another writer's records voided a load under way: load again."""
