"""Issue 29 item 3: the fair SQLite baseline. The design a team would write
instead of our logs: the same session store (in-flight API, throttled saver,
fan-out, projections: sessionlog_store's own SessionStore) on an event log
whose records are committed to SQLite: WAL, `synchronous=FULL`, one table for
the store, one transaction per batch, group commit (the batch that fills
while one commits is the next). Records are the same lines our logs hold
(encoded by the same functions), so what differs is only where they go.

It is a bench baseline, not a backend the server offers: one writer, no
quarantine, no journal, no checkpoints (a start would read the table);
`tests/test_sqlite_baseline.py` runs it through the backend contract so the
figures compare equal work.
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import trio

from sessionlog_store.eventstore.backend import Appended, CommitStatistics, EventLog, Failed, RecordListener
from sessionlog_store.eventstore.errors import CorruptRecord, SessionExists, StoreBroken, StoreClosed, UnknownSession
from sessionlog_store.eventstore.events import Event
from sessionlog_store.eventstore.ids import validate_session_id
from sessionlog_store.eventstore.jetstream.session import StreamSession
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.projects import LocalProjectLog
from sessionlog_store.eventstore.record import Record, encode_line, progress_time, scan
from sessionlog_store.projections.recovery import fold_until
from sessionlog_store.projections.session import SessionState
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore, running
from sessionlog_store.server.domain.titles import KeywordTitler


class _Batch:
    __slots__ = ("rows", "last_seq", "records", "opened", "done", "error")

    def __init__(self) -> None:
        self.rows: list[tuple[str, int, bytes]] = []
        self.last_seq: dict[str, int] = {}
        self.records = 0
        self.opened = 0.0
        self.done = trio.Event()
        self.error: BaseException | None = None


class SqliteLog:
    """An EventLog on one SQLite database (`open_sqlite_log`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.listeners: list[RecordListener] = []
        self.append_listeners: list = []
        self.batch_listeners: list = []
        self.reset_listeners: list = []  # (one writer: never told)
        self.failure_listeners: list = []
        self.quarantined: set[str] = set()
        self.journal = None
        self._sessions: dict[str, StreamSession] = {}
        self._batch = _Batch()
        self._committing: _Batch | None = None
        self._wake = trio.Event()
        self._broken: BaseException | None = None
        self._closing = False
        self._stats = [0, 0, 0, 0]
        self._bytes = 0
        self._lock = trio.Lock()  # the writing connection: one thread at a time
        self._db = self._connect()
        self._db.execute("CREATE TABLE IF NOT EXISTS records (session TEXT NOT NULL, seq INTEGER NOT NULL, "
                         "line BLOB NOT NULL, PRIMARY KEY (session, seq)) WITHOUT ROWID")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    # -- what the store asks -------------------------------------------------
    def __contains__(self, session_id: str) -> bool:
        s = self._sessions.get(session_id)
        return s is not None and not s.tombstoned

    def session_ids(self) -> list[str]:
        return [sid for sid, s in self._sessions.items() if not s.tombstoned]

    def _session(self, session_id: str) -> StreamSession:
        s = self._sessions.get(session_id)
        if s is None:
            raise UnknownSession(session_id)
        return s

    def last_seq(self, session_id: str) -> int:
        return self._session(session_id).last_seq

    def durable_seq(self, session_id: str) -> int:
        return self._session(session_id).durable_seq

    def written_seq(self, session_id: str) -> int:
        return self._session(session_id).durable_seq

    def durable_end(self, session_id: str) -> int:
        return self._session(session_id).end

    def unwritten(self, session_id: str) -> bytes:
        return b""

    def quarantine(self, session_id: str, corrupt: CorruptRecord) -> None:
        raise StoreBroken(f"{corrupt}: the SQLite baseline repairs nothing")

    def corruption(self, session_id: str) -> CorruptRecord | None:
        self._session(session_id)
        return None

    @property
    def broken(self) -> BaseException | None:
        return self._broken

    @property
    def bytes_appended(self) -> int:
        return self._bytes

    def statistics(self) -> CommitStatistics:
        b, r, largest, sessions = self._stats
        return CommitStatistics(b, r, largest, sessions, 0, "sqlite")

    def _check_open(self) -> None:
        if self._broken is not None:
            raise StoreBroken("the SQLite baseline failed a commit") from self._broken
        if self._closing:
            raise StoreClosed("the event log is closed")

    # -- appends -------------------------------------------------------------
    def _add(self, session_id: str, sess: StreamSession, events: Sequence[Event], ts: float) -> list[Appended]:
        sess.check_writable(session_id, events)  # (the JetStream log's rules: nothing after a finalize or tombstone)
        ts_repr = b"%r" % ts
        lines = [encode_line(sess.last_seq + i, ts_repr, ev) for i, ev in enumerate(events, 1)]
        batch = self._batch
        if not batch.rows:
            batch.opened = time.perf_counter()
        out = []
        for ev, line in zip(events, lines):
            sess.last_seq += 1
            sess.end += len(line)
            batch.rows.append((session_id, sess.last_seq, line))
            sess.took(ev)
            rec = Record(sess.last_seq, ts, ev)
            for listener in self.listeners:
                listener(session_id, rec, sess.end)
            out.append(Appended(rec, sess.end))
        batch.last_seq[session_id] = sess.last_seq
        batch.records += len(lines)
        for al in self.append_listeners:
            al(session_id)
        self._wake.set()
        return out

    async def create(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        self._check_open()
        validate_session_id(session_id)
        if session_id in self._sessions:
            raise SessionExists(f"session {session_id!r} already exists")
        self._sessions[session_id] = sess = StreamSession()
        out = self._add(session_id, sess, events, time.time())
        await self.wait_durable(session_id, sess.last_seq)
        return out

    async def append_many(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        self._check_open()
        sess = self._session(session_id)
        out = self._add(session_id, sess, events, time.time())
        await self.wait_durable(session_id, sess.last_seq)
        return out

    def append_nowait(self, session_id: str, event: Event) -> Appended:
        self._check_open()
        return self._add(session_id, self._session(session_id), [event], time.time())[0]

    def append_progress(self, items: Sequence[tuple[str, Sequence[Event]]]) -> list[Failed]:
        """As the local engine's: one clock reading for the tick; an item
        refused stops there, the others go on."""
        self._check_open()
        ts = progress_time()
        failed: list[Failed] = []
        for i, (session_id, events) in enumerate(items):
            sess = self._sessions.get(session_id)
            if sess is None:
                failed.append((i, 0, UnknownSession(session_id)))
                continue
            try:
                self._add(session_id, sess, events, ts)
            except Exception as e:  # noqa: BLE001 - that item's business
                failed.append((i, 0, e))
        return failed

    async def wait_durable(self, session_id: str, seq: int) -> int:
        sess = self._session(session_id)
        while sess.durable_seq < seq:
            self._check_open()
            committing = self._committing
            batch = committing if committing is not None and committing.last_seq.get(session_id, 0) >= seq \
                else self._batch
            await batch.done.wait()
            if batch.error is not None:
                raise StoreBroken(f"the batch holding this record failed: {batch.error}") from batch.error
        return seq

    async def flush(self, session_id: str | None = None) -> None:
        """Everything appended so far durable (or only `session_id`'s: the contract's flush)."""
        for sid, sess in list(self._sessions.items()):
            if (session_id is None or sid == session_id) and sess.durable_seq < sess.last_seq:
                await self.wait_durable(sid, sess.last_seq)

    # -- the committer -------------------------------------------------------
    def _commit_sync(self, rows: list[tuple[str, int, bytes]]) -> None:
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany("INSERT INTO records (session, seq, line) VALUES (?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            batch = self._batch
            if not batch.rows:
                if self._closing:
                    return
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            self._batch, self._committing = _Batch(), batch
            try:
                async with self._lock:
                    await trio.to_thread.run_sync(self._commit_sync, batch.rows)
            except sqlite3.Error as e:
                self._broken = batch.error = self._batch.error = e
                for fl in self.failure_listeners:
                    fl(e)
                batch.done.set()
                self._batch.done.set()
                return
            for sid, seq in batch.last_seq.items():
                sess = self._sessions.get(sid)
                if sess is not None and seq > sess.durable_seq:
                    sess.durable_seq = seq
            st = self._stats
            st[0], st[1], st[2], st[3] = st[0] + 1, st[1] + batch.records, max(st[2], batch.records), \
                st[3] + len(batch.last_seq)
            self._bytes += sum(len(r[2]) for r in batch.rows)
            self._committing = None
            now = time.perf_counter()
            for bl in self.batch_listeners:
                bl(batch.records, batch.opened, now)
            batch.done.set()

    # -- reads and removal ---------------------------------------------------
    def _select(self, session_id: str) -> bytes:
        db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            return b"".join(r[0] for r in db.execute(
                "SELECT line FROM records WHERE session = ? ORDER BY seq", (session_id,)))
        finally:
            db.close()

    async def log_bytes(self, session_id: str) -> bytes:
        self._session(session_id)
        await self.flush()
        return await trio.to_thread.run_sync(self._select, session_id)

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        data = await self.log_bytes(session_id)
        return [r for r in scan(session_id, data).records if r.seq > after_seq]

    async def remove(self, session_id: str) -> None:
        self._check_open()
        sess = self._session(session_id)
        await self.wait_durable(session_id, sess.last_seq)

        def delete() -> None:
            with self._db:
                self._db.execute("DELETE FROM records WHERE session = ?", (session_id,))
        async with self._lock:
            await trio.to_thread.run_sync(delete)
        del self._sessions[session_id]

    async def close(self) -> None:
        if self._broken is None:
            await self.flush()
        self._closing = True
        self._wake.set()


def _the_baseline_is_an_event_log(log: SqliteLog) -> EventLog:
    return log  # (mypy checks the protocol here)


@asynccontextmanager
async def open_sqlite_log(path: str) -> AsyncIterator[SqliteLog]:
    """A new SQLite baseline log at `path` (an empty database), its committer running."""
    es = SqliteLog(path)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(es.run)
            try:
                yield es
            finally:
                with trio.CancelScope(shield=True):
                    await es.close()
    finally:
        es._db.close()


class SqliteKeeper:
    """The baseline's keeper: a session read from the table, nothing kept beside it."""

    def __init__(self, es: SqliteLog) -> None:
        self.es = es
        self._checked = trio.Event()
        self._checked.set()

    @property
    def checked(self) -> trio.Event:
        return self._checked

    async def read_state(self, sid: str) -> SessionState:
        data = await self.es.log_bytes(sid)
        records = scan(sid, data).records
        return fold_until(records, data, records[-1].seq if records else 0)

    async def log_bytes(self, sid: str) -> bytes:
        return await self.es.log_bytes(sid)

    def registry_changed(self) -> None:
        pass

    def session_changed(self, sid: str) -> None:
        pass

    async def before_write(self, sid: str) -> None:
        pass

    async def remove(self, sid: str) -> None:
        await self.es.remove(sid)

    async def write_checkpoint(self) -> int:
        return 0

    async def write_snapshot(self, sid: str) -> bool:
        return False

    async def check_logs(self) -> int:
        return 0

    def start_background(self, nursery: trio.Nursery) -> None:
        pass

    async def at_stop(self) -> None:
        pass


@asynccontextmanager
async def open_sqlite_store(root: str, config: StoreConfig) -> AsyncIterator[SessionStore]:
    """The session store on the SQLite baseline (a new store at `root`)."""
    root = os.path.abspath(root)
    os.makedirs(root, exist_ok=True)
    async with open_sqlite_log(os.path.join(root, "records.db")) as es:
        store = SessionStore(root, es, config, KeywordTitler(), lambda s: SqliteKeeper(es))
        await store.projects.load(LocalProjectLog(OS_FILES, root))
        async with running(store) as ready:
            yield ready
