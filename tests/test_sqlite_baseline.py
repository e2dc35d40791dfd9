"""The bench's fair SQLite baseline (bench/sqlite_store.py, issue 29 item
3) is a real event log: it passes the backend contract, and a session
store on it streams and reads back a reply as ours does, so the bench
compares equal work."""
from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from bench.sqlite_store import open_sqlite_log, open_sqlite_store
from sessionlog_store.eventstore import FileOps
from sessionlog_store.eventstore.backend import EventLog
from sessionlog_store.server.config import StoreConfig

from .test_backend_contract import EventLogContract


class TestSqliteBaselineLog(EventLogContract):
    @asynccontextmanager
    async def open_log(self, path: str, fs: FileOps | None = None) -> AsyncIterator[EventLog]:
        async with open_sqlite_log(path + ".db") as log:
            yield log

    async def test_a_failed_sync_is_fatal_and_told_once(self, tmp_path):
        """Here the commit fails: the database made read-only under the log."""
        async with self.open_log(str(tmp_path / "log")) as log:
            await self.writes_after_breaking_fail(log, lambda: log._db.execute("PRAGMA query_only=1"))


async def test_a_store_on_the_baseline_streams_a_reply_into_the_table(tmp_path):
    config = StoreConfig()
    async with open_sqlite_store(str(tmp_path / "s"), config) as store:
        meta, _ = await store.create_session(first_message="go")
        async with store.inflight(meta.id) as msg:
            for part in ("one ", "two ", "three"):
                msg.write(part)
                store.saver.flush(msg)  # (its progress record appended now, not at the next tick)
                with trio.fail_after(10):
                    await store.es.flush()  # durable: committed to the table
        state = await store.keeper.read_state(meta.id)
        assert [m.content for m in state.messages.values()][-1] == "one two three"
    db = sqlite3.connect(str(tmp_path / "s" / "records.db"))
    kinds = [line for (line,) in db.execute("SELECT line FROM records WHERE session = ?", (meta.id,))]
    assert any(b'"type":"p"' in k or b'"type":"q"' in k for k in kinds), "progress records in the table"
