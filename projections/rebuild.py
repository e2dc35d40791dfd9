"""Offline tools over a data root (the store must not be running: they take
its lock): rebuild every cache from the logs, verify that logs and caches
agree, inspect a session's records, repair a quarantined session.

Sync code with file I/O through the FileOps seam; `server/cli.py` wires them
to the `sessionlog` command.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec

from eventstore.errors import UnknownSession
from eventstore.fsio import FileOps
from eventstore.ids import validate_session_id
from eventstore.log import list_session_ids, log_path, read_log, scan
from eventstore.record import Record

from .checkpoint import (IndexCheckpoint, SessionEntry, SessionSnapshot, encode_index, encode_snapshot,
                         read_index, read_snapshot, snapshot_path, write_index, write_snapshot)
from .recovery import fold_until, load_session_state, recover_registry
from .session import SessionState

Progress = Callable[[int, int], None]


@dataclass
class RebuildReport:
    sessions: int = 0
    records: int = 0
    snapshots: int = 0
    torn_repaired: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    unfinished_deletions: list[str] = field(default_factory=list)
    seconds: float = 0.0


def rebuild(fs: FileOps, root: str, progress: Progress | None = None) -> RebuildReport:
    """Replay every log in full; rewrite index.json and every snapshot.json."""
    t0 = time.perf_counter()
    registry, found, rep = recover_registry(fs, root, use_checkpoint=False, repair=True, progress=progress)
    out = RebuildReport(sessions=len(registry), records=rep.records,
                        torn_repaired=[str(t) for t in rep.torn],
                        quarantined=[str(c) for c in rep.quarantined],
                        unfinished_deletions=rep.unfinished_deletions)
    entries = {}
    for sid, rec in found.items():
        assert rec.meta is not None
        entries[sid] = SessionEntry(seq=rec.seq, end=rec.end, meta=rec.meta)
        state, _ = load_session_state(fs, root, sid, use_snapshot=False)
        write_snapshot(fs, root, sid, encode_snapshot(state))
        out.snapshots += 1
    write_index(fs, root, encode_index(IndexCheckpoint(written_at=time.time(), sessions=entries)))
    out.seconds = time.perf_counter() - t0
    return out


@dataclass
class Problem:
    session_id: str
    line: int | None
    what: str

    def __str__(self) -> str:
        at = f" line {self.line}" if self.line is not None else ""
        return f"{self.session_id}{at}: {self.what}"


def verify(fs: FileOps, root: str, progress: Progress | None = None) -> tuple[int, list[Problem]]:
    """Check every log (checksums, seq order, tails) and every cache against a
    replay. Changes nothing. Returns (sessions checked, problems)."""
    problems: list[Problem] = []
    ckpt, how = read_index(fs, root)
    if how.startswith("corrupt"):
        problems.append(Problem("index.json", None, how))
    entries = ckpt.sessions if ckpt is not None else {}
    ids = list_session_ids(fs, root)
    enc = msgspec.json.Encoder()
    for i, sid in enumerate(ids):
        data = read_log(fs, root, sid)
        s = scan(sid, data, expect_seq=1)
        if s.corrupt is not None:
            problems.append(Problem(sid, s.corrupt.line_no, f"corrupt record: {s.corrupt.reason}"))
        if s.torn_bytes:
            line = len(s.records) + 1
            problems.append(Problem(sid, line, f"torn tail of {s.torn_bytes} bytes after the last good record"))
        last = s.records[-1].seq if s.records else 0
        entry = entries.get(sid)
        if entry is not None:
            if entry.seq > last or entry.end > s.good_end:
                problems.append(Problem(sid, None, f"index.json is ahead of the log (seq {entry.seq} > {last})"))
            else:
                st = fold_until(s.records, data, entry.seq)
                if st.meta is None or enc.encode(st.meta) != enc.encode(entry.meta) or st.end != entry.end:
                    problems.append(Problem(sid, None, f"index.json row disagrees with a replay to seq {entry.seq}"))
        snap = read_snapshot(fs, root, sid)
        if snap is None and fs.exists(snapshot_path(root, sid)):
            problems.append(Problem(sid, None, "snapshot.json is unreadable"))
        elif snap is not None:
            if snap.seq > last:
                problems.append(Problem(sid, None, f"snapshot.json is ahead of the log (seq {snap.seq} > {last})"))
            else:
                st = fold_until(s.records, data, snap.seq)
                if enc.encode(SessionSnapshot.of(st)) != enc.encode(snap):
                    problems.append(Problem(sid, None, f"snapshot.json disagrees with a replay to seq {snap.seq}"))
        if progress is not None:
            progress(i + 1, len(ids))
    for sid in entries:
        if sid not in ids:
            problems.append(Problem(sid, None, "index.json lists a session that has no log"))
    return len(ids), problems


def inspect(fs: FileOps, root: str, session_id: str, after: int = 0) -> Iterator[bytes]:
    """The session's record lines with seq > after, as stored (valid JSON each)."""
    validate_session_id(session_id)
    if not fs.exists(log_path(root, session_id)):
        raise UnknownSession(session_id)
    data = read_log(fs, root, session_id)
    s = scan(session_id, data, expect_seq=1)
    pos = 0
    for rec in s.records:
        nl = data.index(b"\n", pos)
        if rec.seq > after:
            yield data[pos:nl]
        pos = nl + 1
    if s.corrupt is not None:
        raise s.corrupt


def repair(fs: FileOps, root: str, session_id: str) -> str:
    """Cut a quarantined log back to its last good record before the damage,
    keeping the removed bytes beside it, and drop the caches that may reflect
    them. Returns what was done."""
    validate_session_id(session_id)
    path = log_path(root, session_id)
    if not fs.exists(path):
        raise UnknownSession(session_id)
    data = read_log(fs, root, session_id)
    s = scan(session_id, data, expect_seq=1)
    if s.corrupt is None and not s.torn_bytes:
        return f"{session_id}: nothing to repair ({len(s.records)} good records)"
    n = 1
    while fs.exists(f"{path}.corrupt-{n}"):
        n += 1
    copy = f"{path}.corrupt-{n}"
    fs.write_file(copy, data[s.good_end:])
    fs.truncate(path, s.good_end)
    fd = fs.open_append(path)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)
    for cache in (snapshot_path(root, session_id), os.path.join(root, "index.json")):
        if fs.exists(cache):
            fs.unlink(cache)
    fs.fsync_dir(os.path.dirname(path))
    fs.fsync_dir(root)
    where = f"at line {s.corrupt.line_no} ({s.corrupt.reason})" if s.corrupt else "(torn tail)"
    return (f"{session_id}: cut {len(data) - s.good_end} bytes {where}; kept {len(s.records)} good records; "
            f"removed bytes saved to {copy}")
