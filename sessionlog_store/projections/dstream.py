"""A generic durable stream (the Durable Streams protocol's streams an app
creates under /v1/stream/: docs/HTTP.md), sans I/O: its state folded from
its log's records, its offsets, and the protocol's decisions on an append
(content types, JSON mode, idempotent producers, Stream-Seq, closure).

A stream is a list of units, one per append (a POST's body; in JSON mode
the body's messages, flattened one level and joined by commas). An offset
is a position: the units' lengths, each plus one, before it, written as the
protocol's tools expect (`0000000000000000_0000000000000042`: sortable,
never `-1` or `now`). A fork starts with its source's units up to its fork
offset (shared, not copied: the bytes are immutable) and, with a sub-offset,
a first unit of its own holding the part of the next one it inherits.
"""
from __future__ import annotations

import hashlib
import math
import re
from bisect import bisect_right
from datetime import datetime
from dataclasses import dataclass, field
from typing import Final, Literal, NamedTuple

import msgspec

from sessionlog_store.eventstore.events import StreamAppended, StreamOpened, StreamSoftDeleted
from sessionlog_store.eventstore.record import Record

ZERO: Final = "0000000000000000_0000000000000000"
_OFFSET: Final = re.compile(r"^(\d{1,16})_(\d{1,16})$")
_INT: Final = re.compile(r"^(0|[1-9]\d{0,15})$")
MAX_SAFE: Final = 2 ** 53 - 1
# What a unit costs in memory beyond its bytes (its list entries, its end):
# the quota counts it, so many tiny appends or forks of them are not free.
UNIT_COST: Final = 64
JSON: Final = "application/json"
_RAWS: Final = msgspec.json.Decoder(list[msgspec.Raw])
_RAW: Final = msgspec.json.Decoder(msgspec.Raw)


class Refused(Exception):
    """An append or create the protocol refuses: its status, its code, and
    the headers the answer carries (Stream-Closed, Producer-Epoch, ...)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def encode_offset(pos: int) -> str:
    return f"{0:016d}_{pos:016d}"


def parse_offset(text: str) -> int | None:
    """The position an offset names, or None for what is not an offset."""
    m = _OFFSET.match(text)
    return int(m[2]) if m else None


def parse_int(text: str | None) -> int | None:
    """A protocol integer (no sign, no leading zeros, at most 2^53-1), or None."""
    if text is None or not _INT.match(text):
        return None
    n = int(text)
    return n if n <= MAX_SAFE else None


def media_type(content_type: str | None) -> str:
    """The content type without its parameters, lower case ("" for none)."""
    return (content_type or "").split(";")[0].strip().lower()


def is_json(content_type: str) -> bool:
    return media_type(content_type) == JSON


def is_text(content_type: str) -> bool:
    """Whether SSE carries it as text (else base64)."""
    t = media_type(content_type)
    return t.startswith("text/") or t == JSON


def json_unit(body: bytes, *, create: bool = False) -> bytes:
    """A JSON-mode body as one unit: its messages (an array's elements, one
    level) joined by commas. An empty array is refused, except at creation
    (where it creates an empty stream: b"")."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "bad_json", "the body is not UTF-8 (JSON text is)") from None
    try:
        value = bytes(_RAW.decode(body))  # (checked, and kept as it was written)
        if not value.startswith(b"["):
            return value
        items = _RAWS.decode(value)
    except msgspec.DecodeError:
        raise Refused(400, "bad_json", "the body is not JSON") from None
    if not items:
        if create:
            return b""
        raise Refused(400, "empty_array", "an empty JSON array appends nothing")
    return b",".join(bytes(v) for v in items)


def json_messages(unit: bytes) -> list[bytes]:
    return [bytes(r) for r in _RAWS.decode(b"[" + unit + b"]")]


ProducerVerdict = Literal["accept", "duplicate"]


@dataclass
class Producer:
    epoch: int
    seq: int


@dataclass
class StreamState:
    """One stream, as its records and its source make it."""
    log_id: str
    name: str
    owner: str
    content_type: str
    ttl: int | None = None
    expires_at: str | None = None
    created_at: float = 0.0
    forked_from: str | None = None   # the source's log id
    fork_offset: int = 0
    fork_sub: int = 0
    units: list[bytes] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # each unit's end offset
    durable: int = 0          # how many units readers may see (their records are durable)
    closed: bool = False      # no append is taken
    ended: bool = False       # readers are told it is closed (its close is durable)
    closed_by: tuple[str, int, int] | None = None
    producers: dict[str, Producer] = field(default_factory=dict)
    stream_seq: str | None = None
    soft_deleted: bool = False
    refcount: int = 0          # forks reading from it
    own_bytes: int = 0         # what its own appends hold
    cost: int = 0              # what it holds in memory, its share of its source's included (the quota's measure)

    @classmethod
    def opened(cls, log_id: str, ev: StreamOpened) -> StreamState:
        return cls(log_id=log_id, name=ev.name, owner=ev.owner, content_type=ev.content_type, ttl=ev.ttl,
                   expires_at=ev.expires_at, created_at=ev.created_at, forked_from=ev.forked_from,
                   fork_offset=ev.fork_offset, fork_sub=ev.fork_sub)

    @property
    def tail(self) -> int:
        return self.ends[-1] if self.ends else self.fork_offset

    @property
    def visible_tail(self) -> int:
        return self.ends[self.durable - 1] if self.durable else self.fork_offset

    @property
    def json(self) -> bool:
        return is_json(self.content_type)

    def inherit(self, source: StreamState) -> None:
        """A fork's start: the source's units before the fork offset (its
        own units, from its records, follow)."""
        n = bisect_right(source.ends, self.fork_offset)
        self.units[:0] = source.units[:n]
        self.ends[:0] = source.ends[:n]
        self.durable += n
        self.cost += sum(len(u) for u in self.units[:n]) + UNIT_COST * n

    def add(self, data: bytes) -> None:
        if data:
            self.units.append(data)
            self.ends.append(self.tail + len(data) + 1)
            self.own_bytes += len(data)
            self.cost += len(data) + UNIT_COST

    @classmethod
    def folded(cls, log_id: str, opened: StreamOpened, records: list[Record],
               source: StreamState | None) -> StreamState:
        """A stream folded from its log's records (`opened`: the first's
        event; the rest follow it), its source's units inherited; every unit
        is durable (the log holds it)."""
        st = cls.opened(log_id, opened)
        if source is not None and st.forked_from is not None:
            st.inherit(source)
        for rec in records[1:]:
            st.apply(rec)
        st.durable, st.ended = len(st.units), st.closed
        return st

    def refold(self, opened: StreamOpened, records: list[Record], source: StreamState | None) -> None:
        """Fold the stream again from its records as they now stand (another
        worker appended first: what this one applied of its own is void),
        in place (readers hold this object)."""
        fresh = StreamState.folded(self.log_id, opened, records, source)
        fresh.refcount = self.refcount
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))

    def apply(self, rec: Record) -> None:
        """Fold one of the stream's records (after the first, StreamOpened)."""
        ev = rec.event
        if isinstance(ev, StreamAppended):
            self.add(ev.data)
            if ev.producer is not None:
                self.producers[ev.producer] = Producer(ev.epoch, ev.pseq)
            if ev.stream_seq is not None:
                self.stream_seq = ev.stream_seq
            if ev.close:
                self.closed = True
                self.closed_by = (ev.producer, ev.epoch, ev.pseq) if ev.producer is not None else None
        elif isinstance(ev, StreamSoftDeleted):
            self.soft_deleted = True

    def span(self, start: int, limit: int) -> tuple[int, int]:
        """The visible units after position `start` (at least one, then up to
        `limit` bytes in all), as indexes [i, j) into `units` and `ends`; they
        reach the visible tail when j == durable."""
        i = j = bisect_right(self.ends, start, 0, self.durable)
        size = 0
        while j < self.durable and (j == i or size + len(self.units[j]) <= limit):
            size += len(self.units[j])
            j += 1
        return i, j

    def end_of(self, i: int, j: int) -> int:
        """The offset after units [i, j) (the visible tail when there are none)."""
        return self.ends[j - 1] if j > i else self.visible_tail

    def body(self, units: list[bytes]) -> bytes:
        """What a read answers for these units (JSON mode: one array)."""
        if self.json:
            return b"[" + b",".join(units) + b"]"
        return b"".join(units)

    def sub_offset_unit(self, offset: int, sub: int) -> bytes:
        """What a fork at (offset, sub) inherits of the unit after `offset`."""
        i = bisect_right(self.ends, offset, 0, self.durable)
        if i >= self.durable:
            raise Refused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset: no data past Stream-Fork-Offset")
        unit = self.units[i]
        if self.json:
            msgs = json_messages(unit)
            if sub > len(msgs):
                raise Refused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset: past the next append's messages")
            return b",".join(msgs[:sub])
        if sub > len(unit):
            raise Refused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset: past the next append's bytes")
        return unit[:sub]

    def made_alike(self, content_type: str, *, ttl: int | None, expires_at: str | None, closed: bool,
                   source: StreamState | None, fork_offset: int | None, fork_sub: int) -> bool:
        """Whether a creation asking for this finds this stream (an
        idempotent PUT), rather than a 409."""
        return (media_type(self.content_type) == media_type(content_type) and self.ttl == ttl
                and self.expires_at == expires_at and self.closed == closed
                and self.forked_from == (source.log_id if source is not None else None)
                and (fork_offset is None or self.fork_offset == fork_offset) and self.fork_sub == fork_sub)

    def check_producer(self, pid: str, epoch: int, seq: int) -> ProducerVerdict:
        """The protocol's producer rules (section 5.2.1): accept, a duplicate,
        or Refused (403 stale epoch, 400 a new epoch not at 0, 409 a gap)."""
        state = self.producers.get(pid)
        if state is None:
            if seq != 0:
                raise Refused(409, "producer_seq_gap", f"expected Producer-Seq 0, got {seq}",
                              {"Producer-Expected-Seq": "0", "Producer-Received-Seq": str(seq)})
            return "accept"
        if epoch < state.epoch:
            raise Refused(403, "stale_epoch", f"Producer-Epoch {epoch} is stale (now {state.epoch})",
                          {"Producer-Epoch": str(state.epoch)})
        if epoch > state.epoch:
            if seq != 0:
                raise Refused(400, "bad_producer", "a new Producer-Epoch starts at Producer-Seq 0")
            return "accept"
        if seq <= state.seq:
            return "duplicate"
        if seq != state.seq + 1:
            raise Refused(409, "producer_seq_gap", f"expected Producer-Seq {state.seq + 1}, got {seq}",
                          {"Producer-Expected-Seq": str(state.seq + 1), "Producer-Received-Seq": str(seq)})
        return "accept"


class Creation(NamedTuple):
    opened: StreamOpened
    events: list[StreamOpened | StreamAppended]  # the log's first records
    size: int  # the most the stream holds at its creation (the quota's measure)


def creation(owner: str, name: str, content_type: str, *, ttl: int | None, expires_at: str | None, closed: bool,
             data: bytes, source: StreamState | None, fork_offset: int | None, fork_sub: int,
             now: float) -> Creation:
    """What a stream's creation writes (a fork: at `fork_offset`, default
    its source's end, with `fork_sub` of the next unit), or Refused 400
    bad_fork_offset."""
    start = 0
    prefix = b""
    if source is not None:
        start = source.visible_tail if fork_offset is None else fork_offset
        if start > source.visible_tail:
            raise Refused(400, "bad_fork_offset", "Stream-Fork-Offset is beyond the source's end")
        if start and start not in source.ends[:source.durable]:
            raise Refused(400, "bad_fork_offset", "Stream-Fork-Offset is not an offset of the source")
        if fork_sub:
            prefix = source.sub_offset_unit(start, fork_sub)
    unit = json_unit(data, create=True) if data and is_json(content_type) else data
    inherited = 0
    if source is not None:
        n = bisect_right(source.ends, start, 0, source.durable)
        inherited = sum(len(u) for u in source.units[:n]) + UNIT_COST * n
    opened = StreamOpened(name=name, owner=owner, content_type=content_type, ttl=ttl, expires_at=expires_at,
                          created_at=now, forked_from=source.log_id if source else None,
                          fork_offset=start, fork_sub=fork_sub,
                          source_created=source.created_at if source is not None else None)
    events: list[StreamOpened | StreamAppended] = [opened]
    if prefix:
        events.append(StreamAppended(data=prefix))
    if unit or closed:
        events.append(StreamAppended(data=unit, close=closed))
    return Creation(opened, events, len(unit) + len(prefix) + 2 * UNIT_COST + inherited)


def expiry_of(state: StreamState, last_access: float, *, shared: bool = False) -> float:
    """When the stream expires (time.time()), math.inf for never. `shared`:
    workers share the stream; another's reads reach this one as a touch
    written once a quarter of the TTL has passed since the last one, so a
    TTL runs a quarter and 2 s longer (a stream expires late, never early)."""
    at = math.inf
    if state.expires_at is not None:
        try:
            at = datetime.fromisoformat(state.expires_at.replace("Z", "+00:00")).timestamp()
        except ValueError:
            at = 0.0
    if state.ttl is not None:
        at = min(at, last_access + state.ttl + (state.ttl / 4 + 2.0 if shared else 0.0))
    return at


def stream_log_id(owner: str, name: str) -> str:
    """A stream's log id on a shared backend: the same on every worker, so
    that two workers making one name race for one log (the loser's create is
    SessionExists, and it finds the winner's stream)."""
    key = f"{owner}\0{name}".encode("utf-8", "surrogatepass")
    return "d" + hashlib.blake2b(key, digest_size=16).hexdigest()
