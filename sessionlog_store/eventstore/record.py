"""Record framing: one event per line, with the store's envelope and a checksum.

    {"crc":"1a2b3c4d","seq":7,"ts":1764425600.25,"type":"p",...}\n

`crc` is the CRC-32 of everything after `{"crc":"xxxxxxxx",` up to (not
including) the newline. It sits at a fixed place at the start, so checking it
needs no re-encode. Every line stays a JSON object (the log is readable by
`jq`). Pure: no I/O here.
"""
from __future__ import annotations

import sys
import time
from array import array
from collections.abc import Callable, Iterator
from itertools import compress, repeat
from operator import attrgetter, itemgetter, not_
from typing import Any, Final, NamedTuple

import msgspec

from .checksum import crc32
from .errors import CorruptRecord, RecordTooLarge
from .events import EVENT_DECODER, EVENT_ENCODER, Event, MessageProgress, MessageProgressQ, MessageProgressV1, on_disk

# A log line longer than this is refused, so replay and the tail reader stay
# bounded in memory. A finalize carries a whole reply; 4 MiB holds a long
# reply with its tree many times over (bench/ records are well under 1 KiB).
MAX_RECORD_BYTES: Final = 4 * 1024 * 1024

_CRC_OPEN: Final = b'{"crc":"'
_HEADER_LEN: Final = 18  # len('{"crc":"xxxxxxxx",')


class Record(NamedTuple):
    """One decoded line: the envelope (seq, ts) and its event."""
    seq: int
    ts: float
    event: Event


class RecordError(ValueError):
    """A line that is not a valid record; `str()` says why."""


def progress_time() -> float:
    """A progress record's `ts`: the clock to the millisecond (issue 29: four
    bytes less a record of the most frequent kind; it orders nothing, only
    a running message's last update). Other records keep the full clock:
    their ts orders the session list."""
    return round(time.time(), 3)


def encode_record(seq: int, ts: float, event: Event) -> bytes:
    """Encode one record as a complete line, newline included."""
    return encode_line(seq, b"%r" % ts, event)  # %r of a float: its repr


def encode_line(seq: int, ts_repr: bytes, event: Event) -> bytes:
    """encode_record with the timestamp's repr made once (a batch of records
    at one clock reading: the repr of a float costs more than the event's
    encoding)."""
    body = EVENT_ENCODER.encode(on_disk(event) if type(event) is MessageProgress else event)
    rest = b'"seq":%d,"ts":%s,%s' % (seq, ts_repr, body[1:])
    line = b'{"crc":"%08x",%s\n' % (crc32(rest), rest)
    if len(line) > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"record of {len(line)} bytes is over the {MAX_RECORD_BYTES}-byte limit")
    return line


class _Envelope(msgspec.Struct):
    seq: int
    ts: float


_ENVELOPE: Final = msgspec.json.Decoder(_Envelope)


def _checked_envelope(line: bytes) -> _Envelope:
    if not line.startswith(_CRC_OPEN) or line[16:18] != b'",':
        raise RecordError("no checksum header")
    try:
        crc = int(line[8:16], 16)
    except ValueError:
        raise RecordError("checksum is not hex") from None
    if crc32(memoryview(line)[_HEADER_LEN:]) != crc:
        raise RecordError("checksum mismatch")
    try:
        return _ENVELOPE.decode(line)
    except msgspec.ValidationError as e:
        raise RecordError(f"invalid record: {e}") from None
    except msgspec.DecodeError as e:
        raise RecordError(f"not JSON: {e}") from None


def decode_record(line: bytes) -> Record:
    """Decode one line (with or without its newline). Raises RecordError.

    The checksum is checked first (a flipped bit is caught before any parse);
    then msgspec reads the envelope and the event from the same bytes, each
    decoder skipping the other's keys."""
    if line.endswith(b"\n"):
        line = line[:-1]
    env = _checked_envelope(line)
    try:
        event = EVENT_DECODER.decode(line)
    except msgspec.ValidationError as e:
        raise RecordError(f"invalid record: {e}") from None
    except msgspec.DecodeError as e:
        raise RecordError(f"not JSON: {e}") from None
    if type(event) in _UPGRADED:
        event = event.upgrade()  # type: ignore[union-attr]
    return Record(env.seq, env.ts, event)


# A stand-in for the events a registry-only replay does not need to read.
PROGRESS_STANDIN: Final = MessageProgress(msg_id="")
_TYPE_KEY: Final = b',"type":"'
_PROGRESS_TYPES: Final = frozenset({"p", "q", "message_progress"})  # (every spelling of a progress record)
_PROGRESS_TAGS: Final = tuple(t.encode() + b'"' for t in _PROGRESS_TYPES)
_UPGRADED: Final = (MessageProgressV1, MessageProgressQ)  # (read as a MessageProgress)


def decode_record_for_meta(line: bytes) -> Record:
    """Like decode_record, but a `message_progress` record (which no meta or
    registry fold reads) is checked by its checksum and envelope only and
    returned with PROGRESS_STANDIN as its event. The `type` key is the first
    string-valued key after `seq` and `ts`, so finding it is exact."""
    if line.endswith(b"\n"):
        line = line[:-1]
    t = line.find(_TYPE_KEY, _HEADER_LEN)
    if t > 0 and line.startswith(_PROGRESS_TAGS, t + len(_TYPE_KEY)):
        env = _checked_envelope(line)
        return Record(env.seq, env.ts, PROGRESS_STANDIN)
    return decode_record(line)


# -- a whole log's lines at once (the replay path) -----------------------------

_ENVELOPE_OF: Final = _ENVELOPE.decode
_BODY: Final = itemgetter(slice(_HEADER_LEN, None))
_SEQ: Final = attrgetter("seq")
_TS: Final = attrgetter("ts")
_TYPE: Final = attrgetter("type")


class _TaggedEnvelope(msgspec.Struct):
    seq: int
    ts: float
    type: str


_TAGGED_ENVELOPE_OF: Final = msgspec.json.Decoder(_TaggedEnvelope).decode


def decode_lines(lines: list[bytes], *, meta_only: bool = False) -> list[Record] | None:
    """Decode whole lines (without their newlines), every per-line step in C
    (map over the lines), after checking every checksum; with `meta_only`
    progress records are skipped as in decode_record_for_meta. None if any
    line is not a good record: the caller then decodes line by line to find
    and report it (and that path also reads a checksum written in capitals).

    Each line is decoded on its own (msgspec refuses anything after a line's
    one JSON value: a line is one record, exactly). Issue 29: replay was a
    Python loop a line, then one pass of msgspec over all the lines joined
    as an array, which copied the log three times and parsed it once more
    to check that each value was one line (~0.7 us a record of the ~2.3)."""
    if not lines:
        return []
    envs: list[Any]
    events: list[Any]
    if meta_only:
        got = _decode_for_meta(lines)
        if got is None:
            return None
        envs, kept, decoded = got
        events = [PROGRESS_STANDIN] * len(envs)
        for i, ev in zip(compress(range(len(envs)), kept), decoded):
            events[i] = ev
    else:
        if not _checksums_hold(lines):
            return None
        try:
            envs = list(map(_ENVELOPE_OF, lines))
            events = [ev.upgrade() if type(ev) in _UPGRADED else ev  # type: ignore[union-attr]
                      for ev in map(EVENT_DECODER.decode, lines)]
        except (msgspec.ValidationError, msgspec.DecodeError):
            return None
    # (tuple.__new__ over the zip: Records made in C, not by NamedTuple's Python __new__)
    return list(map(tuple.__new__, repeat(Record), zip(map(_SEQ, envs), map(_TS, envs), events)))


def _checksums_hold(lines: list[bytes]) -> bool:
    """Each line's header as it must read: `{"crc":"`, the CRC-32 of the rest
    of the line in 8 lowercase hex digits, `",`. In C: the CRCs made one
    string of hex (an array of big-endian uint32), compared with the lines'
    hex digits joined (each exactly 8 bytes: a line shorter than its header
    fails the `",` check), and the fixed parts compared as lists."""
    crcs = array("I", map(crc32, map(_BODY, lines)))
    if _LITTLE:
        crcs.byteswap()
    n = len(lines)
    return (crcs.tobytes().hex().encode() == b"".join(map(_HEX, lines))
            and list(map(_OPEN, lines)) == [_CRC_OPEN] * n and list(map(_CLOSE, lines)) == [b'",'] * n)


_HEX: Final = itemgetter(slice(8, 16))
_OPEN: Final = itemgetter(slice(0, 8))
_CLOSE: Final = itemgetter(slice(16, 18))
_LITTLE: Final = sys.byteorder == "little"
assert array("I").itemsize == 4


def _decode_for_meta(lines: list[bytes]) -> tuple[list[_TaggedEnvelope], list[bool], list[Event]] | None:
    """Checked lines' envelopes with their types, which lines a meta fold
    reads (not progress) and their events (only those lines are decoded);
    None if any line is not a good record. Every step a map in C."""
    if not _checksums_hold(lines):
        return None
    try:
        heads = list(map(_TAGGED_ENVELOPE_OF, lines))
        kept = list(map(not_, map(_PROGRESS_TYPES.__contains__, map(_TYPE, heads))))
        # (no upgrade: the upgraded types are progress, never kept)
        events = list(map(EVENT_DECODER.decode, compress(lines, kept)))
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return heads, kept, events


assert {t.__struct_config__.tag for t in _UPGRADED} <= _PROGRESS_TYPES


# -- scanning a log's bytes (any backend's: a file, a stream subject's messages) --

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
    # The common case, a log of good records: all of them decoded without a Python loop a line.
    fast = decode_lines(lines[:last], meta_only=meta_only) if last else []
    # (seqs consecutive from expect_seq, or without it from the first one: as the line-by-line path checks)
    first = expect_seq if expect_seq is not None else fast[0].seq if fast else 0
    if fast is not None and list(map(_SEQ, fast)) == list(range(first, first + len(fast))):
        pos = len(data) - len(lines[last])
        return Scan(fast, base_offset + pos, len(data) - pos, None)
    return _scan_by_line(session_id, data, lines[:last], decode, base_offset, base_line, expect_seq)


def _scan_by_line(session_id: str, data: bytes, lines: list[bytes], decode: Callable[[bytes], Record],
                  base_offset: int, base_line: int, expect_seq: int | None) -> Scan:
    """scan's path for a log the fast path cannot vouch for: a line at a
    time, to find and report the first damaged record (`lines`: data's
    lines that end with a newline)."""
    records: list[Record] = []
    append = records.append
    pos = 0
    line_no = base_line
    for line in lines:
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


class MetaScan(NamedTuple):
    """What scan_meta found: a Scan whose `records` are only the records a
    meta fold reads (progress records are checked and counted, not kept)."""
    records: list[Record]    # the good records that are not progress, in order
    total: int               # every good record
    first_ts: float          # the first good record's ts (0.0: none)
    last_seq: int            # the last good record's seq (expect_seq - 1: none)
    good_end: int
    torn_bytes: int
    corrupt: CorruptRecord | None


def scan_meta(session_id: str, data: bytes, *, expect_seq: int, base_offset: int = 0,
              base_line: int = 0) -> MetaScan:
    """scan(meta_only=True) for a fold of the meta (the registry's replay and
    the check of a log's prefix): the same checks, but no Record a progress
    record (most of a log; issue 29, replay)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # no newline: empty, or an interrupted write
    got = _decode_for_meta(lines)
    if got is not None:
        heads, kept, events = got
        if list(map(_SEQ, heads)) == list(range(expect_seq, expect_seq + len(heads))):
            ours = list(compress(heads, kept))
            records = list(map(tuple.__new__, repeat(Record), zip(map(_SEQ, ours), map(_TS, ours), events)))
            pos = len(data) - len(tail)
            return MetaScan(records, len(heads), heads[0].ts if heads else 0.0, expect_seq + len(heads) - 1,
                            base_offset + pos, len(data) - pos, None)
    # (damage, or a seq out of order: found and reported line by line, without the fast path again)
    s = _scan_by_line(session_id, data, lines, decode_record_for_meta, base_offset, base_line, expect_seq)
    return MetaScan([r for r in s.records if type(r.event) is not MessageProgress],  # (PROGRESS_STANDIN is one)
                    len(s.records),
                    s.records[0].ts if s.records else 0.0, s.records[-1].seq if s.records else expect_seq - 1,
                    s.good_end, s.torn_bytes, s.corrupt)


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


def with_ends(records: list[Record], data: bytes, base: int) -> Iterator[tuple[Record, int]]:
    """Pair each record of a scan of `data` (lines from byte `base` of a log)
    with the offset just past its line."""
    pos = 0
    for rec in records:
        pos = data.index(b"\n", pos) + 1
        yield rec, base + pos
