"""Pure folds from a session's records to its state. No I/O.

- `apply_meta(meta, record)`: the session's meta, which is also its registry
  row (frozen; a new one per change).
- `SessionState.apply(record)`: meta plus the message DAG. Messages are frozen
  `MessageSnapshot`s; the table holding them is updated in place, because
  copying a long session's table per progress record would make replay
  quadratic. The same fold serves live updates, full replay, snapshot + tail
  replay and the rebuild CLI.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from sessionlog_store.eventstore.events import (HeadMoved, MessageCreated, MessageFinalized, MessageProgress, OwnerChanged,
                               ProjectBound, ProjectRelocated, SessionCreated, SessionDeleted, SessionFlags,
                               SessionRenamed)
from sessionlog_store.eventstore.record import Record

from .lifecycle import OPEN_STATUSES, can_move

PREVIEW_LEN = 80


def truncate_preview(text: str | None, max_len: int = PREVIEW_LEN) -> str | None:
    """The spec's `_truncate`: strip, newlines to spaces, at most 80 characters
    (else the first 77 and an ellipsis)."""
    if not text:
        return None
    t = text.strip().replace("\n", " ")
    return t[:max_len - 3] + "…" if len(t) > max_len else t


class SessionMeta(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A session's meta: the 15 stored registry fields plus `preview` (the 17th
    field of a listed row, `project`, is filled in when listing). See
    docs/API.md for each field."""
    id: str
    agent_id: str = "default"
    source: str = "web"
    title: str = ""
    status: str = "idle"
    created_at: float = 0.0
    updated_at: float = 0.0
    pinned: bool = False
    unread: bool = False
    archived: bool = False
    project_id: str | None = None
    message_count: int = 0
    user_titled: bool = msgspec.field(default=False, name="_user_titled")
    auto_titled: bool = msgspec.field(default=False, name="_auto_titled")
    title_gen_count: int = msgspec.field(default=0, name="_title_gen_count")
    preview: str | None = None
    # Who the session belongs to ("" the single-user principal; docs/SECURITY.md).
    owner: str = ""
    # Not part of a row: ids of messages still pending or running (what the
    # startup abort sweep needs without loading every message).
    open_msgs: tuple[str, ...] = ()

    def __lt__(self, other: SessionMeta) -> bool:
        """The session list's order: newest first (updated_at), then by id."""
        u, v = self.updated_at, other.updated_at
        return u > v or (u == v and self.id < other.id)


def apply_meta(meta: SessionMeta | None, record: Record) -> SessionMeta | None:
    """Fold one record of a session log into the session's meta."""
    fold = _META_FOLDS.get(type(record.event))
    if fold is None:  # progress, and the records that leave the meta as it is
        return meta
    if meta is None and fold is not _meta_created:
        return None   # (nothing before its creation)
    return fold(meta, record)


# One function a record type, picked by the record's type (issue 29: a match
# over the types in turn was ~1 us a record, half of it the matching, on the
# registry's every non-progress record and a replay's).

def _meta_created(meta: SessionMeta | None, record: Record) -> SessionMeta:
    c: SessionCreated = record.event  # type: ignore[assignment]
    at = c.created_at or record.ts
    return SessionMeta(id=c.session_id, agent_id=c.agent_id, source=c.source, title=c.title,
                       project_id=c.project_id, created_at=at, updated_at=at, user_titled=c.user_titled,
                       owner=c.owner)


def _meta_message(meta: SessionMeta, record: Record) -> SessionMeta:
    m: MessageCreated = record.event  # type: ignore[assignment]
    open_msgs = meta.open_msgs + (m.msg_id,) if m.status in OPEN_STATUSES else meta.open_msgs
    if m.caller is not None:
        return _replace(meta, open_msgs=open_msgs) if open_msgs is not meta.open_msgs else meta
    preview = truncate_preview(m.content) if m.role == "user" else meta.preview
    return _replace(meta, message_count=meta.message_count + 1, updated_at=record.ts,
                    preview=preview, open_msgs=open_msgs)


def _meta_finalized(meta: SessionMeta, record: Record) -> SessionMeta:
    msg_id = record.event.msg_id  # type: ignore[union-attr]
    if msg_id not in meta.open_msgs:
        return meta
    return _replace(meta, open_msgs=tuple(m for m in meta.open_msgs if m != msg_id))


def _meta_renamed(meta: SessionMeta, record: Record) -> SessionMeta:
    r: SessionRenamed = record.event  # type: ignore[assignment]
    return _replace(
        meta, title=r.title,
        user_titled=meta.user_titled if r.user_titled is None else r.user_titled,
        auto_titled=meta.auto_titled if r.auto_titled is None else r.auto_titled,
        title_gen_count=meta.title_gen_count if r.title_gen_count is None else r.title_gen_count)


def _meta_flags(meta: SessionMeta, record: Record) -> SessionMeta:
    f: SessionFlags = record.event  # type: ignore[assignment]
    return _replace(
        meta,
        pinned=meta.pinned if f.pinned is None else f.pinned,
        unread=meta.unread if f.unread is None else f.unread,
        archived=meta.archived if f.archived is None else f.archived,
        status=meta.status if f.status is None else f.status)


def _meta_bound(meta: SessionMeta, record: Record) -> SessionMeta:
    return _replace(meta, project_id=record.event.project_id)  # type: ignore[union-attr]


def _meta_owner(meta: SessionMeta, record: Record) -> SessionMeta:
    return _replace(meta, owner=record.event.owner)  # type: ignore[union-attr]


def _meta_deleted(meta: SessionMeta, record: Record) -> None:
    return None


_replace = msgspec.structs.replace
_META_FOLDS: dict[type, Callable[[Any, Record], SessionMeta | None]] = {
    SessionCreated: _meta_created, MessageCreated: _meta_message, MessageFinalized: _meta_finalized,
    SessionRenamed: _meta_renamed, SessionFlags: _meta_flags, ProjectBound: _meta_bound,
    OwnerChanged: _meta_owner, SessionDeleted: _meta_deleted}


class MessageSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A message as of some seq. `metadata` holds `context_tree`,
    `partial_tokens_used` and `aborted_reason` when they exist."""
    msg_id: str
    role: str
    kind: str
    parent_id: str | None = None
    caller: str | None = None
    status: str = "done"
    content: str = ""
    started_at: float | None = None
    last_update_at: float = 0.0
    created_at: float = 0.0
    seq: int = 0  # the last seq that changed this message
    metadata: dict[str, Any] = {}
    error: str | None = None
    tokens: dict[str, int] | None = None


ROOT_KEY = ""  # the parent key of the first message(s): they have no parent


def _progressed(md: dict[str, Any], tree: Any, tokens: dict[str, int] | None) -> dict[str, Any]:
    """A running message's metadata with a progress record's tree and token
    counts (the same dict when it has neither)."""
    if tree is None and tokens is None:
        return md
    # (the two keys always last, tree first: the same dict whether the records
    # were folded one by one or several at once when the state is read)
    out = {k: v for k, v in md.items() if k != "context_tree" and k != "partial_tokens_used"}
    if tree is not None or "context_tree" in md:
        out["context_tree"] = tree if tree is not None else md["context_tree"]
    if tokens is not None or "partial_tokens_used" in md:
        out["partial_tokens_used"] = tokens if tokens is not None else md["partial_tokens_used"]
    return out


class _Growth:
    """A running message's progress since its snapshot: deltas at its end,
    its newest tree and token counts, and the last record's ts and seq."""
    __slots__ = ("pieces", "length", "tree", "tokens", "ts", "seq")

    def __init__(self, length: int) -> None:
        self.pieces: list[str] = []
        self.length = length
        self.tree: Any = None
        self.tokens: dict[str, int] | None = None
        self.ts = 0.0
        self.seq = 0


class SessionState:
    """Meta plus the message DAG of one session, as of `seq`.

    Branches: conversational messages (no `caller`) with the same parent are
    siblings (a retry or regenerate makes one). `children` lists each parent's
    conversational children in creation order; `active` maps each parent to
    the child on the branch last shown through it, so switching to a sibling
    restores exactly the view that branch had (`leaf_of`)."""

    __slots__ = ("meta", "_messages", "_growing", "head", "seq", "end", "children", "active")

    def __init__(self) -> None:
        self.meta: SessionMeta | None = None
        self._messages: dict[str, MessageSnapshot] = {}
        # Running messages' progress not yet in their snapshots: a progress
        # record at a message's end is a length update (its delta kept here);
        # `messages` settles them first (issue 29: no copy of a growing
        # reply's whole text per record).
        self._growing: dict[str, _Growth] = {}
        self.head: str | None = None
        self.seq = 0
        self.end = 0  # byte offset just past record `seq` in the log
        self.children: dict[str, list[str]] = {}
        self.active: dict[str, str] = {}

    @property
    def messages(self) -> dict[str, MessageSnapshot]:
        """Every message's snapshot, as of the last record folded."""
        if self._growing:
            self._settle()
        return self._messages

    @messages.setter
    def messages(self, value: dict[str, MessageSnapshot]) -> None:
        self._growing.clear()
        self._messages = value

    def _settle(self) -> None:
        msgs, replace = self._messages, msgspec.structs.replace
        for msg_id, g in self._growing.items():
            m = msgs.get(msg_id)
            if m is None or not g.seq:  # (nothing folded since its snapshot)
                continue
            content = m.content + "".join(g.pieces) if g.pieces else m.content
            msgs[msg_id] = replace(m, content=content, metadata=_progressed(m.metadata, g.tree, g.tokens),
                                   last_update_at=g.ts,
                                   seq=g.seq)
        self._growing.clear()

    def _point_to(self, msg_id: str) -> None:
        """Make the path from the root to msg_id the active one. Invariant: the
        path from head to the root is active, so a message appended under the
        head needs one pointer (done in apply); a retry or a switch walks up."""
        child, seen = msg_id, set()
        while child in self.messages and child not in seen:
            seen.add(child)
            parent = self.messages[child].parent_id or ROOT_KEY
            self.active[parent] = child
            if parent == ROOT_KEY:
                return
            child = parent

    def leaf_of(self, msg_id: str) -> str:
        """The tip of the branch through msg_id: follow the active children."""
        seen = {msg_id}
        while msg_id in self.active and self.active[msg_id] not in seen:
            msg_id = self.active[msg_id]
            seen.add(msg_id)
        return msg_id

    def siblings(self, msg_id: str) -> list[str]:
        """The conversational messages sharing msg_id's parent, in creation order."""
        m = self.messages.get(msg_id)
        if m is None or m.caller is not None:
            return []
        return self.children.get(m.parent_id or ROOT_KEY, [msg_id])

    def apply(self, record: Record, end: int = 0) -> None:
        """Fold one record (in seq order)."""
        self.seq = record.seq
        self.end = end
        replace = msgspec.structs.replace
        p = record.event
        if type(p) is MessageProgress:  # the hot path (no meta change: see apply_meta)
            g = self._growing.get(p.msg_id)
            if g is not None and p.offset == g.length:  # at the running message's end: a length update
                if p.content_delta:
                    g.pieces.append(p.content_delta)
                    g.length += len(p.content_delta)
                if p.context_tree is not None:
                    g.tree = p.context_tree
                if p.partial_tokens_used is not None:
                    g.tokens = p.partial_tokens_used
                g.ts, g.seq = record.ts, record.seq
                return
            msgs = self.messages  # (settled)
            m = msgs.get(p.msg_id)
            if m is None or m.status not in OPEN_STATUSES:
                return
            content = m.content
            if p.content_delta:
                content = content[:p.offset] + p.content_delta if p.offset != len(content) \
                    else content + p.content_delta
            md = _progressed(m.metadata, p.context_tree, p.partial_tokens_used)
            msgs[p.msg_id] = replace(m, content=content, status="running", metadata=md,
                                     last_update_at=record.ts, seq=record.seq)
            self._growing[p.msg_id] = _Growth(len(content))
            return
        msgs = self.messages
        self.meta = apply_meta(self.meta, record)
        match record.event:
            case MessageCreated() as c:
                msgs[c.msg_id] = MessageSnapshot(
                    msg_id=c.msg_id, role=c.role, kind=c.kind, parent_id=c.parent_id, caller=c.caller,
                    status=c.status, content=c.content, started_at=c.started_at,
                    last_update_at=record.ts, created_at=record.ts, seq=record.seq,
                    metadata=dict(c.metadata))
                if c.caller is None:
                    parent = c.parent_id or ROOT_KEY
                    under_head = parent == (self.head or ROOT_KEY)
                    self.head = c.msg_id
                    self.children.setdefault(parent, []).append(c.msg_id)
                    if under_head:
                        self.active[parent] = c.msg_id
                    else:
                        self._point_to(c.msg_id)
            case MessageFinalized() as f:
                m = msgs.get(f.msg_id)
                if m is None or not can_move(m.status, f.status):
                    return
                md = m.metadata
                if f.aborted_reason is not None:
                    md = {**md, "aborted_reason": f.aborted_reason}
                msgs[f.msg_id] = replace(
                    m, status=f.status, content=m.content if f.content is None else f.content,
                    error=f.error, tokens=f.tokens if f.tokens is not None else m.tokens,
                    metadata=md, last_update_at=record.ts, seq=record.seq)
            case ProjectRelocated() as r:
                msgs[r.node_id] = MessageSnapshot(
                    msg_id=r.node_id, role="system", kind="relocate", parent_id=self.head,
                    caller="project", status="done", created_at=record.ts, last_update_at=record.ts,
                    content=f"Project folder moved: {r.old_path} → {r.path}", seq=record.seq,
                    metadata={"project_id": r.project_id, "old_path": r.old_path, "path": r.path})
            case HeadMoved(head=head) if head in msgs:
                self.head = head
                self._point_to(head)
            case SessionDeleted():
                msgs.clear()
                self.children.clear()
                self.active.clear()
                self.head = None
            case _:
                pass

    def branch(self, head: str | None = None) -> list[MessageSnapshot]:
        """The current branch (or the one ending at `head`): the path from the
        root to head, plus the non-conversational nodes (tool calls,
        relocations) hanging off it."""
        path: list[str] = []
        seen: set[str] = set()
        mid = self.head if head is None else head
        while mid is not None and mid not in seen and mid in self.messages:
            seen.add(mid)
            path.append(mid)
            mid = self.messages[mid].parent_id
        on_branch = set(path)
        return [m for m in self.messages.values()
                if m.msg_id in on_branch or (m.caller is not None and m.parent_id in on_branch)]

    def running(self) -> list[MessageSnapshot]:
        return [m for m in self.messages.values() if m.status in OPEN_STATUSES]
