"""Which session store a config opens: the local engine's, or a worker's on a
shared stream (the composition root of the two; the domain knows neither
backend's worker)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore
from sessionlog_store.server.domain.streamspace import StreamSpace
from sessionlog_store.server.local.streamspace import open_stream_space
from sessionlog_store.server.scaleout.streamspace import open_shared_stream_space
from sessionlog_store.server.local.opening import open_local_store
from sessionlog_store.server.domain.titles import TitleGenerator
from sessionlog_store.server.scaleout.opening import open_worker_store


@asynccontextmanager
async def open_session_store(root: str, *, config: StoreConfig | None = None, fs: FileOps = OS_FILES,
                             titler: TitleGenerator | None = None) -> AsyncIterator[SessionStore]:
    """Open (recovering first) the session store at `root`, or, when
    `config.backend` names NATS servers, a worker's store on that shared
    stream; background work lives until the block exits, and a normal or
    cancelled exit shuts down gracefully (docs/API.md)."""
    config = config or StoreConfig()
    if config.backend:

        async with open_worker_store(root, config, titler=titler) as store:
            yield store
        return
    async with open_local_store(root, config=config, fs=fs, titler=titler) as store:
        yield store


@asynccontextmanager
async def open_streams(root: str, *, config: StoreConfig | None = None,
                       fs: FileOps = OS_FILES) -> AsyncIterator[StreamSpace]:
    """The generic streams' space a config opens beside its session store:
    the data root's, or the one every worker on `config.backend`'s stream shares."""
    config = config or StoreConfig()
    if config.backend:
        async with open_shared_stream_space(config) as shared:
            yield shared
        return
    async with open_stream_space(root, fs=fs, sync_mode=config.sync_mode,
                                 journal_sync_interval=config.journal_sync_interval,
                                 log_write_interval=config.log_write_interval) as space:
        yield space
