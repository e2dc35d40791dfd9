"""The write-ahead journal's files: the segment being written and the closed
ones a round has not removed yet (journal.py has the frame format, the
invariants and the start's write-back).

Theory of operation
-------------------
`append` and `close` run in a worker thread while the caller holds the
store's journal lock (`io_lock`): the committer appending a batch's frame,
the round closing the segment it will cover. `remove` runs in the round's
thread without it (it touches only segments already closed). A segment's
name is durable (its folder fsynced) before anything in it is
acknowledged; a frame is acknowledged once its fdatasync returns. A segment
is closed at SEGMENT_BYTES or when a round begins, and removed only by a
round that synced every log write of its batches; it remembers the last
batch it holds for that.
"""
from __future__ import annotations

import os

from .fsio import FileOps
from .journal import SEGMENT_BYTES, journal_dir, segment_name


class JournalSegments:
    """The journal's segment files of one data root."""

    def __init__(self, fs: FileOps, root: str) -> None:
        self.fs, self.root = fs, root
        self.fd: int | None = None   # the open segment
        self.path = ""
        self.size = 0
        self.closed: list[tuple[str, int]] = []  # closed segments not yet removed, with their last batch

    def append(self, batch_no: int, frame: bytes) -> None:
        """A batch's frame, durable when this returns (one fdatasync)."""
        fs = self.fs
        if self.fd is None:
            self._open(batch_no)
        assert self.fd is not None
        fs.write(self.fd, frame)
        fs.fdatasync(self.fd)
        self.size += len(frame)
        if self.size >= SEGMENT_BYTES:
            self.close(batch_no)

    def _open(self, first_batch: int) -> None:
        folder = journal_dir(self.root)
        path = os.path.join(folder, segment_name(first_batch))
        fd = self.fs.create_exclusive(path)
        try:
            self.fs.fsync_dir(folder)  # the segment's name is durable before anything in it is acknowledged
        except BaseException:
            self.fs.close(fd)
            raise
        self.fd, self.path, self.size = fd, path, 0

    def close(self, last_batch: int) -> None:
        """Close the open segment, if any, as holding batches up to `last_batch`."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self.closed.append((self.path, last_batch))
            self.fs.close(fd)

    def covered(self, upto: int) -> list[tuple[str, int]]:
        """The closed segments (oldest first) whose every batch is <= `upto`."""
        n = 0
        while n < len(self.closed) and self.closed[n][1] <= upto:
            n += 1
        return self.closed[:n]

    def remove(self, segments: list[tuple[str, int]]) -> None:
        """Unlink `segments` (the oldest closed ones) and make that durable.
        (The round runs it without the journal lock: the committer may close
        a segment meanwhile, so the list is trimmed on the trio thread after,
        by `forget`.)"""
        for path, _ in segments:
            self.fs.unlink(path)
        if segments:
            self.fs.fsync_dir(journal_dir(self.root))

    def forget(self, segments: list[tuple[str, int]]) -> None:
        """`segments` were removed: out of the list (on the trio thread)."""
        del self.closed[:len(segments)]
