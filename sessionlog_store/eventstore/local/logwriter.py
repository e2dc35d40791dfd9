"""The log writer: in the journal mode, durable batches' lines go into their
logs after the journal's fdatasync acknowledged them; in every mode, what a
reader of the logs may count on (`written_no`, each session's written seq
and end).

Theory of operation
-------------------
The committer acknowledges a batch when its journal frame is synced and
queues it here (`queue`): each session's lines join that session's pending
lines. One task (`run`) writes pending lines to the logs, one write per
session for all its pending lines, in a worker thread holding the
descriptor lock. A slow log write (a filesystem busy with a round's syncfs)
so never delays an acknowledgement. `written_no` is the last batch whose
lines are all in the logs: the batch before the oldest pending line's (the
pending sessions are in the order their lines came, so the first one's is
the oldest); each write wakes `flush()` waiters, and the round is told which
devices were written.

The writer lingers: a session's lines wait until its oldest has waited
`interval` (1 s by default), so that a running reply, one progress record
every 250 ms, costs one log write a second instead of four (issue 29: each
write(2) and its GIL hand-off with the trio thread were a third of the CPU a
record at 5,000 streams). The sessions come due in the order their lines
came, so the writes stay spread over the second as the saver's slots spread
the records (writing everything queued once a second instead held every
thread's turn at the GIL for a burst of 10,000 writes: p99 3x at 10,000
streams). Nothing is less safe for it: the records are in the journal, a
round trims the journal only up to `written_no`, and a start writes back
what a log lacks. A reader never waits for the linger: a reader of one
log says which session it needs (`want_session`), and the writer writes that
session's pending lines at once, the others lingering on; a store-wide
`flush()` says which batch it needs (`want`), and the writer then writes
everything pending; the stop ends the linger too.

A failed write is fatal, as a failed sync: the store breaks, and the lines
not written stay pending. They are in the journal (the next start writes
them back), and until then `unwritten(sid)` hands readers what only the
journal holds, so reads after a failure still see every acknowledged
record. In the direct modes the committer writes the logs itself and calls
`mark_written` at once.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

import trio

from .batch import Batch, LogState, Timing
from .logfiles import LogFiles


class Pending:
    """One session's lines not in its log yet: since when, from which batch
    on, and the seq of the last one (not the batch: it would be kept alive)."""
    __slots__ = ("since", "first_no", "lines", "last_seq")

    def __init__(self, since: float, batch: Batch) -> None:
        self.since = since                # trio time its oldest line was queued
        self.first_no = batch.no          # the batch of its oldest line
        self.lines: list[bytes] = []
        self.last_seq = 0                 # the seq of its newest line


class LogWriter:
    """The log writer's task and the written position (see the module's header)."""

    def __init__(self, files: LogFiles, fd_lock: trio.Lock, sessions: dict[str, LogState], timing: Timing,
                 on_written: Callable[[set[int]], None], fail: Callable[[BaseException], None],
                 interval: float = 0.0) -> None:
        self.files, self.fd_lock, self.sessions, self.timing = files, fd_lock, sessions, timing
        self.on_written, self.fail = on_written, fail
        self.interval = interval       # how long a session's lines may wait for its next ones (the linger)
        self.queued_no = 0             # the last batch queued
        # Sessions with lines to write, in the order their lines came (taken
        # from the front: an OrderedDict, not a dict with ever more holes there).
        self.pending: OrderedDict[str, Pending] = OrderedDict()
        self.writing: dict[str, Pending] | None = None  # the sessions being written
        self.wanted_no = 0             # a flush waits for the logs up to this batch: no linger up to it
        self.wanted: dict[str, int] = {}  # session -> the seq a reader of its log waits for (no linger for it)
        self.wake = trio.Event()
        self._hurry = trio.Event()     # set when the linger should end (wanted_no moved, the committer ended)
        self.written = trio.Event()    # set (and replaced) each time written_no moves
        self.written_no = 0            # the last batch whose lines are in the logs
        self.commit_done = False       # the committer ended: write what is pending, then end
        self.done = False              # ended (all written, or its write failed)

    def queue(self, batch: Batch) -> None:
        """A durable batch: its lines join their sessions' pending lines."""
        now, pending = trio.current_time(), self.pending
        for sid, lines in batch.lines.items():
            p = pending.get(sid)
            if p is None:
                p = pending[sid] = Pending(now, batch)
            p.lines += lines
            p.last_seq = batch.last_seq[sid]
        self.queued_no = batch.no
        if not pending and self.writing is None:  # (a batch of birth markers only, nothing else to write)
            self._count_off()
        self.wake.set()
        if batch.no <= self.wanted_no or self.wanted:
            self._hurry.set()

    def want(self, no: int) -> None:
        """A reader waits for batch `no` to be in the logs: no linger up to it."""
        if no > self.wanted_no:
            self.wanted_no = no
            self._hurry.set()

    def want_session(self, session_id: str, seq: int) -> None:
        """A reader of one log waits for its records up to `seq`: no linger
        for that session (the others linger on) until they are written."""
        if seq > self.wanted.get(session_id, 0):
            self.wanted[session_id] = seq
            self._hurry.set()

    def committer_ended(self) -> None:
        self.commit_done = True
        self.wake.set()
        self._hurry.set()

    def tell_waiters(self) -> None:
        """Wake whoever waits on `written` (the store broke: they look again)."""
        self.written.set()
        self.written = trio.Event()

    def unwritten(self, session_id: str) -> bytes:
        """A session's acknowledged lines that are not in its log file: empty
        unless the writer failed."""
        p = self.pending.get(session_id) if self.done else None
        return b"".join(p.lines) if p is not None else b""

    def mark_written(self, batches: list[Batch]) -> None:
        """The direct modes: the committer wrote these batches' lines itself."""
        sessions = self.sessions
        for batch in batches:
            for sid, lines in batch.lines.items():
                sess = sessions.get(sid)
                if sess is not None:
                    sess.written_seq = batch.last_seq[sid]
                    sess.written_end += sum(map(len, lines))
        self.written_no = batches[-1].no
        self.tell_waiters()

    def _due(self) -> dict[str, Pending]:
        """The sessions to write now (taken out of `pending`): all of them
        when a reader wants a batch not written yet, when the committer ended
        or without a linger; else those whose oldest line has waited
        `interval`."""
        pending = self.pending
        if self.commit_done or self.interval <= 0 or self.written_no < self.wanted_no:
            self.pending = OrderedDict()
            return pending
        now, interval = trio.current_time(), self.interval
        take = {sid: pending.pop(sid) for sid in self.wanted if sid in pending}  # (from anywhere in it)
        while pending:
            sid, p = next(iter(pending.items()))
            if p.since + interval > now:
                break
            del pending[sid]
            take[sid] = p
        return take

    async def _linger(self) -> None:
        """Wait until the oldest pending lines are due, or a hurry."""
        oldest = next(iter(self.pending.values()))
        self._hurry = trio.Event()
        with trio.move_on_at(oldest.since + self.interval):
            await self._hurry.wait()

    def _written(self, take: dict[str, Pending]) -> None:
        sessions, wanted = self.sessions, self.wanted
        for sid, p in take.items():
            sess = sessions.get(sid)
            if sess is not None:
                sess.written_seq = p.last_seq
                sess.written_end += sum(map(len, p.lines))
            if wanted and sid in wanted and (sess is None or sess.written_seq >= wanted[sid]):
                del wanted[sid]
        self._count_off()

    def _count_off(self) -> None:
        """`written_no`: the batch before the oldest line not written (or
        the last batch queued: every line written)."""
        if self.pending:
            upto = next(iter(self.pending.values())).first_no - 1
        else:
            upto = self.queued_no
        if upto > self.written_no:
            self.written_no = upto
        self.tell_waiters()

    def _put_back(self, take: dict[str, Pending]) -> None:
        """A failed write: its lines are pending again, before any of the same
        session that came since (`unwritten` hands them to readers in
        order), and the sessions again in the order their oldest lines came
        (a wanted one was taken from anywhere; defensive: the writer ends
        after a failure, so `written_no` is not worked out from them again)."""
        merged = dict(take)
        for sid, p in self.pending.items():
            q = merged.get(sid)
            if q is None:
                merged[sid] = p
            else:
                q.lines += p.lines
                q.last_seq = p.last_seq
        self.pending = OrderedDict(sorted(merged.items(), key=lambda item: item[1].first_no))

    async def run(self) -> None:
        try:
            while True:
                if not self.pending:
                    if self.commit_done:
                        return
                    await self.wake.wait()
                    self.wake = trio.Event()
                    continue
                take = self._due()
                if not take:
                    await self._linger()
                    continue
                self.writing = take
                try:
                    async with self.fd_lock:
                        devs = await trio.to_thread.run_sync(self._write_sync, take)
                except BaseException as e:
                    # Nothing more is written; the journal holds these, and
                    # readers see them through unwritten() until a restart.
                    self.writing = None
                    self._put_back(take)
                    if not isinstance(e, OSError):
                        raise
                    self.fail(e)
                    return
                self.writing = None
                self._written(take)
                self.on_written(devs)
        finally:
            self.done = True
            self.tell_waiters()

    def _write_sync(self, take: dict[str, Pending]) -> set[int]:
        """In a worker thread: each session's pending lines, in order, with one
        write; returns the devices written."""
        t0 = time.perf_counter()
        devices = self.files.write({sid: p.lines for sid, p in take.items()})
        self.timing.add("logs", time.perf_counter() - t0)
        return devices
