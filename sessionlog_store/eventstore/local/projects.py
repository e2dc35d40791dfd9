"""The project log on the local engine: `<root>/projects/log.jsonl`, written
by one process (the data root's lock holder), each append durable on
return. It keeps the contract of backend.ProjectLog: its listeners are never
told (no other writer) and an append never meets ProjectsMoved.

A torn last line is cut at load (`torn` says what was cut); damage before
the end leaves the records before it served and the log read-only until
`sessionlog repair projects` (`damage`); a failed write or sync is fatal
(`broken`) and never retried, as the session logs' (the line may be in the
file already; a retry would repeat its seq).
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import trio

from ..errors import CorruptRecord, SessionReadOnly, StoreBroken, TornTail
from ..events import Event
from ..record import Record, encode_record, scan
from .fsio import FileOps
from .log import append_durable, project_log_path, repair_torn_tail


class LocalProjectLog:
    def __init__(self, fs: FileOps, root: str) -> None:
        self.fs = fs
        self.path = project_log_path(root)
        self.listeners: list[Callable[[list[Record]], None]] = []  # (one writer: never told)
        self.seq = 0
        self.torn: TornTail | None = None
        self.damage: CorruptRecord | None = None
        self.broken: OSError | None = None
        self._loaded = False

    async def catch_up(self) -> list[Record]:
        """Its first call: every record in the file; later ones: none (only
        this process writes it)."""
        if self._loaded:
            return []
        self._loaded = True
        return await trio.to_thread.run_sync(self._load)

    def _load(self) -> list[Record]:
        folder = os.path.dirname(self.path)
        if not self.fs.exists(folder):
            self.fs.makedirs(folder)
            self.fs.fsync_dir(os.path.dirname(folder))  # the folder's name, durable in the root
        if not self.fs.exists(self.path):
            return []
        data = self.fs.read_bytes(self.path)
        s = scan("projects", data, expect_seq=1)
        self.damage = s.corrupt
        if s.torn_bytes:
            self.torn = repair_torn_tail(self.fs, self.path, "projects", data, s.good_end)
        if s.records:
            self.seq = s.records[-1].seq
        return list(s.records)

    async def append(self, event: Event) -> Record:
        if self.damage is not None:
            raise SessionReadOnly(f"the project log is damaged ({self.damage}); projects are read-only "
                                  "until `sessionlog repair projects`")
        if self.broken is not None:
            raise StoreBroken("the project log failed to write or sync; restart to recover") from self.broken
        rec = Record(self.seq + 1, time.time(), event)
        line = encode_record(rec.seq, rec.ts, event)
        try:
            await trio.to_thread.run_sync(append_durable, self.fs, self.path, line)
        except OSError as e:
            self.broken = e
            raise StoreBroken(f"writing the project log failed: {e}") from e
        self.seq = rec.seq
        return rec
