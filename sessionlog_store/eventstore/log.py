"""Per-session log files: layout, scanning, torn-tail repair, reading.

Theory of operation
-------------------
A session's log (`<root>/sessions/<id>/log.jsonl`) is the source of truth;
every other file is a cache rebuilt from the logs. Records are appended by the
committer (commit.py), each batch of a session's new lines with one `os.write`
on an `O_APPEND` descriptor, then made durable with fdatasync or syncfs.

"Acknowledged" means the batch holding the record was written *and* synced
without error: only then does `append()` return. A progress record
(`append_nowait`) is acknowledged by nothing; it is durable when a later
batch's sync completes, so a power cut can lose at most the last batch of
progress, never a finalize.

What a crash can leave at the end of a log: a line without its newline, half
a record, or (after a power cut on some filesystems) a run of zero bytes. That
is a *torn tail*: everything after the last good record holds no good record.
Opening the log keeps a copy of those bytes beside it (`log.jsonl.torn-<n>`),
truncates to the last good record, fsyncs, and reports it. Nothing it removed
was ever acknowledged, because an acknowledged record is followed only by
whole, synced lines.

A bad record *followed by* a good one is not a crash but damage (a flipped
bit, an edit): the log is never truncated for it. The session is reported
with its line number and quarantined (read-only, readable up to the damage)
until `sessionlog repair` is run on it; the rest of the store is unaffected.
A seq that does not follow its predecessor is damage too.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Final, NamedTuple

from .errors import CorruptRecord, TornTail
from .fsio import FileOps
from .ids import is_valid_session_id, validate_session_id
from .record import Record, RecordError, decode_lines, decode_record, decode_record_for_meta

LOG_NAME: Final = "log.jsonl"
SESSIONS_DIR: Final = "sessions"
PROJECTS_DIR: Final = "projects"


def session_dir(root: str, session_id: str) -> str:
    """The folder of a session; the id is validated before the path is built."""
    return os.path.join(root, SESSIONS_DIR, validate_session_id(session_id))


def log_path(root: str, session_id: str) -> str:
    return os.path.join(session_dir(root, session_id), LOG_NAME)


def project_log_path(root: str) -> str:
    """The project registry's own log."""
    return os.path.join(root, PROJECTS_DIR, LOG_NAME)


class Scan(NamedTuple):
    """What scanning a log's bytes found."""
    records: list[Record]
    good_end: int            # byte offset just past the last good record
    torn_bytes: int          # bytes after good_end (0: no torn tail)
    corrupt: CorruptRecord | None  # damage before the tail: the session is quarantined


def scan(session_id: str, data: bytes, *, base_offset: int = 0, base_line: int = 0,
         expect_seq: int | None = None, meta_only: bool = False) -> Scan:
    """Decode a log (or a log's tail starting at `base_offset`). Pure.

    Stops at the first damaged record; if a good record follows it, that is
    corruption, otherwise everything from it on is a torn tail. With
    `meta_only`, progress records are checked (checksum, envelope, seq) but
    not decoded (see decode_record_for_meta): for registry rebuilds.
    """
    decode = decode_record_for_meta if meta_only else decode_record
    lines = data.split(b"\n")
    last = len(lines) - 1  # lines[last] has no newline: empty, or an interrupted write
    # The common case, a log of good records: all of them in one decode pass.
    fast = decode_lines(lines[:last], meta_only=meta_only) if last else []
    if fast is not None and (expect_seq is None or all(r.seq == expect_seq + i for i, r in enumerate(fast))):
        pos = len(data) - len(lines[last])
        return Scan(fast, base_offset + pos, len(data) - pos, None)
    records: list[Record] = []
    append = records.append
    pos = 0
    line_no = base_line
    for i, line in enumerate(lines):
        if i == last:
            break
        line_no += 1
        try:
            rec = decode(line)
        except RecordError as e:
            if _any_good_after(data, pos + len(line) + 1):
                return Scan(records, base_offset + pos, 0, CorruptRecord(session_id, line_no, str(e)))
            break
        if expect_seq is not None and rec.seq != expect_seq:
            reason = f"seq {rec.seq} where {expect_seq} was expected"
            return Scan(records, base_offset + pos, 0, CorruptRecord(session_id, line_no, reason))
        expect_seq = rec.seq + 1
        append(rec)
        pos += len(line) + 1
    return Scan(records, base_offset + pos, len(data) - pos, None)


def _any_good_after(data: bytes, pos: int) -> bool:
    """Is there a decodable record anywhere from `pos` on?"""
    end = len(data)
    while pos < end:
        nl = data.find(b"\n", pos)
        if nl < 0:
            return False
        try:
            decode_record(data[pos:nl])
            return True
        except RecordError:
            pos = nl + 1
    return False


def repair_torn_tail(fs: FileOps, path: str, label: str, data: bytes, good_end: int,
                     *, base_offset: int = 0) -> TornTail:
    """Keep a copy of the log's bytes past `good_end`, truncate the log there, fsync.
    `data` holds the log's bytes from `base_offset` on; `label` names the log
    in the report (a session id)."""
    n = 1
    while fs.exists(f"{path}.torn-{n}"):
        n += 1
    copy = f"{path}.torn-{n}"
    fs.write_file(copy, data[good_end - base_offset:])
    fs.truncate(path, good_end)
    fd = fs.open_append(path)
    try:
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(os.path.dirname(path))
    return TornTail(label, len(data) - (good_end - base_offset), copy)


def append_durable(fs: FileOps, path: str, data: bytes) -> None:
    """Append whole lines to a small log outside the group commit (the project
    registry's), creating it if needed, and fsync it (sync: call from a thread)."""
    created = not fs.exists(path)
    fd = fs.create_exclusive(path) if created else fs.open_append(path)
    try:
        fs.write(fd, data)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    if created:
        fs.fsync_dir(os.path.dirname(path))


def read_log(fs: FileOps, root: str, session_id: str, *, offset: int = 0) -> bytes:
    return fs.read_bytes(log_path(root, session_id), offset)


def list_session_ids(fs: FileOps, root: str) -> list[str]:
    """Ids of the session folders under root that hold a log (others are ignored)."""
    return session_folders(fs, root)[0]


def session_folders(fs: FileOps, root: str) -> tuple[list[str], list[str]]:
    """(ids of the session folders holding a log, ids of those without one).
    A folder without a log is an orphan: what a deletion or an interrupted
    creation left, or a copy kept by `repair`."""
    base = os.path.join(root, SESSIONS_DIR)
    with_log: list[str] = []
    without: list[str] = []
    for name in sorted(fs.listdir(base)):
        if is_valid_session_id(name):
            (with_log if fs.exists(os.path.join(base, name, LOG_NAME)) else without).append(name)
    return with_log, without


def with_ends(records: list[Record], data: bytes, base: int) -> Iterator[tuple[Record, int]]:
    """Pair each record of a scan of `data` (lines from byte `base` of a log)
    with the offset just past its line."""
    pos = 0
    for rec in records:
        pos = data.index(b"\n", pos) + 1
        yield rec, base + pos
