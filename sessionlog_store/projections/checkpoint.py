"""Checkpoint files: the registry's `index.json` and each session's
`snapshot.json`. Both are caches of the logs, written atomically (temp,
fsync, rename, fsync the directory); deleting them loses nothing. This is
the one module of projections/ that does file I/O (through the FileOps seam).
"""
from __future__ import annotations

import os
from typing import Any, Final

import msgspec

from sessionlog_store.eventstore.local.fsio import FileOps, atomic_write
from sessionlog_store.eventstore.local.log import session_dir

from .session import ROOT_KEY, MessageSnapshot, SessionMeta, SessionState

INDEX_NAME: Final = "index.json"
SNAPSHOT_NAME: Final = "snapshot.json"
FORMAT_VERSION: Final = 1


class SessionEntry(msgspec.Struct, kw_only=True):
    """A registry row as of `seq`; `end` is the log offset just past record `seq`."""
    seq: int
    end: int
    meta: SessionMeta


class IndexCheckpoint(msgspec.Struct, kw_only=True):
    version: int = FORMAT_VERSION
    written_at: float = 0.0
    sessions: dict[str, SessionEntry] = {}


# Snapshots gained the branch pointers (`active`) in version 2; an older
# snapshot is ignored (a full replay of the log serves, and rewrites it).
SNAPSHOT_VERSION: Final = 2


class SessionSnapshot(msgspec.Struct, kw_only=True):
    version: int = SNAPSHOT_VERSION
    seq: int
    end: int
    meta: SessionMeta | None
    head: str | None
    messages: list[MessageSnapshot]
    active: dict[str, str] = {}

    @classmethod
    def of(cls, state: SessionState) -> SessionSnapshot:
        return cls(seq=state.seq, end=state.end, meta=state.meta, head=state.head,
                   messages=list(state.messages.values()), active=dict(state.active))

    def to_state(self) -> SessionState:
        state = SessionState()
        state.seq, state.end, state.meta, state.head = self.seq, self.end, self.meta, self.head
        state.messages = {m.msg_id: m for m in self.messages}
        for m in self.messages:  # creation order: the children lists come back as they were
            if m.caller is None:
                state.children.setdefault(m.parent_id or ROOT_KEY, []).append(m.msg_id)
        state.active = dict(self.active)
        return state


_INDEX_DECODER: Final = msgspec.json.Decoder(IndexCheckpoint)
_SNAPSHOT_DECODER: Final = msgspec.json.Decoder(SessionSnapshot)
_ENCODER: Final = msgspec.json.Encoder()


def index_path(root: str) -> str:
    return os.path.join(root, INDEX_NAME)


def snapshot_path(root: str, session_id: str) -> str:
    return os.path.join(session_dir(root, session_id), SNAPSHOT_NAME)


def encode_index(ckpt: IndexCheckpoint) -> bytes:
    return _ENCODER.encode(ckpt)


def write_index(fs: FileOps, root: str, data: bytes) -> None:
    atomic_write(fs, index_path(root), data)


class _LazyIndex(msgspec.Struct, kw_only=True):
    version: int = FORMAT_VERSION
    written_at: float = 0.0
    sessions: dict[str, msgspec.Raw] = {}


_LAZY_INDEX_DECODER: Final = msgspec.json.Decoder(_LazyIndex)
_ENTRY_DECODER: Final = msgspec.json.Decoder(SessionEntry)


def read_index_entries(fs: FileOps, root: str) -> tuple[dict[str, msgspec.Raw] | None, str]:
    """read_index for a start: each session's entry left undecoded (its raw
    bytes) until `decode_entry` reads it, so a 100,000-session index is
    never all decoded at once (issue 29: its rows and the holes they left
    were a quarter of the start's memory)."""
    lazy, how = _read_index(fs, root, _LAZY_INDEX_DECODER)
    return (lazy.sessions if lazy is not None else None), how


def decode_entry(raw: msgspec.Raw) -> SessionEntry | None:
    """One session's checkpoint entry, or None for one that does not decode
    (that session alone is replayed in full)."""
    try:
        return _ENTRY_DECODER.decode(raw)
    except msgspec.DecodeError:
        return None


def read_index(fs: FileOps, root: str) -> tuple[IndexCheckpoint | None, str]:
    """The checkpoint and how it was found: "loaded", "missing" or "corrupt: ..."."""
    return _read_index(fs, root, _INDEX_DECODER)


def _read_index(fs: FileOps, root: str, decoder: msgspec.json.Decoder[Any]) -> tuple[Any, str]:
    path = index_path(root)
    if not fs.exists(path):
        return None, "missing"
    try:
        ckpt = decoder.decode(fs.read_bytes(path))
    except (msgspec.DecodeError, OSError) as e:
        return None, f"corrupt: {e}"
    if ckpt.version != FORMAT_VERSION:
        return None, f"corrupt: version {ckpt.version}"
    return ckpt, "loaded"


def encode_snapshot(state: SessionState) -> bytes:
    return _ENCODER.encode(SessionSnapshot.of(state))


def write_snapshot(fs: FileOps, root: str, session_id: str, data: bytes) -> None:
    atomic_write(fs, snapshot_path(root, session_id), data)


class _Versioned(msgspec.Struct):
    version: int = 0


def snapshot_is_older_format(fs: FileOps, root: str, session_id: str) -> bool:
    """Is the session's snapshot a readable file of an older format (ignored by
    loads, rewritten at the session's next change or by `rebuild`)?"""
    try:
        return msgspec.json.decode(fs.read_bytes(snapshot_path(root, session_id)), type=_Versioned).version \
            < SNAPSHOT_VERSION
    except (OSError, msgspec.DecodeError):
        return False


def read_snapshot(fs: FileOps, root: str, session_id: str) -> SessionSnapshot | None:
    """The session's snapshot, or None when missing or unreadable (a full replay follows)."""
    path = snapshot_path(root, session_id)
    try:
        snap = _SNAPSHOT_DECODER.decode(fs.read_bytes(path))
    except (FileNotFoundError, msgspec.DecodeError):
        return None
    return snap if snap.version == SNAPSHOT_VERSION else None
