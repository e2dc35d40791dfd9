"""The local engine's keeper (domain/keeping.py): a session read from its
log file, with what only the journal holds after a failed log write folded
in; index.json and the snapshots (caches.py); the background check of the
log prefixes a start skipped (startup.PrefixCheck).
"""
from __future__ import annotations

from collections.abc import Callable

import trio

from sessionlog_store.eventstore.errors import CorruptRecord, StoreBroken
from sessionlog_store.eventstore.local.commit import EventStore
from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.eventstore.record import decode_record
from sessionlog_store.projections.recovery import load_session_state
from sessionlog_store.projections.registry import Registry
from sessionlog_store.projections.session import SessionState
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.states import LoadedStates
from sessionlog_store.server.local.caches import Caches
from sessionlog_store.server.local.startup import PrefixCheck


class LocalKeeper:
    def __init__(self, es: EventStore, registry: Registry, states: LoadedStates, fs: FileOps, root: str,
                 config: StoreConfig, quarantine: Callable[[str, CorruptRecord], None]) -> None:
        self.es, self.fs, self.root = es, fs, root
        self.caches = Caches(es, registry, states, fs, root, config)
        self.prefix_check = PrefixCheck(es, fs, root, quarantine)

    @property
    def checked(self) -> trio.Event:
        return self.prefix_check.done

    # -- reads ----------------------------------------------------------------

    async def read_state(self, sid: str) -> SessionState:
        await self._flush_for_read(sid)
        state, _ = await trio.to_thread.run_sync(load_session_state, self.fs, self.root, sid)
        # After a failed log write, acknowledged records that only the journal
        # holds (until a restart writes them back) are folded in from memory.
        extra = self.es.unwritten(sid) if sid in self.es else b""
        end = self.es.durable_end(sid) if extra else 0
        for line in extra.splitlines(keepends=True):
            end += len(line)
            rec = decode_record(line)
            if rec.seq > state.seq:
                state.apply(rec, end)
        return state

    async def log_bytes(self, sid: str) -> bytes:
        await self._flush_for_read(sid)
        return await self.es.log_bytes(sid)

    async def _flush_for_read(self, sid: str) -> None:
        """Before a read of a log: everything appended to it so far is in the
        file (the other logs' lines linger on). Reads keep working after a
        write failure: they read what the log holds."""
        try:
            await self.es.flush(sid)
        except StoreBroken:
            pass

    # -- what changed ---------------------------------------------------------

    def registry_changed(self) -> None:
        self.caches.registry_changed()

    def session_changed(self, sid: str) -> None:
        self.caches.session_changed(sid)

    async def before_write(self, sid: str) -> None:
        if self.prefix_check.pending:
            await self.prefix_check.ensure(sid)

    async def remove(self, sid: str) -> None:
        self.caches.snapshot_dirty.discard(sid)
        # A snapshot being written into the folder finishes first; none starts
        # after (write_snapshot checks, under the same lock, that the session
        # is still there): the folder is removed whole, nothing is left behind.
        async with self.caches.snapshot_lock:
            await self.es.remove(sid)

    # -- on demand ------------------------------------------------------------

    async def write_checkpoint(self) -> int:
        return await self.caches.write_index()

    async def write_snapshot(self, sid: str) -> bool:
        return await self.caches.write_snapshot(sid)

    async def check_logs(self) -> int:
        return await self.prefix_check.check_all()

    # -- lifecycle ------------------------------------------------------------

    def start_background(self, nursery: trio.Nursery) -> None:
        nursery.start_soon(self.caches.index_loop)
        nursery.start_soon(self.caches.snapshot_loop)
        nursery.start_soon(self.prefix_check.run)

    async def at_stop(self) -> None:
        await self.caches.at_stop()
