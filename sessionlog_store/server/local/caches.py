"""A local store's caches on disk: `index.json` (the registry checkpoint) and each
session's `snapshot.json`, written after a debounce, at a stop, and never ahead
of what is durable. Deleting them loses nothing (startup replays the logs).

Owned by the local keeper (keeper.py), which hands it what it reads: the
event store, the registry, the loaded states, the data root and the intervals.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from sessionlog_store.eventstore.errors import EventStoreError
from sessionlog_store.projections.checkpoint import (IndexCheckpoint, SessionEntry, encode_index, encode_snapshot,
                                                     write_index, write_snapshot)

if TYPE_CHECKING:
    from sessionlog_store.eventstore.local.commit import EventStore
    from sessionlog_store.eventstore.local.fsio import FileOps
    from sessionlog_store.projections.registry import Registry
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.domain.states import LoadedStates

log = logging.getLogger("sessionlog.store")

# Snapshots written at a graceful stop (of the sessions whose messages had
# ended since the last debounce); the rest are rebuilt from the logs' tails.
STOP_SNAPSHOTS: Final = 64


class Caches:
    """Debounced writers of index.json and snapshot.json for one store."""

    def __init__(self, es: EventStore, registry: Registry, states: LoadedStates, fs: FileOps, root: str,
                 config: StoreConfig) -> None:
        self.es, self.registry, self.states, self.fs, self.root, self.config = es, registry, states, fs, root, config
        self.index_dirty = trio.Event()
        self.snapshot_dirty: set[str] = set()
        self._snapshot_wake = trio.Event()
        self._index_lock = trio.Lock()
        # Held while a snapshot is written: a deletion waits for it, so a
        # folder is removed whole (SessionStore.delete_session).
        self.snapshot_lock = trio.Lock()

    def registry_changed(self) -> None:
        if not self.index_dirty.is_set():
            self.index_dirty.set()

    def session_changed(self, session_id: str) -> None:
        self.snapshot_dirty.add(session_id)
        self._snapshot_wake.set()

    async def write_index(self, hurry: bool = True) -> int:
        """Write index.json with every row whose state is durable. Returns rows
        written. `hurry` False (the periodic checkpoint): it waits for the
        logs without ending the log writer's linger (at most its interval);
        a start, a stop or a caller waiting for it does not wait so."""
        es, registry = self.es, self.registry
        async with self._index_lock:
            await es.flush(hurry=hurry)
            entries = {}
            for sid, meta in registry.rows.items():
                mark = registry.marks.get(sid)
                if mark is None or sid not in es or es.corruption(sid) is not None:
                    continue  # a quarantined session is never checkpointed: startup replays it
                if mark.meta_seq <= es.written_seq(sid):
                    entries[sid] = SessionEntry(seq=es.written_seq(sid), end=es.durable_end(sid), meta=meta)
            data = encode_index(IndexCheckpoint(written_at=time.time(), sessions=entries))
            await trio.to_thread.run_sync(write_index, self.fs, self.root, data)
            return len(entries)

    async def write_snapshot(self, session_id: str) -> bool:
        """Write a loaded session's snapshot.json as of a durable seq."""
        es, states = self.es, self.states
        state = states.get(session_id)
        if state is None or session_id not in es:
            return False
        if state.seq > es.durable_seq(session_id):
            await es.wait_durable(session_id, state.seq)
        state = states.get(session_id)
        if state is None or session_id not in es or state.seq > es.durable_seq(session_id):
            return False
        data = encode_snapshot(state)
        async with self.snapshot_lock:
            if session_id not in es or states.get(session_id) is not state:
                return False  # deleted (or reloaded) while waiting
            await trio.to_thread.run_sync(write_snapshot, self.fs, self.root, session_id, data)
        return True

    async def write(self, write: Callable[..., Any], *args: Any) -> None:
        """Checkpoints are caches: a failed write leaves the old file (the temp
        file is never renamed over it), is logged, and a later debounce writes a
        new file. A broken log store ends the attempts."""
        if self.es.broken is not None:
            return
        try:
            await write(*args)
        except (OSError, EventStoreError) as e:
            log.error("writing a checkpoint failed (the logs are intact; startup will replay more): %s", e)

    async def index_loop(self) -> None:
        while True:
            await self.index_dirty.wait()
            await trio.sleep(self.config.checkpoint_interval)
            self.index_dirty = trio.Event()
            await self.write(self.write_index, False)  # (not a burst of a write for every log each time)

    async def snapshot_loop(self) -> None:
        while True:
            await self._snapshot_wake.wait()
            await trio.sleep(self.config.snapshot_interval)
            self._snapshot_wake = trio.Event()
            dirty, self.snapshot_dirty = self.snapshot_dirty, set()
            for sid in dirty:
                await self.write(self.write_snapshot, sid)

    async def at_stop(self) -> None:
        """The snapshots of the sessions whose messages just ended (at most
        STOP_SNAPSHOTS), then index.json. Other snapshots are left to the
        debounce: a session without a fresh one is loaded by replaying its
        log's tail, and writing thousands here would make a stop slow."""
        dirty, self.snapshot_dirty = list(self.snapshot_dirty), set()
        for sid in dirty[:STOP_SNAPSHOTS]:
            await self.write(self.write_snapshot, sid)
        await self.write(self.write_index)
