"""The generic streams' space on the local engine: an event store of its own
at `<data root>/streams/` (its lock, format stamp, journal and group commit:
the sessions' engine), its logs read at the start, and the space's sweeper
running until the block exits."""
from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import trio

from sessionlog_store.eventstore.events import SessionDeleted
from sessionlog_store.eventstore.local.commit import JOURNAL_SYNC_INTERVAL, LOG_WRITE_INTERVAL, EventStore, SyncMode
from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.eventstore.local.log import list_session_ids, log_path, read_log, repair_torn_tail
from sessionlog_store.eventstore.local.opening import open_event_store
from sessionlog_store.eventstore.record import Record, scan
from sessionlog_store.server.domain.streamspace import StreamSpace

log = logging.getLogger("sessionlog.streams")

STREAMS_DIR: Final = "streams"


def read_stream_logs(es: EventStore, fs: FileOps, root: str
                     ) -> tuple[dict[str, list[Record]], list[str], dict[str, str]]:
    """In a worker thread: every stream log's records (a torn tail cut and
    kept aside, as a session's is), registered with the event store; the
    logs whose tombstone says to finish their removal; the damaged ones
    (read-only: their records before the damage, and what is wrong)."""
    logs: dict[str, list[Record]] = {}
    tombstoned: list[str] = []
    damaged: dict[str, str] = {}
    for log_id in list_session_ids(fs, root):
        data = read_log(fs, root, log_id)
        found = scan(log_id, data)
        if found.torn_bytes:
            torn = repair_torn_tail(fs, log_path(root, log_id), log_id, data, found.good_end)
            log.warning("%s", torn)
        es.register(log_id, found.records[-1].seq if found.records else 0, found.good_end, found.corrupt)
        if found.corrupt is not None:
            log.error("%s: stream read-only (its log is damaged)", found.corrupt)
            damaged[log_id] = str(found.corrupt)
        if found.corrupt is None and found.records and isinstance(found.records[-1].event, SessionDeleted):
            tombstoned.append(log_id)
        else:
            logs[log_id] = found.records
    return logs, tombstoned, damaged


@asynccontextmanager
async def open_stream_space(data_root: str, *, fs: FileOps = OS_FILES, sync_mode: SyncMode = "journal",
                            journal_sync_interval: float = JOURNAL_SYNC_INTERVAL,
                            log_write_interval: float = LOG_WRITE_INTERVAL) -> AsyncIterator[StreamSpace]:
    """The space of the data root `data_root` (its streams in `streams/`),
    open until the block exits."""
    root = os.path.join(os.path.abspath(data_root), STREAMS_DIR)
    await trio.to_thread.run_sync(fs.makedirs, root)
    async with open_event_store(root, fs=fs, sync_mode=sync_mode, journal_sync_interval=journal_sync_interval,
                                log_write_interval=log_write_interval) as es:
        logs, tombstoned, damaged = await trio.to_thread.run_sync(read_stream_logs, es, fs, root)
        for log_id in tombstoned:
            await es.remove(log_id)
        space = StreamSpace(es)
        space.load(logs, damaged)
        async with trio.open_nursery() as nursery:
            await nursery.start(space.run)
            yield space
            nursery.cancel_scope.cancel()
