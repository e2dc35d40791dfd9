"""The event store's write side: one committer task per store (group commit).

Theory of operation
-------------------
Appenders never touch a file. `append*()` runs entirely on the trio thread:
it checks the session, gives each event the session's next seq, encodes the
record, puts the line into the *filling* batch and calls the store's listener
(the live projections), all without an await, so seq order, byte order in the
file and the order the projections see are one and the same.

The committer swaps the filling batch for an empty one and hands the full one
to a worker thread, which makes it durable. While that thread syncs, the next
batch fills:

    trio thread:  append append append | append append ...  | append
    committer:    [swap] -> thread: write+sync batch 1 -> set 1 [swap] -> batch 2 ...
    waiters of 1:                                       wake up

How a batch is made durable (`sync_mode`): "journal" (the default) writes
the batch as one frame to the write-ahead journal and fdatasyncs that one
file (segments.py); the log writer (logwriter.py) then writes each session's
lines to its log without a sync, and a periodic round (rounds.py) makes the
logs durable and removes the journal segments it covered (journal.py has the
frame format, the invariants and recovery). The direct modes write and sync
the logs themselves in every batch (logfiles.py): "fdatasync" each dirty
file, "syncfs" one syncfs(2) per filesystem holding a dirty log, "auto"
fdatasync for a batch of one file and syncfs for more. bench/ measures them
all; bench/README.md says why "journal" (one file and one sync per batch,
whatever the number of sessions in it).

In the journal mode the batch's waiters wake when the journal's fdatasync
returns. `flush()` waits until everything appended is durable *and* in its
log; `flush(session_id)`, one session's records: every reader of a log
(load, resume, a log stream, `remove()`) calls it first for that log. `durable_seq` is what is acknowledged;
`written_seq`/`durable_end` what a reader of the file finds (checkpoints
record those). In the direct modes both move together.

A failed write or sync is fatal: every waiter of that batch gets StoreBroken,
no further append is accepted, and nothing is retried (after a failed fsync
the kernel may have dropped the dirty pages; a retry can "succeed" with the
data gone). Restarting recovers from what is on disk.

Locks: the log descriptors (logfiles.py) are used by one thread at a time
under `fd_lock` (the committer in the direct modes, the log writer, the
round's fdatasyncs, `remove()`); the journal's open segment under `io_lock`
(the committer's frames, the round closing it).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Literal

import trio

from ..backend import Appended, CommitStatistics, EventLog, Failed
from ..errors import (CorruptRecord, SessionExists, SessionReadOnly, StoreBroken, StoreClosed,
                     UnknownSession)
from ..events import Event, SessionDeleted
from ..record import Record, encode_line, encode_record, progress_time, scan
from .batch import Batch, LogState, Timing
from .fsio import OS_FILES, SYNCFS_REPORTS_ERRORS, FileOps
from .journal import Entry, JournalRecovery, birth, born_of, encode_frame, log_born
from .log import create_log, log_path, read_log, remove_session_folder, session_dir
from .logfiles import MAX_OPEN_LOGS, LogFiles, descriptor_budget
from .logwriter import LogWriter
from .rounds import JournalRounds
from .segments import JournalSegments

SyncMode = Literal["journal", "auto", "syncfs", "fdatasync"]

# How often the journal's logs are synced and its segments removed (seconds):
# the bound on what a start after a crash re-applies.
JOURNAL_SYNC_INTERVAL: Final = 1.0
# How long a session's acknowledged lines may wait in the journal for its
# next ones before the log writer writes them (logwriter.py: one log write a
# second for a running reply, not four; a reader never waits for it).
LOG_WRITE_INTERVAL: Final = 1.0

# The listener sees every record as it is appended (not yet durable):
# (session_id, record, byte offset just past the record).
Listener = Callable[[str, Record, int], None]


class EventStore:
    """Per-session append-only logs under `root`, with group commit.

    Use `open_event_store(root)`; sessions found on disk are registered by the
    recovery code (projections/recovery.py) with `register()`.
    """

    def __init__(self, root: str, *, fs: FileOps = OS_FILES, sync_mode: SyncMode = "journal",
                 max_open: int = MAX_OPEN_LOGS, journal_sync_interval: float = JOURNAL_SYNC_INTERVAL,
                 log_write_interval: float = LOG_WRITE_INTERVAL) -> None:
        if sync_mode == "syncfs" and not SYNCFS_REPORTS_ERRORS:
            raise ValueError("sync_mode='syncfs' needs Linux 5.8 or newer (a syncfs(2) that reports "
                             "writeback errors)")
        self.root = root
        self.fs = fs
        self.sync_mode: SyncMode = sync_mode if SYNCFS_REPORTS_ERRORS or sync_mode == "journal" else "fdatasync"
        self.journal = self.sync_mode == "journal"
        self.journal_sync_interval = journal_sync_interval
        self.journal_recovery = JournalRecovery()  # what opening the store re-applied
        self.timing = Timing()  # where the committer's time goes (bench/, metrics)
        self.listeners: list[Listener] = []
        self.quarantined: set[str] = set()  # sessions whose log is damaged (read-only)
        # Called after each durable batch with (records, perf_counter() of its
        # first record, perf_counter() when durable): bench/ measures latency with it.
        self.batch_listeners: list[Callable[[int, float, float], None]] = []
        # Called after the listeners have seen all the records of one append
        # (one call of append/append_many/append_nowait) with the session id.
        self.append_listeners: list[Callable[[str], None]] = []
        # The contract's (backend.py): a session's records to fold again after
        # another writer's conflicting append. Never called here: one writer.
        self.reset_listeners: list[Callable[[str, list[Record], int], None]] = []
        # Called once, on the trio thread, when a write or sync fails (the store breaks).
        self.failure_listeners: list[Callable[[BaseException], None]] = []
        self._sessions: dict[str, LogState] = {}
        self._creating: set[str] = set()
        self._batch = Batch()
        self._committing: Batch | None = None
        self._wake = trio.Event()
        self._stopped = trio.Event()
        self._closing = False
        self._closed = False
        self._broken: BaseException | None = None
        self._stats = [0, 0, 0, 0]  # batches, records, largest, files synced
        self._bytes_durable = 0
        self._batch_no = 0            # the last batch number given
        self._committed_no = 0        # the last durable batch
        # Its collaborators: the logs' descriptors (fd_lock), the journal's
        # segments (io_lock), the log writer, the journal's rounds.
        self._io_lock = trio.Lock()
        self._fd_lock = trio.Lock()
        self.files = LogFiles(fs, root, descriptor_budget(max_open))
        self.segments = JournalSegments(fs, root)
        self.rounds = JournalRounds(self.files, self.segments, self._io_lock, self._fd_lock, journal_sync_interval,
                                    self.timing, written_no=lambda: self.writer.written_no,
                                    committed_no=lambda: self._committed_no, broken=lambda: self._broken,
                                    fail=self._fail)
        self.writer = LogWriter(self.files, self._fd_lock, self._sessions, self.timing,
                                on_written=self.rounds.written, fail=self._fail,
                                interval=log_write_interval if self.journal else 0.0)

    # -- sessions ---------------------------------------------------------

    def register(self, session_id: str, last_seq: int, end: int,
                 corrupt: CorruptRecord | None = None) -> None:
        """Make a session found on disk appendable (or read-only if corrupt)."""
        self._sessions[session_id] = LogState(last_seq, end, corrupt)
        if corrupt is not None:
            self.quarantined.add(session_id)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    def last_seq(self, session_id: str) -> int:
        return self._session(session_id).last_seq

    def durable_seq(self, session_id: str) -> int:
        return self._session(session_id).durable_seq

    def written_seq(self, session_id: str) -> int:
        """The last record that is durable *and* in the log file."""
        return self._session(session_id).written_seq

    def unwritten(self, session_id: str) -> bytes:
        """A session's acknowledged lines that are not in its log file (they
        follow `durable_end`): empty unless the log writer failed, and then
        what readers add to what the file holds."""
        return self.writer.unwritten(session_id)

    def durable_end(self, session_id: str) -> int:
        """Where `written_seq` ends in the log: a reader of the file finds
        every record up to here, and a crash loses none of them."""
        return self._session(session_id).written_end

    def corruption(self, session_id: str) -> CorruptRecord | None:
        return self._session(session_id).corrupt

    def quarantine(self, session_id: str, corrupt: CorruptRecord) -> None:
        """Damage found in a live session's log (by the background check):
        refuse its appends from now on, as if it had been found at startup."""
        self._session(session_id).corrupt = corrupt
        self.quarantined.add(session_id)

    def _session(self, session_id: str) -> LogState:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    def _fail(self, error: BaseException) -> None:
        """The store is broken from now on; tell the failure listeners once."""
        self.writer.tell_waiters()  # flush() waiters see the failure (and wait again on a new event)
        if self._broken is None:
            self._broken = error
            for listener in self.failure_listeners:
                listener(error)

    def _check_open(self) -> None:
        if self._broken is not None:
            raise StoreBroken("the store failed to write or sync and accepts nothing more; "
                              "restart it to recover") from self._broken
        if self._closed or self._closing:
            raise StoreClosed("the event store is closed")

    # -- create / delete (durable, outside the batch cycle) ----------------

    async def create(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        """Create a session's log holding `events`, durably: when this returns the
        log, its folder and the folders above it are fsynced."""
        self._check_open()
        path = log_path(self.root, session_id)  # validates the id
        if session_id in self._sessions or session_id in self._creating:
            raise SessionExists(f"session {session_id!r} already exists")
        ts = time.time()
        lines = [encode_record(i, ts, ev) for i, ev in enumerate(events, 1)]
        out: list[Appended] = []
        end = 0
        for i, (ev, line) in enumerate(zip(events, lines), 1):
            end += len(line)
            out.append(Appended(Record(i, ts, ev), end))
        data = b"".join(lines)
        self._creating.add(session_id)
        try:
            if self.journal and self.rounds.holds(session_id):
                # The journal still holds records of an earlier session of this
                # id (deleted): a birth marker tells recovery they are not ours.
                batch = self._batch
                batch.births.append(session_id)
                self._wake.set()
                await self._wait(batch)
            await trio.to_thread.run_sync(create_log, self.fs, path, data)
        except FileExistsError:
            raise SessionExists(f"session {session_id!r} already exists") from None
        except OSError as e:
            self._fail(e)  # like a failed batch: fatal, never retried
            raise StoreBroken(f"creating session {session_id!r} failed: {e}") from e
        finally:
            self._creating.discard(session_id)
        self._check_open()
        self._sessions[session_id] = LogState(len(out), end, None, born_of(lines[0]) if lines else None)
        for a in out:
            for listener in self.listeners:
                listener(session_id, a.record, a.end)
        return out

    async def remove(self, session_id: str) -> None:
        """Remove a session's folder (after its tombstone is durable) and forget it."""
        self._check_open()
        sess = self._session(session_id)
        if sess.written_seq < sess.last_seq:
            await self.flush(session_id)  # durable, and no line of it waits to be written
        if self.journal and not sess.deleted and self.rounds.holds(session_id):
            # Removed without a tombstone (a damaged log) while the journal
            # holds records of it: a marker tells recovery those records have
            # no log to go to (without it a missing log is a disk not mounted).
            batch = self._batch
            batch.births.append(session_id)
            self._wake.set()
            await self._wait(batch)
        async with self._fd_lock:  # not while a worker thread uses the descriptors
            self._sessions.pop(session_id, None)
            self.quarantined.discard(session_id)
            fd = self.files.forget(session_id)
        folder = session_dir(self.root, session_id)
        try:
            await trio.to_thread.run_sync(remove_session_folder, self.fs, folder, fd)
        except OSError as e:  # the tombstone is durable: the next start finishes the removal
            self._fail(e)
            raise StoreBroken(f"removing session {session_id!r} failed: {e}") from e

    async def log_bytes(self, session_id: str) -> bytes:
        """The session's log as the file holds it, and after a failed log
        write what only the journal holds in its place (call `flush` first
        for everything appended so far)."""
        data = await trio.to_thread.run_sync(read_log, self.fs, self.root, session_id)
        extra = self.unwritten(session_id)
        return data[:self.durable_end(session_id)] + extra if extra else data

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        """The session's acknowledged records with seq > `after_seq`, in order
        (what a reader of the log finds once everything appended is in it)."""
        sess = self._session(session_id)
        await self.flush(session_id)
        if sess.corrupt is not None:
            raise SessionReadOnly(f"session {session_id} is quarantined (damaged log); repair it first")
        data = await trio.to_thread.run_sync(read_log, self.fs, self.root, session_id)
        data += self.unwritten(session_id)
        # (decoded in the thread too: a long log must not hold the event loop)
        return await trio.to_thread.run_sync(
            lambda: [r for r in scan(session_id, data).records if r.seq > after_seq])

    # -- appends ----------------------------------------------------------

    def _enqueue(self, session_id: str, events: Sequence[Event]) -> tuple[Batch, list[Appended]]:
        self._check_open()
        sess = self._session(session_id)
        if sess.deleted:
            raise UnknownSession(session_id)
        if sess.corrupt is not None:
            raise SessionReadOnly(f"{sess.corrupt}; the session is read-only until "
                                  f"`sessionlog repair` is run on it")
        ts = time.time()
        # Encode everything first: a RecordTooLarge leaves the session unchanged.
        new = [encode_record(sess.last_seq + i, ts, ev) for i, ev in enumerate(events, 1)]
        start = sess.end
        out = []
        for ev, line in zip(events, new):
            sess.last_seq += 1
            sess.end += len(line)
            out.append(Appended(Record(sess.last_seq, ts, ev), sess.end))
        batch = self._add_lines(session_id, sess, new, start, type(events[-1]) is SessionDeleted)
        for a in out:
            for listener in self.listeners:
                listener(session_id, a.record, a.end)
        for done in self.append_listeners:
            done(session_id)
        self._wake.set()
        return batch, out

    def _add_lines(self, session_id: str, sess: LogState, new: list[bytes], start: int,
                   tombstone: bool) -> Batch:
        """Put a session's new lines (its records up to `sess.last_seq`, from
        byte `start`) into the filling batch."""
        batch = self._batch
        lines = batch.lines.get(session_id)
        if lines is None:
            batch.lines[session_id] = new
            batch.offsets[session_id] = start
            if self.journal:
                self.rounds.journaling(session_id, self._batch_no + 1)  # the filling batch's number
        else:
            lines.extend(new)
        batch.last_seq[session_id] = sess.last_seq
        if tombstone:
            sess.deleted = True
        if not batch.records:
            batch.opened = time.perf_counter()
        batch.records += len(new)
        return batch

    async def append(self, session_id: str, event: Event) -> Appended:
        """Append one record and return once it is durable."""
        return (await self.append_many(session_id, [event]))[0]

    async def append_many(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        """Append records to one session in one batch; return once they are durable."""
        batch, out = self._enqueue(session_id, events)
        await self._wait(batch)
        return out

    def append_nowait(self, session_id: str, event: Event) -> Appended:
        """Append one record to the next batch and return at once (the progress
        class: the caller never waits on a disk). The saver's hot path: the
        same steps as `_enqueue` for one record, without its lists."""
        if self._broken is not None or self._closed or self._closing:
            self._check_open()
        sess = self._sessions.get(session_id)
        if sess is None or sess.deleted:
            raise UnknownSession(session_id)
        if sess.corrupt is not None:
            return self._enqueue(session_id, [event])[1][0]  # raises SessionReadOnly
        ts = time.time()
        line = encode_record(sess.last_seq + 1, ts, event)
        start = sess.end
        sess.last_seq += 1
        sess.end = end = start + len(line)
        self._add_lines(session_id, sess, [line], start, type(event) is SessionDeleted)
        rec = Record(sess.last_seq, ts, event)
        for listener in self.listeners:
            listener(session_id, rec, end)
        for done in self.append_listeners:
            done(session_id)
        self._wake.set()
        return Appended(rec, end)

    def append_progress(self, items: Sequence[tuple[str, Sequence[Event]]]) -> list[Failed]:
        """`append_nowait` for many messages at once (the saver's tick): each
        item a session id and its records in order, all at one clock reading.
        An item whose record is refused stops there (its later records are
        not appended) and is returned as (its index, records of it appended,
        the error); the others go on. StoreBroken/StoreClosed raise."""
        if self._broken is not None or self._closed or self._closing:
            self._check_open()
        ts = progress_time()
        ts_repr = b"%r" % ts
        failed: list[Failed] = []
        sessions, listeners, told = self._sessions, self.listeners, self.append_listeners
        for i, (session_id, events) in enumerate(items):
            sess = sessions.get(session_id)
            if sess is None or sess.deleted or sess.corrupt is not None:
                failed.append((i, 0, UnknownSession(session_id) if sess is None or sess.deleted else SessionReadOnly(
                    f"{sess.corrupt}; the session is read-only until `sessionlog repair` is run on it")))
                continue
            k = 0
            try:
                new: list[bytes] = []
                for ev in events:
                    new.append(encode_line(sess.last_seq + len(new) + 1, ts_repr, ev))
                    k += 1
            except Exception as e:  # (a lone surrogate, a record too large): the ones before it go on
                failed.append((i, k, e))
                new = new[:k]
            if not new:
                continue
            start = end = sess.end
            seq = sess.last_seq
            sess.last_seq += len(new)
            sess.end += sum(map(len, new))
            self._add_lines(session_id, sess, new, start, False)
            try:
                for ev, line in zip(events, new):
                    seq += 1
                    end += len(line)
                    rec = Record(seq, ts, ev)
                    for listener in listeners:
                        listener(session_id, rec, end)
                for done in told:
                    done(session_id)
            except Exception as e:  # (a listener's bug: its message ends, as with append_nowait; the others go on)
                failed.append((i, len(new), e))
        self._wake.set()
        return failed

    async def _wait(self, batch: Batch) -> None:
        batch.waiters += 1
        try:
            await batch.done.wait()
        finally:
            batch.waiters -= 1
        if batch.error is not None:
            raise StoreBroken(f"the batch holding this record failed: {batch.error}") from batch.error

    async def wait_durable(self, session_id: str, seq: int) -> int:
        """Wait until the session's record `seq` is durable; returns `seq`
        (the contract's answer: a shared stream's rebase may renumber it)."""
        sess = self._session(session_id)
        while sess.durable_seq < seq:
            if self._broken is not None:
                self._check_open()
            if self._sessions.get(session_id) is not sess:
                raise UnknownSession(session_id)
            committing = self._committing
            # The record is in the batch being synced, or else in the one filling.
            if committing is not None and committing.last_seq.get(session_id, 0) >= seq:
                await self._wait(committing)
            else:
                await self._wait(self._batch)
        return seq

    async def durable(self) -> None:
        """Wait until everything appended so far is durable (acknowledged: in
        the journal), not necessarily in its log file (`flush`): what a
        projection written beside the logs needs (the search index), without
        ending the log writer's linger."""
        b = self._batch
        if b.lines or b.births:
            await self._wait(b)  # (batches are made durable in order: the one committing first)
        elif self._committing is not None:
            await self._wait(self._committing)
        elif self._broken is not None:
            self._check_open()

    async def flush(self, session_id: str | None = None, *, hurry: bool = True) -> None:
        """Wait until everything appended so far is durable and in its log
        file (what a reader of the logs needs); with `session_id`, only that
        session's records (what a reader of its log needs: the writer writes
        it now, always, and the other sessions' lines linger on). `hurry`
        False (store-wide only): without ending the log writer's linger (a
        checkpoint, which can wait).

        Batches are numbered as they are committed and written in order: the
        filling batch, if it holds anything, becomes the next number; else
        the last number given is the newest that holds a record appended
        before this call.
        """
        if session_id is not None:
            sess = self._sessions.get(session_id)
            if sess is not None:  # (unknown here: nothing of it waits to be written)
                await self._flush_session(sess, session_id)
            return
        b = self._batch
        target = self._batch_no + (1 if b.lines or b.births else 0)
        while True:
            if self._broken is not None:
                # Broken: what was acknowledged still goes into the logs (the
                # log writer goes on unless its own write failed), so that
                # reads, which go on, see it; then say so.
                target = min(target, self._committed_no)
                if self.writer.written_no >= target or self.writer.done:
                    self._check_open()
            elif self.writer.written_no >= target:
                return
            if hurry:
                self.writer.want(target)
            await self.writer.written.wait()

    async def _flush_session(self, sess: LogState, session_id: str) -> None:
        """`flush` for one session: its records appended so far in its log."""
        target = sess.last_seq
        while True:
            if self._broken is not None:
                # As in flush(): what was acknowledged still goes in, then say so.
                if sess.written_seq >= min(target, sess.durable_seq) or self.writer.done:
                    self._check_open()
            elif sess.written_seq >= target:
                return
            if self.journal:  # (the direct modes write a batch's logs before acknowledging it)
                self.writer.want_session(session_id, target)
            await self.writer.written.wait()

    # -- the committer ----------------------------------------------------

    async def run(self) -> None:
        """The committer and (journal mode) the log writer, shielded; the store
        is stopped once both have finished what was appended."""
        try:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    if self.journal:
                        nursery.start_soon(self.writer.run)
                    await self._run()
        finally:
            self._stopped.set()

    async def _run(self) -> None:
        try:
            while True:
                batch = self._batch
                if not batch.lines and not batch.births:
                    if self._closing:
                        return
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                self._batch = Batch()
                self._committing = batch
                self._batch_no += 1
                batch.no = self._batch_no
                try:
                    if self.journal:
                        async with self._io_lock:
                            await trio.to_thread.run_sync(self._commit_journal_sync, batch)
                    else:
                        per_file = self.sync_mode == "fdatasync" or (self.sync_mode == "auto" and len(batch.lines) == 1)
                        async with self._fd_lock:
                            await trio.to_thread.run_sync(self.files.write_durably, batch.lines, per_file)
                except OSError as e:
                    self._fail(e)
                    batch.error = e
                    # Later appends are refused by _check_open; a batch that was
                    # filling meanwhile can never be written: fail its waiters too.
                    self._batch.error = e
                    self._batch.done.set()
                    batch.done.set()
                    return
                self._committed_no = batch.no
                n = batch.records
                st = self._stats
                st[0] += 1
                st[1] += n
                st[2] = max(st[2], n)
                st[3] += len(batch.lines)
                self._bytes_durable += sum(sum(map(len, lines)) for lines in batch.lines.values())
                for sid, seq in batch.last_seq.items():
                    sess = self._sessions.get(sid)
                    if sess is not None and seq > sess.durable_seq:
                        sess.durable_seq = seq
                if self.journal:
                    self.writer.queue(batch)  # the log writer's turn
                else:
                    self.writer.mark_written([batch])
                self._committing = None
                if self.batch_listeners:
                    now = time.perf_counter()
                    for bl in self.batch_listeners:
                        bl(n, batch.opened, now)
                batch.done.set()
        finally:
            self.writer.committer_ended()

    def _commit_journal_sync(self, batch: Batch) -> None:
        """In a worker thread: the batch's frame to the journal, one fdatasync.
        The log writer writes the lines to the logs after it."""
        fs = self.fs
        entries: list[Entry] = [birth(sid) for sid in batch.births]
        last, offsets = batch.last_seq, batch.offsets
        sessions = self._sessions
        for sid, lines in batch.lines.items():
            sess = sessions.get(sid)
            born = sess.born if sess is not None else None
            if born is None:  # a session found on disk: read once
                born = log_born(fs, log_path(self.root, sid)) or 0
                if sess is not None:
                    sess.born = born
            entries.append((sid, last[sid] - len(lines) + 1, offsets[sid],
                            lines[0] if len(lines) == 1 else b"".join(lines), born))
        frame = encode_frame(batch.no, entries)
        t0 = time.perf_counter()
        self.segments.append(batch.no, frame)
        self.timing.add("journal", time.perf_counter() - t0)

    # -- lifecycle (opening.py opens and closes the store) -----------------

    def release(self) -> None:
        """In a worker thread, at the end: the journal's segment and every log
        descriptor closed."""
        self.segments.close(self._committed_no)
        self.files.close_all()

    async def stop(self) -> None:
        """Accept nothing more, let the committer and the log writer finish
        what was appended, then the journal's last round (a clean stop leaves
        the logs synced and no journal). Call it shielded."""
        self._closing = True
        self._wake.set()
        await self._stopped.wait()
        self._closed = True
        self.rounds.scope.cancel()
        if self.journal:
            await self.rounds.round()

    @property
    def bytes_appended(self) -> int:
        """Bytes of records made durable (metrics)."""
        return self._bytes_durable

    async def sync_round(self) -> None:
        """A journal round now (bench/ starts each measured round synced)."""
        await self.rounds.round()

    def statistics(self) -> CommitStatistics:
        b, r, largest, files = self._stats
        return CommitStatistics(b, r, largest, files, self._batch.waiters, self.sync_mode,
                                self.rounds.rounds, self.rounds.removed)

    @property
    def broken(self) -> BaseException | None:
        return self._broken


if TYPE_CHECKING:
    def _the_reference_is_an_event_log(store: EventStore) -> EventLog:
        return store  # mypy checks that EventStore keeps the contract (eventstore/backend.py)
