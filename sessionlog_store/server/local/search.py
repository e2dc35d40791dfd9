"""Full-text search over every finished message of a store, in SQLite FTS5
(the standard library's sqlite3): `<root>/search.sqlite`, a projection of
the logs kept live by the same appends (projections/search.py says what is
indexed and when), answered per user.

Writes are batched: the fold's operations queue up as records are appended,
and one task writes them, a transaction per batch, in a worker thread. Each
session's row in `indexed` holds the last seq written for it; a start
indexes again every session whose log is past that (a crash, a stop that
cut the writer short, a first start on an older store) while it already
answers. The file is a cache of the logs: unreadable, it is deleted and
written again; `sessionlog rebuild` writes it from nothing. Measured in
bench/ (`python -m bench search`)."""
from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from sessionlog_store.eventstore.errors import EventStoreError
from sessionlog_store.eventstore.events import MessageProgress
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.session import SessionMeta, SessionState
from sessionlog_store.projections.search import (
    MARK_CLOSE,
    MARK_OPEN,
    Drop,
    Op,
    Put,
    Redo,
    SearchFold,
    fts_query,
    puts_of,
    split_marks,
)

log = logging.getLogger("sessionlog.search")

FILE = "search.sqlite"
SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (id INTEGER PRIMARY KEY, session_id TEXT NOT NULL, msg_id TEXT NOT NULL,
  role TEXT NOT NULL, kind TEXT NOT NULL, at REAL NOT NULL, UNIQUE (session_id, msg_id));
CREATE INDEX IF NOT EXISTS docs_session ON docs (session_id);
CREATE VIRTUAL TABLE IF NOT EXISTS fts USING fts5 (body, owner, tokenize = 'unicode61 remove_diacritics 2', prefix = '2 3');
CREATE TABLE IF NOT EXISTS indexed (session_id TEXT PRIMARY KEY, seq INTEGER NOT NULL);
"""
MAX_LIMIT = 100
VERSION = 2  # (PRAGMA user_version: an index of another layout is written again)


def owner_token(owner: str) -> str:
    """An owner as one FTS5 token of its own alphabet (no word a person
    types matches it): the owner column makes a user's scope a posting list
    the query intersects, not a filter over every match."""
    return "o" + owner.encode().hex()


def remove_index(path: str) -> None:
    """The index's file and SQLite's beside it (a cache of the logs: gone, it is written again)."""
    for suffix in ("", "-wal", "-shm"):
        try:
            os.unlink(path + suffix)
        except FileNotFoundError:
            pass


class SearchDB:
    """The SQLite side (blocking: called in a worker thread, one call at a time)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.db = self._open()

    def _open(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.DatabaseError as e:  # a cache: start it again
            log.warning("search index %s unreadable (%s): writing it again", self.path, e)
            remove_index(self.path)
            return self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # (a cache of the logs: a power cut may undo its last batch)
        if db.execute("PRAGMA user_version").fetchone()[0] not in (0, VERSION):
            db.close()
            raise sqlite3.DatabaseError("an index of another layout")
        db.executescript(SCHEMA)
        db.execute(f"PRAGMA user_version = {VERSION}")
        db.execute("SELECT count(*) FROM indexed").fetchone()
        return db

    def close(self) -> None:
        self.db.close()

    def indexed(self) -> dict[str, int]:
        return dict(self.db.execute("SELECT session_id, seq FROM indexed").fetchall())

    def write(self, ops: list[tuple[str, Any]], seqs: dict[str, int]) -> None:
        """One transaction: ("put", (put, owner)), ("drop", sid), ("replace", (sid, owner, puts)); then the seqs."""
        db = self.db
        db.execute("BEGIN")
        try:
            for what, arg in ops:
                if what == "put":
                    self._put(*arg)
                elif what == "drop":
                    self._drop(arg)
                else:
                    sid, owner, puts = arg
                    self._drop(sid)
                    for p in puts:
                        self._put(p, owner)
            for sid, seq in seqs.items():
                if seq < 0:
                    db.execute("DELETE FROM indexed WHERE session_id = ?", (sid,))
                else:
                    db.execute("INSERT INTO indexed VALUES (?, ?) ON CONFLICT (session_id) DO UPDATE SET seq = excluded.seq "
                               "WHERE excluded.seq > indexed.seq", (sid, seq))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _put(self, p: Put, owner: str) -> None:
        """A message in; its id is its time in microseconds (the next free
        one): newest first is the index's own order, after a rebuild too."""
        db = self.db
        old = db.execute("SELECT id FROM docs WHERE session_id = ? AND msg_id = ?", (p.session_id, p.msg_id)).fetchone()
        if old is not None:
            db.execute("DELETE FROM fts WHERE rowid = ?", old)
            db.execute("DELETE FROM docs WHERE id = ?", old)
        rowid = int(p.at * 1_000_000)
        while True:
            try:
                db.execute("INSERT INTO docs (id, session_id, msg_id, role, kind, at) VALUES (?, ?, ?, ?, ?, ?)",
                           (rowid, p.session_id, p.msg_id, p.role, p.kind, p.at))
                break
            except sqlite3.IntegrityError:
                rowid += 1
        db.execute("INSERT INTO fts (rowid, body, owner) VALUES (?, ?, ?)", (rowid, p.text, owner_token(owner)))

    def _drop(self, sid: str) -> None:
        self.db.execute("DELETE FROM fts WHERE rowid IN (SELECT id FROM docs WHERE session_id = ?)", (sid,))
        self.db.execute("DELETE FROM docs WHERE session_id = ?", (sid,))

    def query(self, match: str, owner: str | None, limit: int, offset: int) -> list[tuple[Any, ...]]:
        """Newest first (FTS5 walks its posting lists by rowid, descending:
        no sort of every match, unlike ranking by bm25)."""
        if owner is not None:
            match = f'owner : "{owner_token(owner)}" AND {match}'
        return self.db.execute(
            "SELECT d.session_id, d.msg_id, d.role, d.kind, d.at, "
            f"snippet(fts, 0, '{MARK_OPEN}', '{MARK_CLOSE}', '…', 16) "
            "FROM fts JOIN docs d ON d.id = fts.rowid WHERE fts MATCH ? ORDER BY fts.rowid DESC LIMIT ? OFFSET ?",
            (match, limit, offset)).fetchall()

    def count(self) -> int:
        return int(self.db.execute("SELECT count(*) FROM docs").fetchone()[0])


@contextmanager
def rebuild_writer(root: str) -> Iterator[Callable[[str, SessionMeta, SessionState], None]]:
    """For `sessionlog rebuild`: the index written from nothing, a session at a time."""
    path = os.path.join(root, FILE)
    remove_index(path)
    db = SearchDB(path)

    def each(sid: str, meta: SessionMeta, state: SessionState) -> None:
        db.write([("replace", (sid, meta.owner, puts_of(sid, state)))], {sid: state.seq})
    try:
        yield each
    finally:
        db.close()


class SearchIndex:
    """The store's search: fold the records as they are appended, write in
    batches, catch up at the start, answer queries scoped to an owner.

    `owner_of(sid)` and `last_seq(sid)` come from the store (its registry and
    its log); `content_of(sid, msg_id)` is a message's text in the loaded
    session (None: not loaded); `sessions()` lists the sessions there are; `read_state(sid)`
    reads a session as the store does (what is acknowledged, written or
    not); `durable()` waits until what was appended is durable.

    The index never holds more than the logs do: a batch is written once its
    records are durable, so after a crash the index is behind the logs, never
    ahead, and each session's watermark (the seq its documents reflect)
    tells the next start what to index again. A batch that fails to write
    stops the writing (watermarks stay where they were: the next start
    catches up); a session that cannot be read keeps its old watermark."""

    def __init__(self, root: str, *, owner_of: Callable[[str], str | None], at_start: dict[str, int],
                 content_of: Callable[[str, str], str | None], read_state: Callable[[str], Awaitable[SessionState]],
                 durable: Callable[[], Awaitable[None]]) -> None:
        self.root = root
        self.db = SearchDB(os.path.join(root, FILE))
        self.fold = SearchFold(content_of)
        self.owner_of, self.read_state, self.durable = owner_of, read_state, durable
        # Each session and its last seq as the start left them (taken by the
        # opener before the store is used): what catch_up brings up to date;
        # what is appended after, on_record folds (a session made while
        # catch_up waits on the index file is not read again).
        self._at_start = at_start
        self._stuck: set[str] = set()  # sessions not read this run: their watermarks stay
        self._queue: list[tuple[str, Op, int]] = []  # (session, op, seq) as appended
        self._seen: dict[str, int] = {}              # session -> the last seq folded
        self._wake = trio.Event()
        self._lock = threading.Lock()                 # one SQLite call at a time
        self.catching_up = True
        self.written = trio.Condition()               # (tests: a batch is in the index)
        self.batches = 0
        self.reindexed = 0                            # sessions indexed again from their logs (a metric)
        self.broken: str | None = None                # why it stopped writing (it answers from what it has)
        self._flushing = False

    # -- fed by the event log (a listener: sync, in the appending task) --

    def on_record(self, sid: str, rec: Record, end: int) -> None:
        if type(rec.event) is not MessageProgress:  # (a running reply's text: read from the loaded session when it ends)
            for op in self.fold.apply(sid, rec):
                self._queue.append((sid, op, rec.seq))
            self._wake.set()
        self._seen[sid] = rec.seq  # (after its operations: a fold that raised leaves the watermark before it)

    # -- the writer --

    async def run(self) -> None:
        """Catch up, then write what the appends bring, until cancelled."""
        try:
            await self.catch_up()
        except (sqlite3.Error, OSError, EventStoreError) as e:
            self._failed(e)
        finally:
            self.catching_up = False
            async with self.written:
                self.written.notify_all()
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            try:
                await self.flush()
            except (sqlite3.Error, OSError, EventStoreError) as e:
                # a full disk, or the store itself failed (its log: StoreBroken): the store goes on
                # (or refuses writes, as it does); this index stops writing and the next start catches up
                self._failed(e)

    def _failed(self, e: BaseException) -> None:
        if self.broken is None:
            log.error("search index: %s (searches answer from what it holds; the next start catches up)", e)
        self.broken = str(e)

    async def settled(self) -> None:
        """Until what was appended before this call is written (or the index broke)."""
        while (self._queue or self.catching_up or self._flushing) and self.broken is None:
            self._wake.set()
            async with self.written:
                await self.written.wait()

    async def flush(self) -> None:
        """Write what is queued (one transaction). Only `run` calls it: one at a time, in order."""
        self._flushing = True
        try:
            await self._flush()
        finally:
            self._flushing = False
            self.batches += 1
            async with self.written:
                self.written.notify_all()

    async def _flush(self) -> None:
        queue, self._queue = self._queue, []
        seen, self._seen = self._seen, {}
        if self.broken is not None:
            return  # (stopped writing: the next start catches up)
        await self.durable()  # what this batch holds is durable (the journal, then the logs) before it is in the index
        ops: list[tuple[str, Any]] = []
        redo: set[str] = set()
        dropped: set[str] = set()
        for sid, op, _ in queue:
            if isinstance(op, Put):
                owner = self.owner_of(sid)
                if owner is not None:
                    ops.append(("put", (op, owner)))
            elif isinstance(op, Drop):
                ops.append(("drop", sid))
                seen[sid] = -1
                dropped.add(sid)
            elif isinstance(op, Redo):
                redo.add(sid)
        redo -= dropped  # (deleted in this batch: its Drop stands)
        for sid in (redo | self._stuck) - dropped:
            seen.pop(sid, None)  # (its seq is written with its pass over the log, or not at all)
        if ops or seen:
            await self._call(self.db.write, ops, seen)
        for sid in redo:
            await self.reindex(sid)

    async def reindex(self, sid: str) -> None:
        """One session from its log (snapshot and tail), replacing what is indexed of it."""
        self.reindexed += 1
        owner = self.owner_of(sid)
        if owner is None:
            return  # (deleted: its Drop is queued)
        try:
            state = await self.read_state(sid)
        except (OSError, ValueError, EventStoreError) as e:  # (gone meanwhile, or damaged: the store says which)
            log.warning("search: session %s not indexed: %s", sid, e)
            self._stuck.add(sid)
            return
        puts = puts_of(sid, state)
        await self._call(self.db.write, [("replace", (sid, owner, puts))], {sid: state.seq})

    async def catch_up(self) -> None:
        """Every session whose log was past what the index holds of it when
        the store started, again; what it holds of sessions gone, out."""
        at_start, self._at_start = self._at_start, {}
        done = await self._call(self.db.indexed)
        gone = [sid for sid in done if sid not in at_start]
        if gone:
            await self._call(self.db.write, [("drop", sid) for sid in gone], {sid: -1 for sid in gone})
        behind = [sid for sid, last in at_start.items() if done.get(sid, 0) < last]
        for sid in behind:
            await self.reindex(sid)
        if behind or gone:
            log.info("search: %d sessions indexed again, %d dropped", len(behind), len(gone))

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        def locked() -> Any:
            with self._lock:
                return fn(*args)
        return await trio.to_thread.run_sync(locked)

    # -- queries --

    async def search(self, text: str, *, owner: str | None, limit: int = 20, offset: int = 0) -> dict[str, Any]:
        """Hits for `text` among `owner`'s sessions (None: everyone's, an
        admin's read), best first: session, message, role, kind, time, and a
        snippet with the matches' ranges."""
        match = fts_query(text)
        hits: list[dict[str, Any]] = []
        if match is not None:
            rows = await self._call(self.db.query, match, owner, max(1, min(limit, MAX_LIMIT)), max(0, offset))
            for sid, mid, role, kind, at, snip in rows:
                plain, marks = split_marks(snip)
                hits.append({"session_id": sid, "msg_id": mid, "role": role, "kind": kind, "at": at,
                             "snippet": plain, "marks": [list(m) for m in marks]})
        return {"query": text, "hits": hits, "indexing": self.catching_up, "complete": self.broken is None}

    def close(self) -> None:
        with self._lock:
            self.db.close()
