"""The log writer: in the journal mode, durable batches' lines go into their
logs after the journal's fdatasync acknowledged them; in every mode, what a
reader of the logs may count on (`written_no`, each session's written seq
and end).

Theory of operation
-------------------
The committer acknowledges a batch when its journal frame is synced and
queues it here (`queue`). One task (`run`) writes the queued batches' lines
to the logs, oldest batch first, several batches at once (one write per
session for all of them), in a worker thread holding the descriptor lock. A
slow log write (a filesystem busy with a round's syncfs) so never delays an
acknowledgement. Each write moves `written_no` (the last batch whose lines
are in the logs) and wakes `flush()` waiters; the round is told which
devices were written.

The writer lingers: a batch waits up to `interval` (1 s by default) for the
batches after it, so that a running reply, one progress record every 250 ms,
costs one log write a second instead of four (issue 29: a write(2) and its
GIL hand-off were a third of the CPU a record at 5,000 streams). Nothing is
less safe for it: the records are in the journal, which a round trims only
up to `written_no`, and a start writes back what the logs lack. A reader
never waits for the linger: `flush()` says which batch it needs (`want`),
and the writer writes up to there at once; a stop ends the linger too.

A failed write is fatal, as a failed sync: the store breaks, and the batches
not written stay queued. Their lines are in the journal (the next start
writes them back), and until then `unwritten(sid)` hands readers what only
the journal holds, so reads after a failure still see every acknowledged
record. In the direct modes the committer writes the logs itself and calls
`mark_written` at once.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import trio

from .batch import Batch, LogState, Timing
from .logfiles import LogFiles


class LogWriter:
    """The log writer's task and the written position (see the module's header)."""

    def __init__(self, files: LogFiles, fd_lock: trio.Lock, sessions: dict[str, LogState], timing: Timing,
                 on_written: Callable[[set[int]], None], fail: Callable[[BaseException], None],
                 interval: float = 0.0) -> None:
        self.files, self.fd_lock, self.sessions, self.timing = files, fd_lock, sessions, timing
        self.on_written, self.fail = on_written, fail
        self.interval = interval       # how long a queued batch may wait for the next ones (the linger)
        self.queued: list[Batch] = []  # durable batches whose lines wait to be written
        self.queued_at = 0.0           # trio time the oldest of them was queued
        self.wanted_no = 0             # a flush waits for the logs up to this batch: no linger up to it
        self.wake = trio.Event()
        self._hurry = trio.Event()     # set when the linger should end (wanted_no moved, the committer ended)
        self.written = trio.Event()    # set (and replaced) each time written_no moves
        self.written_no = 0            # the last batch whose lines are in the logs
        self.commit_done = False       # the committer ended: write what is queued, then end
        self.done = False              # ended (all written, or its write failed)

    def queue(self, batch: Batch) -> None:
        if not self.queued:
            self.queued_at = trio.current_time()
        self.queued.append(batch)
        self.wake.set()
        if batch.no <= self.wanted_no:
            self._hurry.set()

    def want(self, no: int) -> None:
        """A reader waits for batch `no` to be in the logs: no linger up to it."""
        if no > self.wanted_no:
            self.wanted_no = no
            if self.queued and self.queued[0].no <= no:
                self._hurry.set()

    def committer_ended(self) -> None:
        self.commit_done = True
        self.wake.set()
        self._hurry.set()

    async def _linger(self) -> None:
        """Let the queued batches wait for more (at most `interval` since the
        oldest was queued), unless a reader or the stop wants them."""
        deadline = self.queued_at + self.interval
        while not self.commit_done and self.queued[0].no > self.wanted_no:
            self._hurry = trio.Event()
            with trio.move_on_at(deadline) as waited:
                await self._hurry.wait()
            if waited.cancelled_caught:
                return

    def tell_waiters(self) -> None:
        """Wake whoever waits on `written` (the store broke: they look again)."""
        self.written.set()
        self.written = trio.Event()

    def unwritten(self, session_id: str) -> bytes:
        """A session's acknowledged lines that are not in its log file: empty
        unless the writer failed."""
        if not self.done or not self.queued:
            return b""
        return b"".join(line for b in self.queued for line in b.lines.get(session_id, ()))

    def mark_written(self, batches: list[Batch]) -> None:
        sessions = self.sessions
        for batch in batches:
            for sid, lines in batch.lines.items():
                sess = sessions.get(sid)
                if sess is not None:
                    sess.written_seq = batch.last_seq[sid]
                    sess.written_end += sum(map(len, lines))
        self.written_no = batches[-1].no
        self.tell_waiters()

    async def run(self) -> None:
        try:
            while True:
                if not self.queued:
                    if self.commit_done:
                        return
                    await self.wake.wait()
                    self.wake = trio.Event()
                    continue
                if self.interval > 0:
                    await self._linger()
                batches, self.queued = self.queued, []
                try:
                    async with self.fd_lock:
                        devs = await trio.to_thread.run_sync(self._write_sync, batches)
                except OSError as e:
                    # Nothing more is written; the journal holds these, and
                    # readers see them through unwritten() until a restart.
                    self.queued[:0] = batches
                    self.fail(e)
                    return
                self.mark_written(batches)
                self.on_written(devs)
        finally:
            self.done = True
            self.tell_waiters()

    def _write_sync(self, batches: list[Batch]) -> set[int]:
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
        devices = self.files.write(merged)
        self.timing.add("logs", time.perf_counter() - t0)
        return devices
