"""What a shared stream holds, folded in stream order (issue 17): the
registry, the running replies, and each session's position (its last seq,
its lines' length, the stream sequence of its last message), as of one
stream sequence. Written as a checkpoint (`StreamCheckpoint`) to the
stream's object bucket, it lets a worker's start replay only the messages
after it (server/scaleout/worker.py, docs/SCALEOUT.md).

A worker's live registry cannot be written as of a stream sequence: its own
records are folded when appended, before the stream has given them a
sequence, and the tail skips them. This fold is fed every message the tail
delivers, the worker's own included, in the stream's order, so it is what
the stream held up to the last message it took. Pure: no I/O.
"""
from __future__ import annotations

from typing import Any, Final

import msgspec

from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress, SessionCreated,
                                                SessionDeleted)
from sessionlog_store.eventstore.record import with_ends
from sessionlog_store.eventstore.record import Record

from .checkpoint import SNAPSHOT_VERSION, SessionSnapshot
from .lifecycle import OPEN_STATUSES
from .registry import Mark, Registry
from .session import SessionMeta, SessionState

CHECKPOINT_VERSION: Final = 1


class RunningIndex:
    """Every reply running on the stream, any worker's, with what
    `list_running` shows of it (a fold of the records)."""

    def __init__(self) -> None:
        self.replies: dict[tuple[str, str], dict[str, Any]] = {}

    def apply(self, sid: str, rec: Record, end: int) -> None:
        ev = rec.event
        if isinstance(ev, MessageProgress):
            r = self.replies.get((sid, ev.msg_id))
            if r is not None:
                r["length"] = ev.offset + len(ev.content_delta)
        elif isinstance(ev, MessageCreated):
            if ev.status in OPEN_STATUSES:
                self.replies[(sid, ev.msg_id)] = {"session_id": sid, "msg_id": ev.msg_id, "kind": ev.kind,
                                                  "role": ev.role, "caller": ev.caller,
                                                  "started_at": ev.started_at or rec.ts, "length": len(ev.content)}
        elif isinstance(ev, MessageFinalized):
            self.replies.pop((sid, ev.msg_id), None)
        elif isinstance(ev, SessionDeleted):
            self.drop(sid)

    def drop(self, sid: str) -> None:
        for key in [k for k in self.replies if k[0] == sid]:
            del self.replies[key]


class SessionPosition(msgspec.Struct, array_like=True):
    seq: int          # the session's last seq
    end: int          # its lines' length (as its log file would be)
    stream_seq: int   # the stream sequence of its last message (the fence of its next append)
    meta_seq: int = 0


class RunningReply(msgspec.Struct, kw_only=True):
    session_id: str
    msg_id: str
    kind: str
    role: str
    caller: str | None = None
    started_at: float = 0.0
    length: int = 0


class StreamCheckpoint(msgspec.Struct, kw_only=True):
    """The fold as of stream sequence `position`, of stream `stream`."""
    version: int = CHECKPOINT_VERSION
    stream: str
    created: str = ""  # when the stream was made (one made again under the name is another stream)
    position: int
    written_at: float = 0.0
    sessions: dict[str, SessionMeta] = {}
    positions: dict[str, SessionPosition] = {}
    running: list[RunningReply] = []


_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(StreamCheckpoint)


class CheckpointUnusable(ValueError):
    """A stored checkpoint that cannot serve (another format, another
    stream, undecodable): the start replays the whole stream instead."""


def decode_checkpoint(data: bytes, stream: str, created: str, last_seq: int) -> StreamCheckpoint:
    """The checkpoint, if it is of this stream (`created` then, holding up
    to `last_seq`)."""
    try:
        ckpt = _DECODER.decode(data)
    except msgspec.DecodeError as e:
        raise CheckpointUnusable(f"undecodable: {e}") from None
    if ckpt.version != CHECKPOINT_VERSION:
        raise CheckpointUnusable(f"format version {ckpt.version}, this build reads {CHECKPOINT_VERSION}")
    if ckpt.stream != stream:
        raise CheckpointUnusable(f"written for stream {ckpt.stream!r}, not {stream!r}")
    if ckpt.created != created or ckpt.position > last_seq:
        raise CheckpointUnusable(f"written for another stream of the name (made {ckpt.created or '?'}, "
                                 f"up to sequence {ckpt.position}; this one: made {created}, up to {last_seq})")
    if set(ckpt.sessions) - set(ckpt.positions):
        raise CheckpointUnusable("a session without its position")
    return ckpt


class StreamSnapshot(msgspec.Struct, kw_only=True):
    """A session's state as of the stream sequence of its last message it
    holds; `first`, the stream sequence of the session's first message,
    names the incarnation (an id deleted and made again has another)."""
    version: int = CHECKPOINT_VERSION
    stream_seq: int
    first: int
    state: SessionSnapshot


_SNAPSHOT_DECODER: Final = msgspec.json.Decoder(StreamSnapshot)


def encode_snapshot(state: SessionState, stream_seq: int, first: int) -> bytes:
    return _ENCODER.encode(StreamSnapshot(stream_seq=stream_seq, first=first, state=SessionSnapshot.of(state)))


def decode_snapshot(data: bytes) -> StreamSnapshot:
    try:
        snap = _SNAPSHOT_DECODER.decode(data)
    except msgspec.DecodeError as e:
        raise CheckpointUnusable(f"undecodable: {e}") from None
    if snap.version != CHECKPOINT_VERSION or snap.state.version != SNAPSHOT_VERSION:
        raise CheckpointUnusable(f"format version {snap.version}/{snap.state.version}")
    return snap


class StreamFold:
    """Fed (subject's session id, message data, its records, stream
    sequence) for every message of the stream, in stream order."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.created = ""  # the stream's birth (set by the start)
        self.registry = Registry()
        self.running = RunningIndex()
        self.positions: dict[str, SessionPosition] = {}
        self.position = 0  # the stream sequence of the last message taken

    def take(self, sid: str, data: bytes, records: list[Record], stream_seq: int) -> None:
        """`records`: the scan of `data`."""
        if stream_seq <= self.position:
            return  # (delivered again: an ordered consumer's reset)
        self.position = stream_seq
        if not records:
            return
        pos = self.positions.get(sid)
        if pos is not None and isinstance(records[0].event, SessionCreated) and records[0].seq <= pos.seq:
            # The id made again after a deletion whose tombstone was purged
            # before it reached this fold: the old session is gone.
            self._forget(sid)
            pos = None
        if pos is None:
            if not isinstance(records[0].event, SessionCreated) and sid not in self.registry:
                return  # the rest of a session purged before its start reached the fold
            pos = self.positions[sid] = SessionPosition(0, 0, 0)
        registry, running = self.registry, self.running
        for rec, end in with_ends(records, data, pos.end):
            registry.apply(sid, rec, end)
            running.apply(sid, rec, end)
            pos.seq = rec.seq
        pos.end += len(data)
        pos.stream_seq = stream_seq
        if isinstance(records[-1].event, SessionDeleted):
            self._forget(sid)

    def prune(self, live: set[str] | None, upto: int) -> int:
        """Forget the sessions that had no message on the stream when it
        ended at stream sequence `upto` (`live`: those that had), though the
        fold has no message of theirs after it: deleted, and purged before
        the tail brought their tombstone. Returns how many."""
        if live is None:
            return 0
        gone = [sid for sid, pos in self.positions.items() if sid not in live and pos.stream_seq <= upto]
        for sid in gone:
            self._forget(sid)
        return len(gone)

    def _forget(self, sid: str) -> None:
        self.registry.put(None, sid)
        self.running.drop(sid)
        self.positions.pop(sid, None)

    def checkpoint(self, now: float) -> bytes:
        marks = self.registry.marks
        for sid, pos in self.positions.items():
            mark = marks.get(sid)
            pos.meta_seq = mark.meta_seq if mark is not None else 0
        return _ENCODER.encode(StreamCheckpoint(
            stream=self.stream, created=self.created, position=self.position, written_at=now, sessions=self.registry.rows,
            positions=self.positions,
            running=[RunningReply(**r) for r in self.running.replies.values()]))

    def seed(self, ckpt: StreamCheckpoint) -> None:
        """Start from a checkpoint (its positions copied: the fold moves its own)."""
        self.position = ckpt.position
        seed(ckpt, self.registry, self.running)
        self.positions = {sid: SessionPosition(p.seq, p.end, p.stream_seq, p.meta_seq)
                          for sid, p in ckpt.positions.items()}


def seed(ckpt: StreamCheckpoint, registry: Registry, running: RunningIndex) -> None:
    """A registry and a running index as the checkpoint has them."""
    for sid, meta in ckpt.sessions.items():
        pos = ckpt.positions[sid]
        registry.put(meta, sid, Mark(seq=pos.seq, end=pos.end, meta_seq=pos.meta_seq))
    for r in ckpt.running:
        if r.session_id in ckpt.sessions:
            running.replies[(r.session_id, r.msg_id)] = msgspec.structs.asdict(r)


def prune(ckpt: StreamCheckpoint, live: set[str] | None) -> list[str]:
    """Drop the checkpoint's sessions whose subject is empty now (deleted
    and purged after it was written: their tombstone will not be replayed).
    `live`: the session ids with messages on the stream (None: unknown,
    nothing dropped). Returns the dropped ids."""
    if live is None:
        return []
    gone = [sid for sid in ckpt.sessions if sid not in live]
    for sid in gone:
        del ckpt.sessions[sid]
        ckpt.positions.pop(sid, None)
    ckpt.running = [r for r in ckpt.running if r.session_id in ckpt.sessions]
    return gone
