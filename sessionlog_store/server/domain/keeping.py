"""What the session store keeps beside its event log, and where it reads a
session from: the one seam between the domain and a backend's files or
buckets. The local engine's keeper (server/local/keeper.py) reads a
session's log file, keeps index.json and snapshot.json and checks, after a
start, the log prefixes its checkpoint let recovery skip; a worker on a
shared stream (server/scaleout/worker.py) reads the stream and keeps its
checkpoints in the stream's object bucket. The domain names only this
contract, so a backend of another kind brings its own keeper and touches no
domain module.
"""
from __future__ import annotations

from typing import Protocol

import trio

from sessionlog_store.projections.session import SessionState


class Keeper(Protocol):
    @property
    def checked(self) -> trio.Event:
        """Set once every record a start skipped reading has been checked."""

    # -- reads ----------------------------------------------------------------
    async def read_state(self, sid: str) -> SessionState:
        """A session's state as its log holds it (acknowledged records included)."""
    async def log_bytes(self, sid: str) -> bytes:
        """A session's records, framed as a log's lines, acknowledged ones included."""

    # -- what changed ---------------------------------------------------------
    def registry_changed(self) -> None:
        """A row changed: the registry's checkpoint is stale."""
    def session_changed(self, sid: str) -> None:
        """A message was created or ended: the session's snapshot is stale."""
    async def before_write(self, sid: str) -> None:
        """Before a session is written to: what must hold first (its skipped
        log prefix checked)."""
    async def remove(self, sid: str) -> None:
        """Its tombstone is durable: the session's records and caches go."""

    # -- on demand (operations and tests) -------------------------------------
    async def write_checkpoint(self) -> int:
        """Write the registry's checkpoint now; how many rows (or 1/0) it holds."""
    async def write_snapshot(self, sid: str) -> bool:
        """Write a loaded session's snapshot now; False when none could be."""
    async def check_logs(self) -> int:
        """Check now what a start skipped; how many sessions were quarantined."""

    # -- lifecycle ------------------------------------------------------------
    def start_background(self, nursery: trio.Nursery) -> None:
        """The debounced writers and the checks, until the store stops."""
    async def at_stop(self) -> None:
        """A graceful stop's last checkpoints."""
