"""Startup recovery: checkpoint + tail replay, with full replay as the fallback.

Theory of operation
-------------------
The logs are the truth. `index.json` holds, per session, a registry row as of
some seq S and the byte offset E just past record S. The checkpoint writer
only ever records an (S, E) that was durable when it wrote, so after any
crash the log still holds records 1..S ending at E (a torn tail is always
past the last durable record, because nothing is acknowledged, and no
checkpoint is written, before its sync).

First, with `repair`, the write-ahead journal a crash left is applied to the
logs (eventstore/local/journal.py): after that every acknowledged record is in its
log and the rest of this holds unchanged. Read-only callers (verify, a dry
run) see the logs as they are.

For each session folder with a log:
  - if the checkpoint has it and the log is at least E bytes long, read only
    the bytes from E, decode them expecting seq S+1 first, and fold them into
    the checkpoint's row. Because the fold is a pure function of the records
    in order, row(1..S) folded with (S+1..N) equals row(1..N): tail replay
    equals full replay.
  - otherwise (no entry, log shorter than E, a tail that does not start with
    record S+1, damage in the tail), replay the whole log.
A torn tail is repaired (copy kept, truncated, fsynced) and reported; damage
before the tail quarantines the session (its row is the good prefix's).

A log whose fold ends in no meta is one of three things, and only the first
two are ever removed:
  - it holds a tombstone (`session_deleted`; nothing is appended after one): a deletion that did
    not finish; its folder is removed;
  - it is empty (0 bytes: no torn copy beside it) and nothing else is in the
    folder but caches: a creation that did not finish (a session is
    acknowledged only once its first records are fsynced), removed;
  - anything else (damage in line 1, records without `session_created`, a log
    emptied by `repair --allow-empty`): the session is quarantined and listed
    with what is known (`damaged_meta`), read-only, never removed.
Left-over temp files (`*.tmp` of an interrupted checkpoint write) are removed,
and session folders without a log that hold only temp files are removed too;
any other orphan folder (a snapshot without its log included) is reported
and kept, and so is one that is a symlink or a mount point, whatever it
holds (a disk not mounted yet: its logs come back when it is). Session snapshots follow the
same rules one level down (`load_session_state`).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import msgspec

from sessionlog_store.eventstore.errors import CorruptRecord, TornTail
from sessionlog_store.eventstore.events import SessionDeleted
from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.eventstore.local.journal import JournalRecovery, apply_journal
from sessionlog_store.eventstore.record import Record
from sessionlog_store.eventstore.local.log import LOG_NAME, log_path, read_log, repair_torn_tail, session_dir, session_folders
from sessionlog_store.eventstore.record import scan, scan_meta, with_ends

from .checkpoint import (INDEX_NAME, SNAPSHOT_NAME, decode_entry, index_path, read_index_entries, read_snapshot,
                         snapshot_path)
from .registry import Mark, Registry
from .session import SessionMeta, SessionState, apply_meta


@dataclass
class RecoveryReport:
    sessions: int = 0
    records: int = 0             # records decoded (tails only, where a checkpoint served)
    bytes: int = 0
    full_replays: int = 0
    tail_replays: int = 0
    checkpoint: str = "missing"  # loaded / missing / corrupt: ...
    torn: list[TornTail] = field(default_factory=list)
    quarantined: list[CorruptRecord] = field(default_factory=list)
    unfinished_deletions: list[str] = field(default_factory=list)
    unfinished_creations: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)       # folders without a log, kept: what is in them
    tail_replayed: list[str] = field(default_factory=list)  # sessions read only past their checkpoint
    temp_files: list[str] = field(default_factory=list)    # left-over temp files removed
    journal: JournalRecovery = field(default_factory=JournalRecovery)  # what the journal gave back
    seconds: float = 0.0


@dataclass
class SessionRecovery:
    meta: SessionMeta | None
    seq: int
    end: int
    meta_seq: int
    corrupt: CorruptRecord | None
    deleted: bool = False     # the log holds a tombstone
    first_ts: float = 0.0     # ts of the first good record (0: none)


def replay_meta(fs: FileOps, root: str, sid: str, report: RecoveryReport,
                entry_seq: int = 0, entry_end: int = 0, entry_meta: SessionMeta | None = None,
                *, repair: bool = True) -> SessionRecovery:
    """Fold a session's log (or its tail past a checkpoint entry) into its meta."""
    offset = entry_end if entry_meta is not None else 0
    data = read_log(fs, root, sid, offset=offset)
    s = scan_meta(sid, data, base_offset=offset, expect_seq=entry_seq + 1 if offset else 1)
    if offset and (s.corrupt is not None or (s.torn_bytes and not s.total)):
        # The tail does not continue the checkpoint: trust only the log.
        return replay_meta(fs, root, sid, report, repair=repair)
    meta = entry_meta if offset else None
    meta_seq = entry_seq if offset else 0
    for rec in s.records:  # (not progress: no meta change, most of a log)
        new = apply_meta(meta, rec)
        if new is not meta:
            meta_seq = rec.seq
        meta = new
    report.records += s.total
    report.bytes += len(data)
    if offset:
        report.tail_replays += 1
        report.tail_replayed.append(sid)
    else:
        report.full_replays += 1
    if s.torn_bytes:
        if repair:
            report.torn.append(repair_torn_tail(fs, log_path(root, sid), sid, data, s.good_end,
                                                base_offset=offset))
        else:
            report.torn.append(TornTail(sid, s.torn_bytes, "(not repaired)"))
    if s.corrupt is not None:
        report.quarantined.append(s.corrupt)
    seq = s.last_seq if s.total else entry_seq if offset else 0
    # Only a log that folds to no meta can be a deletion: look for its tombstone then.
    deleted = meta is None and any(type(r.event) is SessionDeleted for r in s.records)
    first_ts = s.first_ts if s.total and not offset else 0.0
    return SessionRecovery(meta, seq, s.good_end, meta_seq, s.corrupt, deleted, first_ts)


# The check after startup reads a log in pieces of this size, so that neither
# memory nor one long call holding the GIL grows with the log (between pieces
# the interpreter's switch interval lets the trio thread run).
CHECK_CHUNK = 1 << 20


def check_prefix(fs: FileOps, root: str, sid: str, end: int) -> CorruptRecord | None:
    """Damage in a log's first `end` bytes (checksums, envelopes, seq order),
    or None. For the part of a log that startup did not read (before its
    checkpoint offset). Sync; run it in a thread."""
    path = log_path(root, sid)
    pos = line = 0
    expect = 1
    carry = b""
    while pos < end:
        chunk = fs.read_bytes(path, pos, min(CHECK_CHUNK, end - pos))
        if not chunk:
            break
        pos += len(chunk)
        data = carry + chunk
        cut = data.rfind(b"\n") + 1
        carry = data[cut:]
        s = scan_meta(sid, data[:cut], base_line=line, expect_seq=expect)
        if s.corrupt is not None:
            return s.corrupt
        if s.torn_bytes:  # a bad line last in this piece is damage too: the log goes on
            return CorruptRecord(sid, line + s.total + 1, "a damaged record before the checkpointed end")
        line += s.total
        expect = s.last_seq + 1
    if carry or pos < end:
        return CorruptRecord(sid, line + 1, "a damaged record before the checkpointed end of the log")
    return None


def damaged_meta(sid: str, rec: SessionRecovery) -> tuple[SessionMeta, CorruptRecord]:
    """What is known of a session whose meta cannot be read: its id, and the
    time of its first good record; with why it is quarantined."""
    corrupt = rec.corrupt or CorruptRecord(
        sid, 1, "the log has no session_created record" if rec.seq else "the log is empty")
    at = rec.first_ts
    return SessionMeta(id=sid, title=f"Damaged session {sid}", created_at=at, updated_at=at), corrupt


def shared_strings(meta: SessionMeta, sid: str, pool: dict[str, str]) -> SessionMeta:
    """The row with its id the registry's key itself and its few-valued
    strings (agent, source, status, owner, project) one object each for all
    rows (issue 29: decoded, each row held its own copies; ~250 bytes a
    session of a 100,000-session registry)."""
    get = pool.setdefault
    agent, source, status, owner = (get(meta.agent_id, meta.agent_id), get(meta.source, meta.source),
                                    get(meta.status, meta.status), get(meta.owner, meta.owner))
    project = meta.project_id if meta.project_id is None else get(meta.project_id, meta.project_id)
    # In place (the row was just decoded or folded here, nobody else holds it
    # yet): a copy of every row would leave the decoded ones' holes behind.
    for name, value in (("id", sid), ("agent_id", agent), ("source", source), ("status", status),
                        ("owner", owner), ("project_id", project)):
        if getattr(meta, name) is not value:
            msgspec.structs.force_setattr(meta, name, value)
    return meta


def recover_registry(fs: FileOps, root: str, *, use_checkpoint: bool = True, repair: bool = True,
                     progress: object = None) -> tuple[Registry, dict[str, CorruptRecord], RecoveryReport]:
    """Rebuild the registry from the checkpoint and the logs' tails (sync: run it
    in a worker thread). Unfinished deletions are completed. With the registry:
    the sessions found damaged (quarantined: read-only), with what is wrong.
    Every row's (seq, end) is its registry Mark.

    (Nothing else a session is kept while the others are read: a result a
    session held to the end and then dropped left ~130 bytes of holes a
    session between the rows, 13 MB of RSS at 100,000 sessions: issue 29.)"""
    t0 = time.perf_counter()
    report = RecoveryReport()
    if repair:  # before anything reads a log or the checkpoint (a no-op once the event store applied it)
        report.journal = apply_journal(fs, root)
    entries: dict[str, msgspec.Raw] | None = None
    if use_checkpoint:
        entries, report.checkpoint = read_index_entries(fs, root)
    else:
        report.checkpoint = "not used"
    entries = entries or {}
    registry = Registry()
    damaged: dict[str, CorruptRecord] = {}
    ids, orphans = session_folders(fs, root)
    pool: dict[str, str] = {}
    if repair:
        _remove_temp(fs, index_path(root) + ".tmp", report)
    for i, sid in enumerate(ids):
        raw = entries.get(sid)
        entry = decode_entry(raw) if raw is not None else None
        if entry is not None and entry.meta is not None and fs.size(log_path(root, sid)) >= entry.end > 0:
            rec = replay_meta(fs, root, sid, report, entry.seq, entry.end, entry.meta, repair=repair)
        else:
            rec = replay_meta(fs, root, sid, report, repair=repair)
        if repair:
            _remove_temp(fs, snapshot_path(root, sid) + ".tmp", report)
        if rec.meta is None:
            if rec.deleted:
                report.unfinished_deletions.append(sid)
                if repair:
                    _remove_folder(fs, session_dir(root, sid))
                continue
            if rec.corrupt is None and rec.seq == 0 and _only_caches(fs, session_dir(root, sid), orphan=False):
                report.unfinished_creations.append(sid)
                if repair:
                    _remove_folder(fs, session_dir(root, sid))
                continue
            meta, corrupt = damaged_meta(sid, rec)
            if rec.corrupt is None:
                report.quarantined.append(corrupt)
            rec = SessionRecovery(meta, rec.seq, rec.end, 0, corrupt, False, rec.first_ts)
        if rec.corrupt is not None:
            damaged[sid] = rec.corrupt
        assert rec.meta is not None
        registry.put(shared_strings(rec.meta, sid, pool), sid, Mark(seq=rec.seq, end=rec.end, meta_seq=rec.meta_seq))
        if callable(progress):
            progress(i + 1, len(ids))
    for sid in orphans:
        folder = session_dir(root, sid)
        kept = fs.kept_folder(folder)
        if kept is not None:  # never removed: its disk may not be mounted yet
            report.orphans.append(f"{sid}: a session folder without {LOG_NAME} that is {kept} (kept: "
                                  f"is the disk holding it mounted?)")
        elif _only_caches(fs, folder, orphan=True):
            if repair:
                _remove_folder(fs, folder)
                report.temp_files.append(folder)
        else:
            report.orphans.append(f"{sid}: a session folder without {LOG_NAME} (kept: "
                                  f"{', '.join(sorted(_listdir(fs, folder))) or 'not a folder'})")
    report.sessions = len(registry)
    report.seconds = time.perf_counter() - t0
    return registry, damaged, report


_TEMP_NAMES = frozenset({SNAPSHOT_NAME + ".tmp", INDEX_NAME + ".tmp"})


def _listdir(fs: FileOps, folder: str) -> list[str]:
    try:
        return fs.listdir(folder)
    except NotADirectoryError:
        return []


def _only_caches(fs: FileOps, folder: str, *, orphan: bool) -> bool:
    """May the folder go? A session folder: when it holds nothing but its
    (empty) log, a snapshot and temp files; a torn or `.corrupt-N` copy means
    the log once had bytes, so it is kept (quarantined). An orphan folder (no
    log): only when it holds nothing but temp files; a snapshot without its
    log may be the last copy of a session and is kept and reported."""
    try:
        names = fs.listdir(folder)
    except NotADirectoryError:
        return False
    allowed = _TEMP_NAMES if orphan else _TEMP_NAMES | {LOG_NAME, SNAPSHOT_NAME}
    return all(n in allowed for n in names)


def _remove_folder(fs: FileOps, folder: str) -> None:
    fs.rmtree(folder)
    fs.fsync_dir(os.path.dirname(folder))


def _remove_temp(fs: FileOps, path: str, report: RecoveryReport) -> None:
    if fs.exists(path):
        fs.unlink(path)
        report.temp_files.append(path)


def load_session_state(fs: FileOps, root: str, sid: str, *, use_snapshot: bool = True
                       ) -> tuple[SessionState, bool]:
    """A session's full state from its snapshot plus the log's tail, or a full
    replay when the snapshot is missing, unreadable or does not fit the log.
    Returns (state, whether the snapshot served). Sync; run it in a thread.
    Reads only the good prefix of a quarantined log."""
    snap = read_snapshot(fs, root, sid) if use_snapshot else None
    if snap is not None and snap.end > 0:
        # The snapshot fits the log only if a line ends just before snap.end
        # (a log cut shorter than the snapshot, by a repair or a lost write,
        # means a full replay) and the tail continues with snap.seq + 1.
        data = read_log(fs, root, sid, offset=snap.end - 1)
        fits = data[:1] == b"\n"
        data = data[1:]
        s = scan(sid, data, base_offset=snap.end, expect_seq=snap.seq + 1)
        if fits and s.corrupt is None and not (s.torn_bytes and not s.records):
            state = snap.to_state()
            for rec, end in with_ends(s.records, data, snap.end):
                state.apply(rec, end)
            return state, True
    data = read_log(fs, root, sid)
    s = scan(sid, data, expect_seq=1)
    return fold_until(s.records, data, s.records[-1].seq if s.records else 0), False


def fold_until(records: list[Record], data: bytes, seq: int, *, base: int = 0) -> SessionState:
    """A session's state as of `seq`, folded from a scan of `data` (a log, or its
    tail from byte `base`), each record paired with the offset just past it."""
    state = SessionState()
    for rec, end in with_ends(records, data, base):
        if rec.seq > seq:
            break
        state.apply(rec, end)
    return state

