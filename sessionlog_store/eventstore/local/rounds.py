"""The journal's rounds: make the logs' writes durable, then remove the
journal segments they covered.

Theory of operation
-------------------
In the journal mode a batch is acknowledged at its frame's fdatasync and
its lines reach the logs unsynced (logwriter.py). About once a
`interval` after a log write, a round:

1. takes `upto`, the last batch whose lines are in the logs, and the
   devices written since the last round (nothing awaits between the two);
2. closes the open segment (under the journal lock: between two frames),
   so that every closed segment's batches are known;
3. syncs the logs: one syncfs per device on descriptors opened before the
   devices' first log write (Linux >= 5.8 reports every writeback error
   since), or, where syncfs reports none, an fdatasync of each log written
   since through the descriptor that wrote it (under the descriptor lock);
4. removes the closed segments whose every batch is <= `upto`.

A failed sync is fatal (the store breaks, the journal is kept: the next
start writes its records back into the logs). A round is shielded from
cancellation and serialized (`sync_lock`): it is never left half done, and
a stop's last round runs after the log writer's last write. `holds(sid)`
says whether the journal may still hold a session's records (a create or a
removal of that id then journals a birth marker: journal.py).
"""
from __future__ import annotations

import time
from collections.abc import Callable

import trio

from .batch import Timing
from .fsio import SYNCFS_REPORTS_ERRORS
from .logfiles import LogFiles
from .segments import JournalSegments


class JournalRounds:
    """The round task and what it needs to know (see the module's header)."""

    def __init__(self, files: LogFiles, segments: JournalSegments, io_lock: trio.Lock, fd_lock: trio.Lock,
                 interval: float, timing: Timing, *, written_no: Callable[[], int],
                 committed_no: Callable[[], int], broken: Callable[[], BaseException | None],
                 fail: Callable[[BaseException], None]) -> None:
        self.files, self.segments, self.io_lock, self.fd_lock = files, segments, io_lock, fd_lock
        self.interval, self.timing = interval, timing
        self.written_no, self.committed_no, self.broken, self.fail = written_no, committed_no, broken, fail
        self.lock = trio.Lock()
        self.wake = trio.Event()
        self.scope = trio.CancelScope()
        self.dirty_devs: set[int] = set()     # devices with log writes since the last round
        self.trimmed_upto = 0                 # the journal holds no batch up to this one
        self.journaled: dict[str, int] = {}   # session -> the last batch holding its records
        self.rounds = 0
        self.removed = 0                      # segments removed

    def written(self, devs: set[int]) -> None:
        """The log writer wrote to these devices: a round is due."""
        self.dirty_devs |= devs
        self.wake.set()

    def journaling(self, session_id: str, batch_no: int) -> None:
        self.journaled[session_id] = batch_no

    def holds(self, session_id: str) -> bool:
        """The journal may still hold records of this session id."""
        return self.journaled.get(session_id, 0) > self.trimmed_upto

    async def loop(self) -> None:
        with self.scope:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                await trio.sleep(self.interval)
                await self.round()

    async def round(self) -> None:
        with trio.CancelScope(shield=True):
            async with self.lock:
                if self.broken() is not None:
                    return
                # What is in the logs now is what this round's sync covers.
                upto = self.written_no()
                if upto <= self.trimmed_upto:
                    return
                devs, self.dirty_devs = self.dirty_devs, set()
                segments = self.segments
                async with self.io_lock:  # between two journal writes
                    if segments.fd is not None:
                        await trio.to_thread.run_sync(segments.close, self.committed_no())
                covered = segments.covered(upto)
                try:
                    t0 = time.perf_counter()
                    if SYNCFS_REPORTS_ERRORS:
                        await trio.to_thread.run_sync(self.files.syncfs, devs)
                    else:  # each written log, through its descriptor (none closes meanwhile)
                        async with self.fd_lock:
                            await trio.to_thread.run_sync(self.files.sync_unsynced)
                    self.timing.add("log sync", time.perf_counter() - t0)
                    await trio.to_thread.run_sync(segments.remove, covered)
                except OSError as e:
                    self.fail(e)  # fatal, as any failed sync: the journal keeps the records
                    return
                segments.forget(covered)
                self.rounds += 1
                if covered:
                    self.trimmed_upto = covered[-1][1]
                    self.removed += len(covered)
                    self.journaled = {s: k for s, k in self.journaled.items() if k > self.trimmed_upto}
