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
from typing import Final

from ..errors import TornTail
from .fsio import FileOps
from ..ids import is_valid_session_id, validate_session_id

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


#END


def create_log(fs: FileOps, path: str, data: bytes) -> None:
    """A new session's folder and log holding `data`, durably: the log, its
    folder and the folder above it fsynced. FileExistsError if it exists."""
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


def remove_session_folder(fs: FileOps, folder: str, fd: int | None = None) -> None:
    """A session's folder removed, durably (its log's descriptor `fd`, if
    still open, closed first)."""
    if fd is not None:
        fs.close(fd)
    if fs.exists(folder):
        fs.rmtree(folder)
    fs.fsync_dir(os.path.dirname(folder))
