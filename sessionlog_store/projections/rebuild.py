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

from sessionlog_store.eventstore.errors import EventStoreError, UnknownSession
from sessionlog_store.eventstore.events import SessionCreated, StreamOpened
from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.eventstore.local.journal import list_segments
from sessionlog_store.eventstore.ids import validate_session_id
from sessionlog_store.eventstore.local.log import LOG_NAME, log_path, project_log_path, read_log, session_dir, session_folders
from sessionlog_store.eventstore.record import scan

from .checkpoint import (IndexCheckpoint, SessionEntry, SessionSnapshot, encode_index, encode_snapshot,
                         index_path, read_index, read_snapshot, snapshot_is_older_format, snapshot_path,
                         write_index, write_snapshot)
from .recovery import fold_until, load_session_state, recover_registry
from .session import SessionMeta, SessionState

Progress = Callable[[int, int], None]


@dataclass
class RebuildReport:
    sessions: int = 0
    records: int = 0
    snapshots: int = 0
    torn_repaired: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    unfinished_deletions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


def rebuild(fs: FileOps, root: str, progress: Progress | None = None,
            each: Callable[[str, SessionMeta, SessionState], None] | None = None) -> RebuildReport:
    """Replay every log in full; rewrite index.json and every snapshot.json;
    `each(sid, meta, state)` for every session replayed (another projection
    written from the same pass: the search index)."""
    t0 = time.perf_counter()
    registry, damaged, rep = recover_registry(fs, root, use_checkpoint=False, repair=True, progress=progress)
    out = RebuildReport(sessions=len(registry), records=rep.records,
                        torn_repaired=[str(t) for t in rep.torn],
                        quarantined=[str(c) for c in rep.quarantined],
                        unfinished_deletions=rep.unfinished_deletions)
    out.notes = ([f"interrupted creation removed: {sid}" for sid in rep.unfinished_creations]
                 + [f"orphan folder: {o}" for o in rep.orphans]
                 + [f"removed left-over file: {t}" for t in rep.temp_files])
    entries = {}
    for sid, meta in registry.rows.items():
        if sid not in damaged:  # a quarantined session is never checkpointed: startup replays it
            mark = registry.marks[sid]
            entries[sid] = SessionEntry(seq=mark.seq, end=mark.end, meta=meta)
        state, _ = load_session_state(fs, root, sid, use_snapshot=False)
        write_snapshot(fs, root, sid, encode_snapshot(state))
        out.snapshots += 1
        if each is not None:
            each(sid, meta, state)
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
    ids, orphans = session_folders(fs, root)
    for sid in orphans:
        kept = fs.kept_folder(session_dir(root, sid))
        problems.append(Problem(sid, None, f"orphan folder: no {LOG_NAME} in sessions/{sid}/"
                                + (f", which is {kept} (is its disk mounted?)" if kept else "")))
    if fs.exists(index_path(root) + ".tmp"):
        problems.append(Problem("index.json.tmp", None, "a left-over temp file (the next start removes it)"))
    for name in sorted(fs.listdir(root)):
        if name.startswith("journal-damaged-"):
            problems.append(Problem(name, None, "a journal a start could not fully apply, kept for inspection "
                                    "(its notes are in that start's log); remove it once handled"))
    segs, _ = list_segments(fs, root)
    if segs:
        problems.append(Problem("journal", None, f"{len(segs)} journal segment(s): a server is running on this "
                                "store, or one stopped without finishing (a crash); acknowledged records there "
                                "may be missing from the logs below until a start or `sessionlog rebuild` "
                                "writes them back"))
    problems += verify_projects(fs, root)
    problems += verify_streams(fs, root)
    enc = msgspec.json.Encoder()
    for i, sid in enumerate(ids):
        data = read_log(fs, root, sid)
        s = scan(sid, data, expect_seq=1)
        if s.corrupt is not None:
            problems.append(Problem(sid, s.corrupt.line_no, f"corrupt record: {s.corrupt.reason}"))
        elif not s.records or type(s.records[0].event) is not SessionCreated:
            what = "the log is empty" if not s.records else "the log does not start with session_created"
            problems.append(Problem(sid, 1, f"{what}: the session is quarantined"))
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
        if fs.exists(snapshot_path(root, sid) + ".tmp"):
            problems.append(Problem(sid, None, "snapshot.json.tmp: a left-over temp file (the next start removes it)"))
        snap = read_snapshot(fs, root, sid)
        if snap is None and fs.exists(snapshot_path(root, sid)) and not snapshot_is_older_format(fs, root, sid):
            problems.append(Problem(sid, None, "snapshot.json is unreadable"))
        elif snap is not None:
            if snap.seq > last or snap.end > s.good_end:
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


class RepairRefused(EventStoreError):
    """`repair` would keep no record of a log: it refuses unless told to (--allow-empty)."""


def repair(fs: FileOps, root: str, session_id: str, *, allow_empty: bool = False) -> str:
    """Cut a quarantined log back to its last good record before the damage,
    keeping the removed bytes beside it (`log.jsonl.corrupt-N`), and drop the
    caches that may reflect them. Refuses to keep no record unless
    `allow_empty`; the emptied session then stays listed as damaged (never
    removed by a start). Returns what was done."""
    validate_session_id(session_id)
    path = log_path(root, session_id)
    if not fs.exists(path):
        raise UnknownSession(session_id)
    caches = [snapshot_path(root, session_id), index_path(root)]
    return _cut_log(fs, path, session_id, caches, allow_empty)


def repair_projects(fs: FileOps, root: str, *, allow_empty: bool = False) -> str:
    """`repair` for the project registry's log (`projects/log.jsonl`)."""
    path = project_log_path(root)
    if not fs.exists(path):
        return "projects: no project log (nothing to repair)"
    return _cut_log(fs, path, "projects", [], allow_empty)


def _cut_log(fs: FileOps, path: str, label: str, caches: list[str], allow_empty: bool) -> str:
    """The repair, in an order that a power cut at any point leaves either the
    untouched log or the cut one, with the removed bytes saved under a durable
    name and no cache that reflects them:
      1. the removed bytes go to a new `.corrupt-N` file, fsynced, and its
         name is made durable (fsync of the folder);
      2. the caches that may reflect the log past the cut are removed, durably;
      3. only then is the log truncated and fsynced."""
    data = fs.read_bytes(path)
    s = scan(label, data, expect_seq=1)
    if s.corrupt is None and not s.torn_bytes:
        return f"{label}: nothing to repair ({len(s.records)} good records)"
    where = f"at line {s.corrupt.line_no} ({s.corrupt.reason})" if s.corrupt else "(torn tail)"
    if not s.records and not allow_empty:
        raise RepairRefused(
            f"{label}: the damage is {where} and a cut would keep no record; nothing was changed. "
            f"Pass --allow-empty to empty the log anyway (its bytes are kept beside it and the "
            f"session stays listed as damaged)")
    folder = os.path.dirname(path)
    n = 1
    while fs.exists(f"{path}.corrupt-{n}"):
        n += 1
    copy = f"{path}.corrupt-{n}"
    fs.write_file(copy, data[s.good_end:])
    fs.fsync_dir(folder)
    removed_dirs = set()
    for cache in caches:
        if fs.exists(cache):
            fs.unlink(cache)
            removed_dirs.add(os.path.dirname(cache))
    for d in sorted(removed_dirs):
        fs.fsync_dir(d)
    fs.truncate(path, s.good_end)
    fd = fs.open_append(path)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)
    return (f"{label}: cut {len(data) - s.good_end} bytes {where}; kept {len(s.records)} good records; "
            f"removed bytes saved to {copy}")


STREAMS_DIR = "streams"  # (the generic namespace's own data root: server/local/streamspace.py)


def verify_streams(fs: FileOps, root: str) -> list[Problem]:
    """The damage of the apps' streams (`<root>/streams/`, a data root of its
    own), as verify reports it: each log's checksums, order and tail."""
    sroot = os.path.join(root, STREAMS_DIR)
    if not fs.exists(os.path.join(sroot, "sessions")):
        return []
    out = []
    segs, _ = list_segments(fs, sroot)
    if segs:
        out.append(Problem("streams/journal", None, f"{len(segs)} journal segment(s) of the streams: a server is "
                           "running on this store, or one stopped without finishing; the next start writes them "
                           "back"))
    ids, _ = session_folders(fs, sroot)
    for log_id in ids:
        s = scan(log_id, read_log(fs, sroot, log_id), expect_seq=1)
        name = f"streams/{log_id}"
        if s.corrupt is not None:
            out.append(Problem(name, s.corrupt.line_no, f"corrupt record in a stream's log: {s.corrupt.reason} "
                                                       f"(`sessionlog repair --root {sroot} {log_id}`)"))
        elif not s.records or type(s.records[0].event) is not StreamOpened:
            out.append(Problem(name, 1, "a stream's log that does not start with ds_opened (the next start "
                                        "removes it)"))
        if s.torn_bytes:
            out.append(Problem(name, len(s.records) + 1, f"torn tail of {s.torn_bytes} bytes in a stream's log "
                                                         "(the next start cuts it)"))
    return out


def verify_projects(fs: FileOps, root: str) -> list[Problem]:
    """The project log's damage, as verify reports it."""
    path = project_log_path(root)
    if not fs.exists(path):
        return []
    data = fs.read_bytes(path)
    s = scan("projects", data, expect_seq=1)
    out = []
    if s.corrupt is not None:
        out.append(Problem("projects", s.corrupt.line_no, f"corrupt record in projects/log.jsonl: {s.corrupt.reason} "
                                                          "(`sessionlog repair projects`)"))
    if s.torn_bytes:
        out.append(Problem("projects", len(s.records) + 1,
                           f"torn tail of {s.torn_bytes} bytes in projects/log.jsonl"))
    return out
