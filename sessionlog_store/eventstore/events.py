"""Every event of a session log (and of the project registry's log), as one
tagged union of frozen msgspec Structs.

Schema-evolution rules (msgspec's three, plus ours):
 1. A new field always gets a default, so older records still decode.
 2. Never change a field's type; add a new field instead.
 3. Never reuse or rename a tag (the `tag=` below, not the class name, is what
    is on disk; renaming a class is free).
 4. Ours: a message record without a status reads as "done" (a default, not a
    special case in replay). A change that a default cannot express gets a
    named upcaster function in record.py, never a branch in a fold.
What an older build does with a newer log: unknown *fields* are skipped, but an
unknown *tag* cannot be decoded, so a new event type is a one-way door: the
older build reports the record as corrupt (`unknown event type`) and
quarantines the session rather than guessing.
"""
from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

Role = Literal["user", "assistant", "tool", "system"]
Kind = Literal["chat", "llm_reply", "tool_call", "agentic_fn", "task_spawn", "merge", "relocate"]
Status = Literal["pending", "running", "done", "error", "aborted"]
TerminalStatus = Literal["done", "error", "aborted"]
SessionStatus = Literal["idle", "running"]


class BaseEvent(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """Base of every event in a log."""


class SessionCreated(BaseEvent, tag="session_created", frozen=True):
    session_id: str
    agent_id: str = "default"
    source: str = "web"
    title: str = ""
    project_id: str | None = None
    created_at: float = 0.0
    # A title given at creation is the user's: auto-naming leaves it alone.
    user_titled: bool = False
    # The principal the session belongs to (docs/SECURITY.md). "" is the
    # single-user principal: logs written before owners existed read as its.
    owner: str = ""


class MessageCreated(BaseEvent, tag="message_created", frozen=True):
    """A message, or the placeholder of in-flight work, is born.

    `caller` set means a non-conversational node (a tool call under a reply, a
    relocation): it never moves the session's head.
    """
    msg_id: str
    role: Role = "user"
    kind: Kind = "chat"
    parent_id: str | None = None
    caller: str | None = None
    status: Status = "done"
    content: str = ""
    started_at: float | None = None
    metadata: dict[str, Any] = {}


# The progress record is most of every log (one per running message per
# 250 ms): on disk it is spelled short, `{"type":"p","m":..,"d":..,"o":..}`
# (`t` the tree, `u` the token counts), ~37 bytes a record less than its
# long spelling. Logs written before keep the long one (`message_progress`,
# MessageProgressV1): both are read, only the short one is written; one
# with token counts is written `q` (MessageProgressQ: the counts a pair).
_PROGRESS_NAMES: Final = {"msg_id": "m", "content_delta": "d", "offset": "o", "context_tree": "t",
                          "partial_tokens_used": "u"}


class MessageProgress(BaseEvent, tag="p", frozen=True, rename=_PROGRESS_NAMES):
    """One throttle interval's worth of a running message: the content delta and
    the character offset where it starts, the latest tree and token counts."""
    msg_id: str
    content_delta: str = ""
    offset: int = 0
    context_tree: Any = None
    partial_tokens_used: dict[str, int] | None = None


class MessageProgressV1(BaseEvent, tag="message_progress", frozen=True):
    """The long spelling of MessageProgress in older logs (read only; decoding
    turns it into a MessageProgress)."""
    msg_id: str
    content_delta: str = ""
    offset: int = 0
    context_tree: Any = None
    partial_tokens_used: dict[str, int] | None = None

    def upgrade(self) -> MessageProgress:
        return MessageProgress(msg_id=self.msg_id, content_delta=self.content_delta, offset=self.offset,
                               context_tree=self.context_tree, partial_tokens_used=self.partial_tokens_used)


class MessageProgressQ(BaseEvent, tag="q", frozen=True, rename=_PROGRESS_NAMES):
    """A progress record with token counts, as written since issue 29: `u` is
    `[input, output]` (`"u":[0,64]`, 18 bytes a record less than the object
    `{"input":0,"output":64}`; bench/ bytes). Decoding turns it into a
    MessageProgress (counts as the dict every reader knows)."""
    msg_id: str
    content_delta: str = ""
    offset: int = 0
    context_tree: Any = None
    partial_tokens_used: tuple[int, int] | None = None

    def upgrade(self) -> MessageProgress:
        u = self.partial_tokens_used
        return MessageProgress(msg_id=self.msg_id, content_delta=self.content_delta, offset=self.offset,
                               context_tree=self.context_tree,
                               partial_tokens_used=None if u is None else {"input": u[0], "output": u[1]})


def on_disk(event: Event) -> Event:
    """How an event is spelled in a log: a progress record's token counts
    (exactly input and output) as a pair."""
    if type(event) is MessageProgress:
        u = event.partial_tokens_used
        if u is not None and len(u) == 2 and "input" in u and "output" in u:
            return MessageProgressQ(msg_id=event.msg_id, content_delta=event.content_delta, offset=event.offset,
                                    context_tree=event.context_tree, partial_tokens_used=(u["input"], u["output"]))
    return event


class MessageFinalized(BaseEvent, tag="message_finalized", frozen=True):
    """The terminal state. `content` is the whole final content when given;
    None keeps what the progress records assembled."""
    msg_id: str
    status: TerminalStatus = "done"
    content: str | None = None
    error: str | None = None
    aborted_reason: str | None = None
    tokens: dict[str, int] | None = None


class SessionRenamed(BaseEvent, tag="session_renamed", frozen=True):
    """A title change. The flags are the spec's title lock markers; None leaves
    a flag as it was."""
    title: str
    user_titled: bool | None = None
    auto_titled: bool | None = None
    title_gen_count: int | None = None


class SessionFlags(BaseEvent, tag="session_flags", frozen=True):
    """pinned / unread / archived / status; None leaves a flag as it was."""
    pinned: bool | None = None
    unread: bool | None = None
    archived: bool | None = None
    status: SessionStatus | None = None


class ProjectBound(BaseEvent, tag="project_bound", frozen=True):
    project_id: str


class ProjectRelocated(BaseEvent, tag="project_relocated", frozen=True):
    """A graph node recording that the bound project's folder moved; it never
    moves head."""
    node_id: str
    project_id: str
    old_path: str
    path: str


class HeadMoved(BaseEvent, tag="head_moved", frozen=True):
    """The user switched branches: `head` is the new tip of the current branch
    (the leaf a client sees last; see SessionState.leaf_of)."""
    head: str


class OwnerChanged(BaseEvent, tag="owner_changed", frozen=True):
    """The session now belongs to `owner` (`sessionlog users transfer`;
    docs/SECURITY.md). A tag of its own rather than a new field of an older
    event: a build that does not know it quarantines the session (the
    one-way door above) instead of showing it to its former owner."""
    owner: str
    previous: str = ""  # whose it was (for `inspect`; the fold does not need it)


class SessionDeleted(BaseEvent, tag="session_deleted", frozen=True):
    """A tombstone: the directory is removed after it is durable; a start that
    finds one finishes the deletion."""


# Events of the project registry's own log (projects/log.jsonl).
class ProjectCreated(BaseEvent, tag="project_created", frozen=True):
    project_id: str
    name: str
    path: str
    owner: str = ""  # as SessionCreated.owner


class ProjectMoved(BaseEvent, tag="project_moved", frozen=True):
    project_id: str
    old_path: str
    path: str


class ProjectOwnerChanged(BaseEvent, tag="project_owner_changed", frozen=True):
    """The project now belongs to `owner` (as OwnerChanged, for a session)."""
    project_id: str
    owner: str
    previous: str = ""


class ProjectDeleted(BaseEvent, tag="project_deleted", frozen=True):
    """The project is gone (`sessionlog users delete`); its earlier records
    stay in the log, which is append-only."""
    project_id: str


# Events of a generic stream's log (the Durable Streams protocol's streams an
# app creates: server/domain/streamspace.py; their logs live in a data root of
# their own, `streams/`, never beside a session's records).
class StreamOpened(BaseEvent, tag="ds_opened", frozen=True):
    """A stream is created: its name (its path under /v1/stream/), whose it
    is, its content type and expiry; a fork names its source's log and the
    offset (a position in bytes) it diverges at."""
    name: str
    content_type: str
    owner: str = ""
    ttl: int | None = None
    expires_at: str | None = None
    created_at: float = 0.0
    forked_from: str | None = None
    fork_offset: int = 0
    fork_sub: int = 0
    # (shared backend) the source's created_at: a name deleted and made
    # again keeps its log id, and a fork of the old one is not the new one's
    source_created: float | None = None


class StreamAppended(BaseEvent, tag="ds_appended", frozen=True):
    """One append (a POST's body, one unit of the stream; empty for a close
    alone), the producer that sent it, and whether it closed the stream."""
    data: bytes = b""
    producer: str | None = None
    epoch: int = 0
    pseq: int = 0
    stream_seq: str | None = None
    close: bool = False


class StreamSoftDeleted(BaseEvent, tag="ds_gone", frozen=True):
    """Deleted while forks still read from it: gone to clients, kept for them."""


class StreamForkLinked(BaseEvent, tag="ds_link", frozen=True):
    """(Shared backend) In a source's log: its fork (the fork's log id and
    created_at) holds, and is served from now on; `dropped`: it never will
    (its maker did not link it in time: its log is removed)."""
    fork: str
    created_at: float
    dropped: bool = False


Event = (SessionCreated | MessageCreated | MessageProgress | MessageProgressV1 | MessageProgressQ | MessageFinalized
         | SessionRenamed
         | SessionFlags | ProjectBound | ProjectRelocated | HeadMoved | OwnerChanged | SessionDeleted
         | ProjectCreated | ProjectMoved | ProjectOwnerChanged | ProjectDeleted
         | StreamOpened | StreamAppended | StreamSoftDeleted | StreamForkLinked)

EVENT_ENCODER: Final = msgspec.json.Encoder()
EVENT_DECODER: Final = msgspec.json.Decoder(Event)
