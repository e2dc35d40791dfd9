"""What the local engine's tasks hand each other: a batch of lines, what the
store knows of each session's log, and where the write path's time goes.

A `Batch` fills on the trio thread (appends put each session's new lines
into it, in seq order), is made durable by the committer (commit.py: the
journal's frame, or the logs themselves in the direct modes), and in the
journal mode is then written into the logs by the log writer
(logwriter.py). A `LogState` is one session's log as the store knows it:
appended, acknowledged and written, each a seq and a byte offset.
"""
from __future__ import annotations

import trio

from ..errors import CorruptRecord


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


class Batch:
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


class LogState:
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
