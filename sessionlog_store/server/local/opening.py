"""A session store on the local engine: how it opens. The event store opens
(applying the journal), recovery reads the registry from index.json and the
logs' tails, the store is made around them with its keeper and the project
log, then the start (startup.py) and the store's background work."""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.eventstore.local.opening import open_event_store
from sessionlog_store.eventstore.local.projects import LocalProjectLog
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.inflight import SLOTS
from sessionlog_store.server.domain.store import SessionStore, running
from sessionlog_store.server.domain.titles import KeywordTitler, TitleGenerator
from sessionlog_store.server.local.keeper import LocalKeeper
from sessionlog_store.server.local.search import SearchIndex
from sessionlog_store.server.local.startup import recover, start


@asynccontextmanager
async def open_local_store(root: str, *, config: StoreConfig | None = None, fs: FileOps = OS_FILES,
                           titler: TitleGenerator | None = None) -> AsyncIterator[SessionStore]:
    """Open (recovering first) the session store on the local engine at
    `root`; background work (commit, throttled saver, checkpoints, titles)
    lives until the block exits, and a normal or cancelled exit shuts down
    gracefully. (sessionlog_store.server.stores.open_session_store picks
    this, or a worker on a shared stream for a config with a backend.)"""
    config = config or StoreConfig()
    if config.backend:
        raise ValueError("a config with a backend opens a worker: use "
                         "sessionlog_store.server.stores.open_session_store")
    root = os.path.abspath(root)
    async with open_event_store(root, fs=fs, sync_mode=config.sync_mode,
                                journal_sync_interval=config.journal_sync_interval,
                                log_write_interval=config.log_write_interval) as es:
        registry, damaged, report = await recover(fs, root)

        def keeper(s: SessionStore) -> LocalKeeper:
            return LocalKeeper(es, s.registry, s.states, fs, root, config, s.quarantine)
        # With the journal, progress saves are spread over slots of the interval.
        store = SessionStore(root, es, config, titler or KeywordTitler(), keeper, registry=registry,
                             progress_slots=SLOTS if es.journal else 1)
        kept = store.keeper
        assert isinstance(kept, LocalKeeper)
        await start(store, config, es, kept.caches, kept.prefix_check, LocalProjectLog(fs, root), damaged, report)
        at_start = {sid: es.last_seq(sid) for sid in store.registry.rows}  # (on this thread: before any append)
        search = await trio.to_thread.run_sync(lambda: SearchIndex(
            root, owner_of=lambda sid: (m.owner if (m := store.registry.get(sid)) is not None else None),
            at_start=at_start, content_of=store.loaded_content, read_state=kept.read_state, durable=es.durable))
        store.search = search
        es.listeners.append(search.on_record)
        try:
            async with running(store) as ready:
                ready.spawn(search.run)
                yield ready
        finally:
            es.listeners.remove(search.on_record)
            search.close()
