"""The write-ahead journal in front of the session logs: frames and recovery.

Theory of operation
-------------------
Per-file durability does not scale: a sync of 10,000 dirty logs costs the
scattered data blocks of every file (100-180 ms here, whatever the call).
So a batch of the group commit (commit.py) is made durable by *one*
sequential file instead:

    <root>/journal/<first batch number, 16 digits>.wal   (segments)

1. The committer encodes the batch as one frame (below), writes it to the
   current segment and fdatasyncs the segment: from here the batch's records
   are durable and may be acknowledged.
2. The log writer then writes each session's new lines to that session's
   `log.jsonl` (page cache, no sync); a reader of a log (load, resume, a
   log stream, a delete) first waits for that session's lines appended
   before it (`flush(session_id)`), so it sees every acknowledged record. The writer lingers
   (logwriter.py): a session's lines wait until its oldest has waited
   `log_write_interval` (1 s), unless a reader wants them; so a tool reading the files of a
   running store (`inspect`, `jq`) may be about a second behind; after a
   crash the next start writes back what the logs lack.
3. A periodic round (commit.py, `journal_sync_interval`) takes the batch
   number B of the last batch written to the logs and closes the current
   segment (between two batches), then syncs the logs' filesystems (syncfs,
   one per device) and, only when that returned 0, unlinks the segments
   holding batches <= B and fsyncs the journal folder. A failed syncfs is
   fatal, as a failed sync always is.

Invariants:
- A frame is `SLJ1`, its batch number (8 bytes), payload length (4), CRC-32
  of the payload (4), then the payload: a msgpack list of entries
  `[session id, first seq, byte offset in the log, lines, born]` (the exact
  bytes appended to the log; seq counts the lines; `born` the ts of the log's
  first line's CRC-32, which tells a log from an earlier one of the same id)
  or a birth marker `[session id, 0, -1, b"", 0]`. Batch numbers only increase, by one per frame,
  and a segment's first frame carries the number in its name. A record is
  acknowledged only after the fdatasync of the segment holding its frame
  (and, for a new segment, of the journal folder naming it).
- The journal holds every record that may not yet be durable in its log: a
  segment is removed only after a syncfs that began after its records were
  written to their logs has returned 0, on a descriptor opened before those
  writes (Linux >= 5.8 reports a writeback error to every descriptor of the
  filesystem opened before it; a descriptor opened after it hears nothing;
  on older kernels, whose syncfs reports nothing, each log is fdatasynced).
- Recovery (`apply_journal`, before anything reads a log or `index.json`):
  read the segments in order, cutting each at its first bad frame, and
  check that each segment starts with the batch after the previous one's
  last. Only what a cut append leaves at the very end of the last segment,
  with no good frame after, is a torn write nobody was told about: a frame
  cut short (its header, or fewer bytes than its stated length), zeros, or
  a frame that reaches the end with its later blocks read as zeros (a size
  made durable before the data: a run of at least 16 zero bytes to the end,
  from a 512-byte boundary; no payload ends so). A full-length frame whose
  checksum fails otherwise (a flipped bit), a missing segment, anything in
  the middle is damage.
  Per session, keep only the entries after its last birth marker and whose
  `born` matches the log's first line (a session deleted and created again
  under the same id: the old one's entries are not its own, even if a
  damaged frame took the marker with it; entries of another `born` that do
  not end in their tombstone are damage: the log's first line may be what
  changed), check they form one chain (seq and offset), and make the log
  hold exactly those bytes from the first entry's offset on, *written by
  this start* even where the log reads back equal: after a failed writeback
  the page cache keeps the page marked clean, so a read shows bytes the
  disk never got (PostgreSQL's "fsyncgate"). Truncate at the first entry's
  offset and write the chain again (fresh blocks: ext4 may keep a failed
  write's extent "unwritten", and an in-place rewrite of it reads back as
  zeros after a reboot); where the journal is damaged and the log has bytes
  past the chain's end (maybe the only copy of records whose frames were
  lost), write it in place instead (the journal is kept aside anyway). Then
  sync through descriptors opened before those writes; repeating this after a cut is safe, the journal is
  untouched until the end. Only then unlink the segments and fsync the
  folder; a sync error leaves the journal for the next start. If anything
  could not be applied (damage in the journal or in a log), the segments
  are kept instead, moved to `journal-damaged-<n>/`, and reported.
- A missing log is a deletion only when the session's journaled records end
  in its tombstone, or a marker follows them: a birth marker (the id made
  again) or the same marker written by `remove()` for a log removed without
  a tombstone (a damaged one). Otherwise the sessions' disk is not there (not
  mounted yet, a dangling symlink): the start changes nothing and refuses
  (JournalUnapplied), keeping the journal. Where the journal is damaged too
  the tombstone may have been in the damaged part: the refusal says so, and
  `sessionlog repair --journal` applies what can be applied and keeps the
  journal aside (`missing_logs="keep"`).
- Replay after a crash is bounded by the round's period plus the log
  writer's linger: at 40,000 records/s and 1 s each, about 80,000 entries
  (16 MB).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from ..checksum import crc32
from ..errors import JournalUnapplied
from ..events import SessionDeleted
from .fsio import SYNCFS_REPORTS_ERRORS, FileOps
from ..ids import is_valid_session_id
from .log import log_path
from ..record import MAX_RECORD_BYTES, RecordError, decode_record

JOURNAL_DIR: Final = "journal"
SEGMENT_SUFFIX: Final = ".wal"
# A segment is closed when it grows past this, besides every sync round.
SEGMENT_BYTES: Final = 64 << 20

_MAGIC: Final = b"SLJ1"
_HEADER: Final = struct.Struct("<4sQII")
_BIRTH: Final = -1

# (session id, first seq, offset, lines, born: the CRC-32 of the log's first line)
Entry = tuple[str, int, int, bytes, int]
_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(list[tuple[str, int, int, bytes, int]]).decode


def journal_dir(root: str) -> str:
    return os.path.join(root, JOURNAL_DIR)


def segment_name(first_batch: int) -> str:
    return f"{first_batch:016d}{SEGMENT_SUFFIX}"


def encode_frame(batch_no: int, entries: list[Entry]) -> bytes:
    payload = _encode(entries)
    return _HEADER.pack(_MAGIC, batch_no, len(payload), crc32(payload)) + payload


def birth(session_id: str) -> Entry:
    return (session_id, 0, _BIRTH, b"", 0)


def born_of(first_line: bytes) -> int:
    """What tells a log from an earlier one of the same id: the CRC-32 of its
    first line (newline included), which holds its creation time."""
    return crc32(first_line)


def log_born(fs: FileOps, path: str) -> int | None:
    """born_of a log's first line; None if it has no whole first line."""
    size = 64 * 1024
    while True:
        head = fs.read_bytes(path, 0, size)
        nl = head.find(b"\n")
        if nl >= 0:
            return born_of(head[:nl + 1])
        if len(head) < size or size > MAX_RECORD_BYTES:
            return None
        size *= 4


def decode_frames(data: bytes, first_batch: int) -> tuple[list[tuple[int, list[Entry]]], int, str | None]:
    """The good frames at the start of a segment's bytes, where they end, and
    why the rest (if any) was not read."""
    frames: list[tuple[int, list[Entry]]] = []
    pos = 0
    want = first_batch
    size = _HEADER.size
    while pos < len(data):
        if len(data) - pos < size:
            return frames, pos, "a torn frame header"
        magic, no, length, crc = _HEADER.unpack_from(data, pos)
        if magic != _MAGIC:
            return frames, pos, "no frame header"
        if no != want:
            return frames, pos, f"batch {no} where {want} was expected"
        body = data[pos + size: pos + size + length]
        if len(body) < length:
            return frames, pos, "a torn frame"
        if crc32(body) != crc:
            return frames, pos, "a frame with a bad checksum"
        try:
            entries = _decode(body)
        except msgspec.DecodeError:
            return frames, pos, "a frame that does not decode"
        frames.append((no, entries))
        pos += size + length
        want += 1
    return frames, pos, None


def list_segments(fs: FileOps, root: str) -> tuple[list[tuple[int, str]], list[str]]:
    """(first batch, path) of each segment in order, and names that are not segments."""
    folder = journal_dir(root)
    segs: list[tuple[int, str]] = []
    other: list[str] = []
    for name in fs.listdir(folder):
        stem = name[: -len(SEGMENT_SUFFIX)]
        if name.endswith(SEGMENT_SUFFIX) and stem.isdigit():
            segs.append((int(stem), os.path.join(folder, name)))
        else:
            other.append(name)
    segs.sort()
    return segs, other


@dataclass
class JournalRecovery:
    """What applying the journal at startup did."""
    segments: int = 0
    frames: int = 0
    records: int = 0               # records written back into logs (the logs lacked them)
    sessions: list[str] = field(default_factory=list)   # logs that were missing journaled records
    rewritten: int = 0             # logs whose journaled bytes this start wrote again and synced
    notes: list[str] = field(default_factory=list)      # torn frames, damage, what could not be applied

    def summary(self) -> str:
        return (f"journal: {self.frames} batches in {self.segments} segments, {self.records} records "
                f"written back into {len(self.sessions)} logs ({self.rewritten} logs rewritten and synced)")


class _Chain:
    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[Entry] = []


def apply_journal(fs: FileOps, root: str, *, missing_logs: Literal["refuse", "keep"] = "refuse") -> JournalRecovery:
    """Bring every log up to the journal, make the logs durable, remove the
    journal (sync: run it in a worker thread, with the root's lock held).

    Raises JournalUnapplied, changing nothing, when a journaled session's log
    is missing and its records do not end in its deletion (a disk not
    mounted); with `missing_logs="keep"` those are reported and the journal
    kept aside instead (`sessionlog repair --journal`)."""
    rep = JournalRecovery()
    segs, other = list_segments(fs, root)
    for name in other:
        rep.notes.append(f"journal: {name!r} is not a journal segment (left alone)")
    if not segs:
        return rep
    rep.segments = len(segs)
    chains, damaged = _read_segments(fs, segs, rep)
    plans: list[tuple[str, str, list[Entry]]] = []
    missing: list[str] = []
    for sid, chain in chains.items():
        if not chain.entries:
            continue
        if not is_valid_session_id(sid):
            rep.notes.append(f"journal: entries for an invalid session id {sid!r} ignored")
            continue
        path = log_path(root, sid)
        if not fs.exists(path):
            if not _ends_deleted(chain.entries[-1]):
                missing.append(path)
            continue  # deleted: its tombstone is its last journaled record (see the header)
        born = log_born(fs, path)
        if born is None:
            rep.notes.append(f"journal: the log of {sid} has no readable first record; its "
                             f"{len(chain.entries)} journaled writes are not applied")
            damaged = True
            continue
        mine = [e for e in chain.entries if e[4] == born]
        if mine:  # (none: the entries are an earlier session's of this id, deleted)
            plans.append((sid, path, mine))
        earlier: dict[int, Entry] = {e[4]: e for e in chain.entries if e[4] != born}  # (the last of each)
        if any(not _ends_deleted(last) for last in earlier.values()):
            damaged = True
            rep.notes.append(f"journal: journaled writes of {sid} match neither its log's first record nor a "
                             f"deleted session's (a damaged first record?); not applied")
    if missing and missing_logs == "refuse":
        raise JournalUnapplied(
            f"the journal holds acknowledged records of {len(missing)} session(s) whose log is missing "
            f"({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''}): is the disk holding them "
            f"mounted? Nothing was changed; the journal is kept for the next start"
            + ("" if not damaged else
               " (the journal is damaged too, so their tombstones may have been in the damaged part: "
               "`sessionlog repair --journal` applies the rest and keeps the journal aside)"))
    for path in missing:
        damaged = True
        rep.notes.append(f"journal: {path} is missing and its journaled records do not end in a deletion "
                         f"(not applied)")
    sync = _LogSync(fs)
    try:
        for sid, path, mine in plans:
            notes = len(rep.notes)
            n = _apply_chain(fs, path, sid, mine, rep, sync, kept=damaged)
            damaged = damaged or len(rep.notes) > notes
            if n:
                rep.records += n
                rep.sessions.append(sid)
        sync.sync()  # raises on any writeback error since before the first write: the journal stays
    finally:
        sync.close()
    if damaged:
        keep = _keep_damaged(fs, root, segs)
        rep.notes.append(f"journal: kept in {keep} (something in it could not be applied)")
    else:
        for _, path in segs:
            fs.unlink(path)
    fs.fsync_dir(journal_dir(root))
    return rep


def _read_segments(fs: FileOps, segs: list[tuple[int, str]], rep: JournalRecovery) -> tuple[dict[str, _Chain], bool]:
    """Each session's journaled entries after its last birth marker, in order;
    and whether anything acknowledged may be lost (damage, a missing segment)."""
    chains: dict[str, _Chain] = {}
    damaged = False
    want: int | None = None  # the batch number the next segment must start with
    for i, (first, path) in enumerate(segs):
        name = os.path.basename(path)
        if want is not None and first != want:
            damaged = True
            rep.notes.append(f"journal: {name}: starts at batch {first} where {want} was expected "
                             f"(damage: batches {want} to {first - 1} are missing, a segment is gone)")
        data = fs.read_bytes(path)
        frames, end, why = decode_frames(data, first)
        if why is not None:
            # A torn last write has nothing after it; anything else is damage
            # (the frames after it were acknowledged and are lost here).
            torn = i == len(segs) - 1 and _torn_tail(data, end, first + len(frames))
            damaged = damaged or not torn
            rep.notes.append(f"journal: {name}: {why} at byte {end}"
                             + (" (a torn last write: nothing in it was acknowledged)" if torn else
                                " (damage: the records after it in this segment are lost)"))
            want = None  # (frames are lost: where the next segment starts cannot be checked)
        else:
            want = first + len(frames)
        for _, entries in frames:
            rep.frames += 1
            for e in entries:
                if e[2] == _BIRTH:
                    chains.pop(e[0], None)
                    chains[e[0]] = _Chain()
                else:
                    chains.setdefault(e[0], _Chain()).entries.append(e)
    return chains, damaged


def _ends_deleted(last: Entry) -> bool:
    """Do a session's journaled records end in its tombstone (its log removed
    after it was durable)?"""
    lines = last[3].rstrip(b"\n")
    try:
        rec = decode_record(lines[lines.rfind(b"\n") + 1:])
    except RecordError:
        return False
    return isinstance(rec.event, SessionDeleted)


def _torn_tail(data: bytes, end: int, want: int) -> bool:
    """Is what follows the last good frame a torn last write (nothing in it was
    acknowledged)? Only a frame cut short (its header, or fewer bytes than its
    stated length), zeros, or a frame whose later blocks read as zeros (a
    size that went durable before the data), with no good frame after it. A
    frame whose stated length is all there but whose checksum fails
    otherwise is ambiguous (a flipped bit in an acknowledged frame): damage."""
    rest = len(data) - end
    if data.count(0, end) == rest:
        return True
    if rest >= _HEADER.size:
        magic, _, length, _ = _HEADER.unpack_from(data, end)
        if magic != _MAGIC:
            return False
        if rest - _HEADER.size >= length:  # all there: a flipped bit, unless its later blocks are zeros
            return rest - _HEADER.size == length and _zeros_from_a_block(data, end + _HEADER.size)
    return not _good_frame_after(data, end, want)


def _zeros_from_a_block(data: bytes, body: int) -> bool:
    """Do the frame's last bytes read as zeros from a 512-byte boundary on (at
    least 16 of them): blocks whose data never reached the disk behind a size
    that did. No payload ends in 16 zero bytes (lines are JSON text)."""
    z = len(data.rstrip(b"\0"))
    aligned = max(-(-z // 512) * 512, body)
    return len(data) - aligned >= 16


def _good_frame_after(data: bytes, end: int, want: int) -> bool:
    """Is there a whole frame with a good checksum after `end` (batch `want`
    or a later one)? The magic alone may be in a payload: a candidate's batch
    number and stated length are checked before its checksum, on a view, so
    a payload full of magics costs one pass, not one per magic."""
    view = memoryview(data)
    most = want + (len(data) - end) // _HEADER.size
    pos = data.find(_MAGIC, end + 1)
    while pos >= 0:
        if len(data) - pos >= _HEADER.size:
            _, no, length, crc = _HEADER.unpack_from(data, pos)
            body = pos + _HEADER.size
            if (want <= no <= most and body + length <= len(data)
                    and crc32(view[body: body + length]) == crc):
                return True
        pos = data.find(_MAGIC, pos + 1)
    return False


def _keep_damaged(fs: FileOps, root: str, segs: list[tuple[int, str]]) -> str:
    n = 1
    while fs.exists(os.path.join(root, f"{JOURNAL_DIR}-damaged-{n}")):
        n += 1
    folder = os.path.join(root, f"{JOURNAL_DIR}-damaged-{n}")
    fs.mkdir(folder)
    fs.fsync_dir(root)
    for _, path in segs:
        fs.rename(path, os.path.join(folder, os.path.basename(path)))
    fs.fsync_dir(folder)
    return folder


def _apply_chain(fs: FileOps, path: str, sid: str, entries: list[Entry], rep: JournalRecovery,
                 sync: _LogSync, *, kept: bool) -> int:
    """Make the log hold the chain's bytes from its first offset, written by
    this start whether or not the log seems to hold them already; the number
    of records the log lacked. `kept`: the journal is damaged (it will be
    kept aside, not removed).

    Why write what reads back equal: after a failed writeback the kernel
    keeps the page, marked clean, so a read returns the bytes that never
    reached the disk; and the error is reported once, to a descriptor that
    was open when it happened. Only bytes written and synced by this process,
    through descriptors opened before the writes, are known to be on disk."""
    size = fs.size(path)
    first = entries[0][2]
    if size < first:
        rep.notes.append(f"journal: the log of {sid} holds {size} bytes, fewer than the {first} its "
                         f"journaled records follow (synced data is missing; nothing applied)")
        return 0
    if first > 0 and fs.read_bytes(path, first - 1, 1) != b"\n":
        rep.notes.append(f"journal: the log of {sid} has no line end at byte {first - 1}, where its "
                         f"journaled records start (nothing applied)")
        return 0
    # the part of the chain that is one run of seqs and offsets
    run = [entries[0]]
    for e in entries[1:]:
        prev = run[-1]
        if e[2] != prev[2] + len(prev[3]) or e[1] != prev[1] + prev[3].count(b"\n"):
            rep.notes.append(f"journal: the records of {sid} break off at seq {prev[1]}: later ones are "
                             f"lost (damage in the journal)")
            break
        run.append(e)
    journaled = b"".join(e[3] for e in run)
    held = fs.read_bytes(path, first)  # the log from the chain's first offset (one read)
    have, tail = held[:len(journaled)], held[len(journaled):]  # tail: past the chain's end
    lacked = 0
    pos = 0
    for e in run:
        n = len(e[3])
        if lacked or have[pos: pos + n] != e[3]:
            lacked += e[3].count(b"\n")
        pos += n
    # How: truncate at the chain's first offset and write it again (with the
    # bytes after it where the log matched it all, for the torn-tail repair;
    # after a difference they go, as a torn tail would).
    # Not in place: after a failed writeback ext4 may keep the extent
    # "unwritten" on disk, and a rewrite of the same blocks is written but
    # reads back as zeros after a reboot (seen on the test's failing disk);
    # freed and allocated again, the blocks are written for real. Where the
    # journal is damaged, though, bytes past the chain's end may be the only
    # copy of records whose frames it lost, and a cut between the truncate and
    # the write would take them: there the chain is written in place, and the
    # journal is kept aside whatever the sync says.
    sync.watch(os.path.dirname(path))
    if tail and (kept or len(run) < len(entries)):
        fd = fs.open_write(path)
        try:
            fs.pwrite(fd, journaled, first)
            sync.written(fd)
        finally:
            fs.close(fd)
    else:
        fs.truncate(path, first)
        fd = fs.open_append(path)
        try:
            fs.write(fd, journaled + (b"" if lacked else tail))
            sync.written(fd)
        finally:
            fs.close(fd)
    rep.rewritten += 1
    return lacked


class _LogSync:
    """Makes the logs apply_journal writes durable, and hears of any writeback
    error of those writes: with one syncfs per filesystem on a folder
    descriptor opened before the first write there (Linux >= 5.8 reports an
    error to every descriptor opened before it), else an fsync of each log
    through the descriptor that wrote it."""

    def __init__(self, fs: FileOps) -> None:
        self.fs = fs
        self.dev_fds: dict[int, int] = {}

    def watch(self, folder: str) -> None:
        """Before a write into `folder`'s filesystem."""
        if not SYNCFS_REPORTS_ERRORS:
            return
        fd = self.fs.open_dir(folder)
        dev = self.fs.device(fd)
        if dev in self.dev_fds:
            self.fs.close(fd)
        else:
            self.dev_fds[dev] = fd

    def written(self, fd: int) -> None:
        if not SYNCFS_REPORTS_ERRORS:
            self.fs.fsync(fd)

    def sync(self) -> None:
        for fd in self.dev_fds.values():
            self.fs.syncfs(fd)

    def close(self) -> None:
        for fd in self.dev_fds.values():
            self.fs.close(fd)
        self.dev_fds.clear()
