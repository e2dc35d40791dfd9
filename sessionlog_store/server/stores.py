"""Which session store a config opens: the local engine's, or a worker's on a
shared stream (the composition root of the two; the domain knows neither
backend's worker)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore
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
