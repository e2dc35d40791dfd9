"""The event store's write side: one committer task per store (group commit).

Theory of operation
-------------------
Appenders never touch a file. `append*()` runs entirely on the trio thread:
it checks the session, gives each event the session's next seq, encodes the
record, puts the line into the *filling* batch and calls the store's listener
(the live projections), all without an await, so seq order, byte order in the
file and the order the projections see are one and the same.

The committer swaps the filling batch for an empty one and hands the full one
to a worker thread, which writes each dirty session's lines with one
`os.write` on its `O_APPEND` descriptor and then makes the batch durable.
While that thread syncs, the next batch fills:

    trio thread:  append append append | append append ...  | append
    committer:    [swap] -> thread: write+sync batch 1 -> set 1 [swap] -> batch 2 ...
    waiters of 1:                                       wake up

How a batch is made durable (`sync_mode`): "journal" (the default) writes
the batch as one frame to the write-ahead journal and fdatasyncs that one
file, then writes each session's lines to its log without a sync; a periodic
round makes the logs durable with one syncfs per device and removes the
journal segments it covered (journal.py has the frame format, the invariants
and recovery). The direct modes sync the logs themselves in every batch:
"fdatasync" syncs each dirty file
(~0.1 ms each here), "syncfs" makes one Linux syncfs(2) call per filesystem
holding a dirty log (the `st_dev` of each log, found when its descriptor is
opened: a session folder may be a symlink or a mount on another device than
the root; one device flush for any number of files, which also flushes other
dirty files of that filesystem), "auto" uses fdatasync for a batch of one
file and syncfs for more. bench/ measures them all; see bench/README.md for
why "journal" (one file and one sync per batch, whatever the number of
sessions in it).

In the journal mode the batch's waiters wake when the journal's fdatasync
returns; a second task (the log writer) then writes the lines to the logs,
oldest batch first, one write per session for as many batches as queued up,
so a slow log write (a filesystem busy with the round's syncfs) never delays
an acknowledgement. `flush()` waits until everything appended is durable
*and* in its log: every reader of a log (load, resume, the background check,
`remove()`) calls it first. `durable_seq` is what is acknowledged;
`written_seq`/`durable_end` what a reader of the file finds (checkpoints
record those). In the direct modes both move together.

A failed write or sync is fatal: every waiter of that batch gets StoreBroken,
no further append is accepted, and nothing is retried (after a failed fsync
the kernel may have dropped the dirty pages; a retry can "succeed" with the
data gone). Restarting recovers from what is on disk.

Descriptors are kept in an LRU of at most `max_open` entries (in the
"fdatasync" mode a descriptor is synced before it is closed). The committer's
worker thread, the journal round and `remove()` take turns on descriptors and
segments through one trio lock (`_io_lock`).
"""
from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Final, Literal

import trio

from ..backend import Appended, CommitStatistics, EventLog
from ..errors import (CorruptRecord, SessionExists, SessionReadOnly, StoreBroken, StoreClosed,
                     UnknownSession)
from ..events import Event, SessionDeleted
from .fsio import OS_FILES, SYNCFS_REPORTS_ERRORS, FileOps, lock_root
from .storeformat import stamp_format
from .journal import (SEGMENT_BYTES, Entry, JournalRecovery, apply_journal, birth, encode_frame, journal_dir,
                      born_of, log_born, segment_name)
from .log import SESSIONS_DIR, log_path, read_log, session_dir
from ..record import scan
from ..record import Record, encode_record

SyncMode = Literal["journal", "auto", "syncfs", "fdatasync"]

# How often the journal's logs are synced and its segments removed (seconds):
# the bound on what a start after a crash re-applies.
JOURNAL_SYNC_INTERVAL: Final = 1.0

# Open log descriptors kept for appends: enough for every streaming session of
# a busy server (bench/: 10,000 streams), bounded so that more sessions never
# exhaust the process's descriptors; at open, the soft RLIMIT_NOFILE is raised
# toward the hard one and a quarter of what is allowed (at least 256) is left
# for everything else (sockets, snapshots). Sessions written in turn (every
# stream each tick) beyond the cap miss the LRU on every write (an open and a
# close per batch): bench/ measured 10,000 streams under a cap of 9,872
# spending 40 % of the committer's thread on that. Raise `ulimit -n` for more.
MAX_OPEN_LOGS: Final = 16384


def _descriptor_budget(wanted: int) -> int:
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, 2 * wanted + 256)) if hard != resource.RLIM_INFINITY else 2 * wanted + 256
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(16, min(wanted, soft - max(256, soft // 4)))

# The listener sees every record as it is appended (not yet durable):
# (session_id, record, byte offset just past the record).
Listener = Callable[[str, Record, int], None]


class Timing:
    """Count, total and largest duration of each step of the write path."""

    def __init__(self) -> None:
        self.steps: dict[str, list[float]] = {}

    def add(self, step: str, seconds: float) -> None:
        s = self.steps.get(step)
        if s is None:
            self.steps[step] = [1, seconds, seconds]
        else:
            s[0] += 1
            s[1] += seconds
            if seconds > s[2]:
                s[2] = seconds

    def summary(self) -> str:
        return ", ".join(f"{k}: {int(n)} x {1e3 * t / n:.2f} ms avg, {1e3 * m:.1f} ms max"
                         for k, (n, t, m) in self.steps.items())


class _Batch:
    __slots__ = ("done", "error", "lines", "last_seq", "offsets", "births", "records", "waiters", "opened", "no")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: BaseException | None = None
        self.lines: dict[str, list[bytes]] = {}
        self.last_seq: dict[str, int] = {}
        self.offsets: dict[str, int] = {}   # where the session's first line of the batch starts
        self.births: list[str] = []         # journal birth markers (see journal.py)
        self.no = 0                         # batch number, given when it is committed
        self.records = 0
        self.waiters = 0
        self.opened = 0.0  # perf_counter() when its first record came


class _Session:
    __slots__ = ("last_seq", "end", "durable_seq", "written_seq", "written_end", "corrupt", "deleted", "born")

    def __init__(self, last_seq: int, end: int, corrupt: CorruptRecord | None, born: int | None = None) -> None:
        self.deleted = False  # its tombstone is appended: nothing may follow it
        self.born = born      # journal.born_of(the log's first line); None: not read yet
        self.last_seq = last_seq
        self.end = end
        self.durable_seq = last_seq   # acknowledged (in the journal, or synced in the log)
        self.written_seq = last_seq   # durable and in the log file (page cache at least)
        self.written_end = end
        self.corrupt = corrupt


class EventStore:
    """Per-session append-only logs under `root`, with group commit.

    Use `open_event_store(root)`; sessions found on disk are registered by the
    recovery code (projections/recovery.py) with `register()`.
    """

    def __init__(self, root: str, *, fs: FileOps = OS_FILES, sync_mode: SyncMode = "journal",
                 max_open: int = MAX_OPEN_LOGS, journal_sync_interval: float = JOURNAL_SYNC_INTERVAL) -> None:
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
        self.bytes_appended = 0  # bytes of records in the logs (metrics)
        self.max_open = _descriptor_budget(max_open)
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
        self._sessions: dict[str, _Session] = {}
        self._creating: set[str] = set()
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._devs: dict[str, int] = {}       # session -> st_dev of its log
        self._dev_fds: dict[int, int] = {}    # st_dev -> a folder descriptor on it (for syncfs)
        self._batch = _Batch()
        self._committing: _Batch | None = None
        self._wake = trio.Event()
        self._stopped = trio.Event()
        self._closing = False
        self._closed = False
        self._broken: BaseException | None = None
        self._stats = [0, 0, 0, 0, 0, 0]  # batches, records, largest, files synced, log syncs, segments removed
        # the journal (sync_mode "journal")
        self._io_lock = trio.Lock()   # the journal's segment (committer, round)
        self._fd_lock = trio.Lock()   # the log descriptors (log writer, remove)
        self._unwritten: list[_Batch] = []   # durable batches whose lines wait for the log writer
        self._write_wake = trio.Event()
        self._written = trio.Event()  # set (and replaced) each time _written_no moves
        self._written_no = 0          # the last batch whose lines are in the logs
        self._commit_done = False
        self._writer_done = False     # the log writer ended (all written, or its write failed)
        self._sync_lock = trio.Lock()
        self._sync_wake = trio.Event()
        self._sync_scope = trio.CancelScope()
        self._batch_no = 0            # the last batch number given
        self._committed_no = 0        # the last durable batch
        self._trimmed_upto = 0        # the journal holds no batch up to this one
        self._seg_fd: int | None = None
        self._seg_path = ""
        self._seg_size = 0
        self._segments: list[tuple[str, int]] = []  # closed segments not yet removed, with their last batch
        self._journaled: dict[str, int] = {}      # session -> the last batch holding its records
        self._dirty_devs: set[int] = set()        # devices with log writes since the last round
        self._unsynced_fds: set[int] = set()      # log descriptors written since the round (no syncfs that reports errors)

    # -- sessions ---------------------------------------------------------

    def register(self, session_id: str, last_seq: int, end: int,
                 corrupt: CorruptRecord | None = None) -> None:
        """Make a session found on disk appendable (or read-only if corrupt)."""
        self._sessions[session_id] = _Session(last_seq, end, corrupt)
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
        if not self._writer_done or not self._unwritten:
            return b""
        return b"".join(line for b in self._unwritten for line in b.lines.get(session_id, ()))

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

    def _session(self, session_id: str) -> _Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    def _fail(self, error: BaseException) -> None:
        """The store is broken from now on; tell the failure listeners once."""
        self._written.set()  # flush() waiters see the failure (and wait again on a new event)
        self._written = trio.Event()
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
            if self.journal and self._journaled.get(session_id, 0) > self._trimmed_upto:
                # The journal still holds records of an earlier session of this
                # id (deleted): a birth marker tells recovery they are not ours.
                batch = self._batch
                batch.births.append(session_id)
                self._wake.set()
                await self._wait(batch)
            await trio.to_thread.run_sync(self._create_sync, session_id, path, data)
        except FileExistsError:
            raise SessionExists(f"session {session_id!r} already exists") from None
        except OSError as e:
            self._fail(e)  # like a failed batch: fatal, never retried
            raise StoreBroken(f"creating session {session_id!r} failed: {e}") from e
        finally:
            self._creating.discard(session_id)
        self._check_open()
        self._sessions[session_id] = _Session(len(out), end, None, born_of(lines[0]) if lines else None)
        for a in out:
            for listener in self.listeners:
                listener(session_id, a.record, a.end)
        return out

    def _create_sync(self, session_id: str, path: str, data: bytes) -> None:
        fs = self.fs
        folder = os.path.dirname(path)
        fs.mkdir(folder)
        fd = fs.create_exclusive(path)
        try:
            if data:
                fs.write(fd, data)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.fsync_dir(folder)
        fs.fsync_dir(os.path.dirname(folder))

    async def remove(self, session_id: str) -> None:
        """Remove a session's folder (after its tombstone is durable) and forget it."""
        self._check_open()
        sess = self._session(session_id)
        if sess.written_seq < sess.last_seq:
            await self.flush()  # durable, and no line of it waits to be written
        if self.journal and not sess.deleted and self._journaled.get(session_id, 0) > self._trimmed_upto:
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
            self._devs.pop(session_id, None)
            fd = self._fds.pop(session_id, None)
            if fd is not None:
                self._unsynced_fds.discard(fd)  # (closed below: never synced by a round)
        folder = session_dir(self.root, session_id)
        try:
            await trio.to_thread.run_sync(self._remove_sync, folder, fd)
        except OSError as e:  # the tombstone is durable: the next start finishes the removal
            self._fail(e)
            raise StoreBroken(f"removing session {session_id!r} failed: {e}") from e

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        """The session's acknowledged records with seq > `after_seq`, in order
        (what a reader of the log finds once everything appended is in it)."""
        sess = self._session(session_id)
        await self.flush()
        if sess.corrupt is not None:
            raise SessionReadOnly(f"session {session_id} is quarantined (damaged log); repair it first")
        data = await trio.to_thread.run_sync(read_log, self.fs, self.root, session_id)
        data += self.unwritten(session_id)
        return [r for r in scan(session_id, data).records if r.seq > after_seq]

    def _remove_sync(self, folder: str, fd: int | None) -> None:
        if fd is not None:
            self.fs.close(fd)
        if self.fs.exists(folder):
            self.fs.rmtree(folder)
        self.fs.fsync_dir(os.path.dirname(folder))

    # -- appends ----------------------------------------------------------

    def _enqueue(self, session_id: str, events: Sequence[Event]) -> tuple[_Batch, list[Appended]]:
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

    def _add_lines(self, session_id: str, sess: _Session, new: list[bytes], start: int,
                   tombstone: bool) -> _Batch:
        """Put a session's new lines (its records up to `sess.last_seq`, from
        byte `start`) into the filling batch."""
        batch = self._batch
        lines = batch.lines.get(session_id)
        if lines is None:
            batch.lines[session_id] = new
            batch.offsets[session_id] = start
            if self.journal:
                self._journaled[session_id] = self._batch_no + 1  # the filling batch's number
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

    async def _wait(self, batch: _Batch) -> None:
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

    async def flush(self) -> None:
        """Wait until everything appended so far is durable and in its log
        file (what a reader of the logs needs).

        Batches are numbered as they are committed and written in order: the
        filling batch, if it holds anything, becomes the next number; else
        the last number given is the newest that holds a record appended
        before this call.
        """
        b = self._batch
        target = self._batch_no + (1 if b.lines or b.births else 0)
        while True:
            if self._broken is not None:
                # Broken: what was acknowledged still goes into the logs (the
                # log writer goes on unless its own write failed), so that
                # reads, which go on, see it; then say so.
                target = min(target, self._committed_no)
                if self._written_no >= target or self._writer_done:
                    self._check_open()
            elif self._written_no >= target:
                return
            await self._written.wait()

    # -- the committer ----------------------------------------------------

    async def _run_shielded(self) -> None:
        """The committer and (journal mode) the log writer, shielded; the store
        is stopped once both have finished what was appended."""
        try:
            with trio.CancelScope(shield=True):
                async with trio.open_nursery() as nursery:
                    if self.journal:
                        nursery.start_soon(self._write_loop)
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
                self._batch = _Batch()
                self._committing = batch
                self._batch_no += 1
                batch.no = self._batch_no
                try:
                    if self.journal:
                        async with self._io_lock:
                            await trio.to_thread.run_sync(self._commit_journal_sync, batch)
                    else:
                        async with self._fd_lock:
                            await trio.to_thread.run_sync(self._commit_sync, batch)
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
                for sid, seq in batch.last_seq.items():
                    sess = self._sessions.get(sid)
                    if sess is not None and seq > sess.durable_seq:
                        sess.durable_seq = seq
                if self.journal:
                    self._unwritten.append(batch)  # the log writer's turn
                    self._write_wake.set()
                else:
                    self._mark_written([batch])
                self._committing = None
                if self.batch_listeners:
                    now = time.perf_counter()
                    for bl in self.batch_listeners:
                        bl(n, batch.opened, now)
                batch.done.set()
        finally:
            self._commit_done = True
            self._write_wake.set()

    def _mark_written(self, batches: list[_Batch]) -> None:
        sessions = self._sessions
        total = 0
        for batch in batches:
            for sid, lines in batch.lines.items():
                n = sum(map(len, lines))
                total += n
                sess = sessions.get(sid)
                if sess is not None:
                    sess.written_seq = batch.last_seq[sid]
                    sess.written_end += n
        self.bytes_appended += total
        self._written_no = batches[-1].no
        self._written.set()
        self._written = trio.Event()

    async def _write_loop(self) -> None:
        """Journal mode: write durable batches' lines to their logs, oldest
        first, several batches at once when they queue up (one write per
        session for all of them). A failed write is fatal, as a failed sync:
        the journal keeps the records for the next start."""
        try:
            while True:
                if not self._unwritten:
                    if self._commit_done:
                        return
                    await self._write_wake.wait()
                    self._write_wake = trio.Event()
                    continue
                batches, self._unwritten = self._unwritten, []
                try:
                    async with self._fd_lock:
                        devs = await trio.to_thread.run_sync(self._write_logs_sync, batches)
                except OSError as e:
                    # Nothing more is written; the journal holds these, and
                    # readers see them through unwritten() until a restart.
                    self._unwritten[:0] = batches
                    self._fail(e)
                    return
                self._after_write(batches, devs)
        finally:
            self._writer_done = True
            self._written.set()
            self._written = trio.Event()

    def _after_write(self, batches: list[_Batch], devs: set[int]) -> None:
        self._dirty_devs |= devs
        self._mark_written(batches)
        self._sync_wake.set()

    def _write_logs_sync(self, batches: list[_Batch]) -> set[int]:
        """In a worker thread: each session's lines of these batches, in order,
        with one write; returns the devices written."""
        t0 = time.perf_counter()
        if len(batches) == 1:
            merged = batches[0].lines
        else:
            merged = {}
            for b in batches:
                for sid, lines in b.lines.items():
                    have = merged.get(sid)
                    if have is None:
                        merged[sid] = list(lines)
                    else:
                        have.extend(lines)
        fs = self.fs
        devs = self._devs
        devices: set[int] = set()
        # Where syncfs reports no writeback error, the round fdatasyncs each
        # written log through the descriptor that wrote it (a descriptor opened
        # later hears nothing of an error before it): one leaving the LRU is
        # synced first.
        unsynced = None if SYNCFS_REPORTS_ERRORS else self._unsynced_fds
        for sid, lines in merged.items():
            fd = self._log_fd(sid, unsynced)
            fs.write(fd, lines[0] if len(lines) == 1 else b"".join(lines))
            if unsynced is not None:
                unsynced.add(fd)
            devices.add(devs[sid])
        self.timing.add("logs", time.perf_counter() - t0)
        return devices

    def _log_fd(self, sid: str, dirty: set[int] | None = None) -> int:
        """The append descriptor of a session's log (in a worker thread holding _fd_lock);
        an evicted descriptor in `dirty` is synced before it is closed."""
        fds = self._fds
        fd = fds.get(sid)
        if fd is not None:
            fds.move_to_end(sid)
            return fd
        fs = self.fs
        fd = fs.open_append(log_path(self.root, sid))
        if len(fds) >= self.max_open:  # evict first: never more than max_open, even for a moment
            _, old_fd = fds.popitem(last=False)
            if dirty is not None and old_fd in dirty:
                fs.fdatasync(old_fd)
                dirty.discard(old_fd)
            fs.close(old_fd)
        fds[sid] = fd
        if sid not in self._devs:
            self._devs[sid] = self._device_of(sid, fd)
        return fd

    def _commit_journal_sync(self, batch: _Batch) -> None:
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
        if self._seg_fd is None:
            self._open_segment(batch.no)
        assert self._seg_fd is not None
        fs.write(self._seg_fd, frame)
        fs.fdatasync(self._seg_fd)
        self._seg_size += len(frame)
        self.timing.add("journal", time.perf_counter() - t0)
        if self._seg_size >= SEGMENT_BYTES:
            self._close_segment(batch.no)

    def _open_segment(self, first_batch: int) -> None:
        folder = journal_dir(self.root)
        path = os.path.join(folder, segment_name(first_batch))
        fd = self.fs.create_exclusive(path)
        try:
            self.fs.fsync_dir(folder)  # the segment's name is durable before anything in it is acknowledged
        except BaseException:
            self.fs.close(fd)
            raise
        self._seg_fd, self._seg_path, self._seg_size = fd, path, 0

    def _close_segment(self, last_batch: int) -> None:
        if self._seg_fd is not None:
            fd, self._seg_fd = self._seg_fd, None
            self._segments.append((self._seg_path, last_batch))
            self.fs.close(fd)

    def _commit_sync(self, batch: _Batch) -> None:
        """In a worker thread (direct modes): one write per dirty file, then one durability step."""
        fs = self.fs
        per_file = self.sync_mode == "fdatasync" or (self.sync_mode == "auto" and len(batch.lines) == 1)
        dirty: set[int] = set()
        devices: set[int] = set()
        for sid, lines in batch.lines.items():
            fd = self._log_fd(sid, dirty if per_file else None)
            fs.write(fd, lines[0] if len(lines) == 1 else b"".join(lines))
            dirty.add(fd)
            devices.add(self._devs[sid])
        if per_file:
            for fd in dirty:
                fs.fdatasync(fd)
        else:
            # One syncfs per filesystem that holds a dirty log: a session folder
            # may sit on another device than the data root (a symlink, a mount).
            for dev in devices:
                fs.syncfs(self._dev_fds[dev])

    def _device_of(self, sid: str, fd: int) -> int:
        """The device of a log (in a worker thread holding _fd_lock), with a folder
        descriptor on that device kept for syncfs."""
        dev = self.fs.device(fd)
        if dev not in self._dev_fds:
            self._dev_fds[dev] = self.fs.open_dir(session_dir(self.root, sid))
        return dev

    # -- the journal's round: sync the logs, remove covered segments -------

    async def _sync_loop(self) -> None:
        with self._sync_scope:
            while True:
                await self._sync_wake.wait()
                self._sync_wake = trio.Event()
                await trio.sleep(self.journal_sync_interval)
                await self._sync_round()

    async def _sync_round(self) -> None:
        """Make every log write of batches up to the last committed one durable
        with one syncfs per device, then remove the journal segments holding
        only those batches (see journal.py). Shielded: a round is never left
        half done by a cancel (it is bounded by one sync)."""
        with trio.CancelScope(shield=True):
            async with self._sync_lock:
                if self._broken is not None:
                    return
                # What is in the logs now is what this round's sync covers.
                upto = self._written_no
                if upto <= self._trimmed_upto:
                    return
                devs, self._dirty_devs = self._dirty_devs, set()
                async with self._io_lock:  # between two journal writes
                    if self._seg_fd is not None:
                        await trio.to_thread.run_sync(self._close_segment, self._committed_no)
                # segments whose every batch is in the logs (oldest first)
                n = 0
                while n < len(self._segments) and self._segments[n][1] <= upto:
                    n += 1
                segments = self._segments[:n]
                try:
                    t0 = time.perf_counter()
                    if SYNCFS_REPORTS_ERRORS:
                        await trio.to_thread.run_sync(self._sync_logs_sync, devs)
                    else:  # each written log, through its descriptor (none closes meanwhile)
                        async with self._fd_lock:
                            fds, self._unsynced_fds = self._unsynced_fds, set()
                            await trio.to_thread.run_sync(self._fdatasync_all, fds)
                    self.timing.add("log sync", time.perf_counter() - t0)
                    await trio.to_thread.run_sync(self._trim_sync, segments)
                except OSError as e:
                    self._fail(e)  # fatal, as any failed sync: the journal keeps the records
                    return
                del self._segments[:len(segments)]
                self._stats[4] += 1
                if segments:
                    self._trimmed_upto = segments[-1][1]
                    self._stats[5] += len(segments)
                    self._journaled = {s: k for s, k in self._journaled.items() if k > self._trimmed_upto}

    def _sync_logs_sync(self, devs: set[int]) -> None:
        """One syncfs per device, on descriptors opened before the logs' first
        write there: every writeback error since is reported (Linux >= 5.8)."""
        for dev in devs:
            self.fs.syncfs(self._dev_fds[dev])

    def _fdatasync_all(self, fds: set[int]) -> None:
        for fd in fds:
            self.fs.fdatasync(fd)

    def _trim_sync(self, segments: list[tuple[str, int]]) -> None:
        for path, _ in segments:
            self.fs.unlink(path)
        if segments:
            self.fs.fsync_dir(journal_dir(self.root))

    # -- lifecycle --------------------------------------------------------

    def _prepare_sync(self) -> None:
        """Before anything reads a log: the folders, and the journal a crash
        left re-applied to the logs (whatever this store's sync_mode). First
        the root's format: a newer build's root is refused before any read."""
        fs = self.fs
        stamp_format(fs, self.root)
        fs.makedirs(os.path.join(self.root, SESSIONS_DIR))
        fs.fsync_dir(os.path.join(self.root, SESSIONS_DIR))
        self.journal_recovery = apply_journal(fs, self.root)
        if self.journal:
            fs.makedirs(journal_dir(self.root))
            fs.fsync_dir(journal_dir(self.root))
        fs.fsync_dir(self.root)

    def _close_sync(self) -> None:
        self._close_segment(self._committed_no)
        for fd in [*self._fds.values(), *self._dev_fds.values()]:
            try:
                self.fs.close(fd)
            except OSError:
                pass
        self._fds.clear()
        self._dev_fds.clear()

    def statistics(self) -> CommitStatistics:
        b, r, largest, files, rounds, removed = self._stats
        return CommitStatistics(b, r, largest, files, self._batch.waiters, self.sync_mode, rounds, removed)

    @property
    def broken(self) -> BaseException | None:
        return self._broken


@asynccontextmanager
async def open_event_store(root: str, *, fs: FileOps = OS_FILES, sync_mode: SyncMode = "journal",
                           max_open: int = MAX_OPEN_LOGS,
                           journal_sync_interval: float = JOURNAL_SYNC_INTERVAL) -> AsyncIterator[EventStore]:
    """Open the store's write side; the committer runs until the block exits,
    and everything appended inside the block is committed before it does.

    The committer is shielded from cancellation: a cancel of the caller's scope
    (a stop signal, a timeout around the block) must not stop the one task that
    makes the shielded finalizes of the shutdown durable. It ends when the
    block is left, after the last batch. Closing descriptors and the root lock
    is shielded too, so a cancelled exit never leaks them.
    """
    store = EventStore(root, fs=fs, sync_mode=sync_mode, max_open=max_open,
                       journal_sync_interval=journal_sync_interval)
    lock_fd = lock_root(root)
    try:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store._prepare_sync)
        await trio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store._close_sync)
        os.close(lock_fd)
        raise
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store._run_shielded)
            if store.journal:
                nursery.start_soon(store._sync_loop)
            try:
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    store._closing = True
                    store._wake.set()
                    await store._stopped.wait()
                    store._closed = True
                    store._sync_scope.cancel()
                    if store.journal:
                        await store._sync_round()  # a clean stop leaves the logs synced, no journal
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store._close_sync)
        os.close(lock_fd)


if TYPE_CHECKING:
    def _the_reference_is_an_event_log(store: EventStore) -> EventLog:
        return store  # mypy checks that EventStore keeps the contract (eventstore/backend.py)
