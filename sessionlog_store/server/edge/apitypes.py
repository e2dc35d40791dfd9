"""The HTTP API's bodies, as msgspec types: what a request body decodes into
(unknown fields refused) and what each answer is checked against before it
is sent. openapi.py makes /v1/openapi.json from these same types, so the
document cannot drift from what the handlers take and give. The shapes are
the WebSocket's answers (docs/PROTOCOL.md), without the frame around them.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from sessionlog_store.eventstore.ids import ID_PATTERN as _ID
from sessionlog_store.server.edge.protocol import MAX_LIMIT, Count, Short

# A session's or a message's id (eventstore/ids.py checks the same).
ID_PATTERN = f"^{_ID}$"
Sid = Annotated[str, msgspec.Meta(pattern=ID_PATTERN)]
# A folder's absolute path (whether it is an existing folder under a project root is the server's to say).
Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096, pattern="^/")]
Title = Annotated[str, msgspec.Meta(min_length=1, max_length=500, pattern=r"\S")]
# A message a person wrote: not empty, not only blanks.
Text = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]


class Body(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A request body: unknown fields are refused (400 bad_request)."""


# -- request bodies and queries -------------------------------------------------

class SearchQuery(Body):
    """GET /v1/search: the words (every one must occur, the last as a prefix), paging."""
    q: Annotated[str, msgspec.Meta(max_length=500)]
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20
    offset: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 0


class SessionQuery(Body):
    """GET /v1/sessions: paging, the archive switches, `since` and the
    filters (each field left out: not filtered on)."""
    include_archived: bool = False
    archived: bool | UnsetType = UNSET
    offset: Count = 0
    limit: Annotated[int, msgspec.Meta(ge=0, le=MAX_LIMIT)] | UnsetType = UNSET
    since: Short | UnsetType = UNSET
    agent_id: Short | UnsetType = UNSET
    source: Short | UnsetType = UNSET
    status: Short | UnsetType = UNSET
    pinned: bool | UnsetType = UNSET
    unread: bool | UnsetType = UNSET
    project_id: Short | UnsetType = UNSET
    owner: Short | UnsetType = UNSET


FILTER_FIELDS = ("agent_id", "source", "status", "pinned", "unread", "project_id", "owner")


class LoadQuery(Body):
    msg_id: Sid | UnsetType = UNSET


class NewSession(Body):
    agent_id: Short = "default"
    project_id: Short | None = None
    source: Short = "web"
    title: Short = ""


class SessionPatch(Body):
    """Each field given is one change, in this order; the answer merges what changed."""
    title: Title | None = None
    regenerate_title: bool = False
    archived: bool | None = None
    pinned: bool | None = None
    unread: bool | None = None
    project_id: Short | None = None


class NewMessage(Body):
    """A finished message appended on the current branch (or under `parent_id`)."""
    content: Text
    role: Literal["user", "assistant", "tool", "system"] = "user"
    kind: Literal["chat", "llm_reply", "tool_call", "agentic_fn", "task_spawn", "merge"] = "chat"
    parent_id: Sid | None = None
    metadata: dict[str, Any] | None = None


class BranchSwitch(Body):
    msg_id: Sid


class NewChat(Body):
    content: Text
    session_id: Sid | None = None
    project_id: Short | None = None
    agent_id: Short | None = None
    source: Short | None = None


class NewReply(Body):
    """A reply an external producer streams into: a turn's answer
    (`llm_reply`, no `caller`), or a tool call or agentic function under
    the message that made it (`caller`)."""
    kind: Literal["llm_reply", "tool_call", "agentic_fn", "task_spawn"] = "llm_reply"
    parent_id: Sid | None = None
    caller: Sid | None = None
    # Its role (default: assistant for an llm_reply, tool otherwise) and what
    # the message records beside its text (a tool call: {"tool": name,
    # "tool_call_id": id}, as the server's own agents write it).
    role: Literal["assistant", "tool"] | None = None
    metadata: dict[str, Any] = {}


class Tokens(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    input: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)] = 0
    output: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)] = 0


class ReplyProgress(Body):
    """What a running reply has beside its text: its token counts so far
    (totals, not increments: a retry sets the same) and its agentic tree
    (the whole tree, replacing the last). One record, durable with the next
    group commit, told to readers as a progress update."""
    tokens: Tokens | None = None
    tree: Any = None


class NewProject(Body):
    path: Path
    name: Short = ""


class Relocation(Body):
    project_id: Short
    path: Path


# -- answers ---------------------------------------------------------------------

class Answer(msgspec.Struct, kw_only=True):
    pass


class ProjectRef(Answer):
    id: str
    name: str
    path: str
    path_missing: bool


class SessionRow(Answer):
    """A listed session: the 17 row fields (docs/API.md), `damaged` for a
    quarantined one, `owner` in an admin's answers."""
    id: str
    agent_id: str
    source: str
    title: str
    status: str
    created_at: float
    updated_at: float
    pinned: bool
    unread: bool
    archived: bool
    project_id: str | None
    message_count: int
    user_titled: bool = msgspec.field(name="_user_titled")
    auto_titled: bool = msgspec.field(name="_auto_titled")
    title_gen_count: int = msgspec.field(name="_title_gen_count")
    preview: str | None
    project: ProjectRef | None
    damaged: str | UnsetType = UNSET
    owner: str | UnsetType = UNSET


class SessionList(Answer, tag_field="type", tag="sessions_list"):
    """The rows (`type` says which answer this is: the list, or the changes since `since`)."""
    rows: list[SessionRow]
    total: int
    rev: str
    relist: bool


class Change(Answer):
    type: Literal["session_created", "session_updated", "session_deleted"]
    data: dict[str, Any]


class SessionChanges(Answer, tag_field="type", tag="sessions_changes"):
    """The session_created / session_updated / session_deleted pushes after `since`, oldest first."""
    since: str
    rev: str
    changes: list[Change]


class SessionCreated(Answer):
    session: SessionRow


class Message(Answer):
    msg_id: str
    role: str
    kind: str
    parent_id: str | None
    caller: str | None
    status: str
    content: str
    started_at: float | None
    last_update_at: float
    created_at: float
    seq: int
    metadata: dict[str, Any]
    error: str | None
    tokens: dict[str, int] | None
    siblings: list[str] | UnsetType = UNSET


class SessionLoaded(Answer):
    session: SessionRow
    messages: list[Message]
    head: str | None
    seq: int
    durable_seq: int


class Changed(Answer):
    changed: dict[str, Any]


class Head(Answer):
    session_id: str
    head: str | None


class MessageAppended(Answer):
    session_id: str
    msg_id: str


class ChatAck(Answer):
    session_id: str
    msg_id: str
    reply_id: str


class RetryStarted(Answer):
    session_id: str
    retried: str
    reply_id: str


class ReplyOpened(Answer):
    session_id: str
    reply_id: str
    stream: str             # its Durable Streams URL: read it, append to it, close it
    producer_timeout: float


class ProducerIds(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The Durable Streams protocol's idempotent producer (its three headers)."""
    id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    epoch: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]
    seq: Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]


class AppendItem(Body):
    """One append to one external reply, as `POST {stream}` would make it."""
    session_id: Sid
    reply_id: Sid
    text: str = ""
    producer: ProducerIds | None = None
    close: Literal["done", "error"] | None = None
    error: Annotated[str, msgspec.Meta(max_length=2000)] | None = None


class Appends(Body):
    """Appends to many external replies in one request (a backend streaming
    many replies at once), applied in order, each answered on its own."""
    appends: Annotated[list[AppendItem], msgspec.Meta(min_length=1, max_length=10_000)]


class AppendDone(msgspec.Struct, kw_only=True, omit_defaults=True):
    status: int                       # as `POST {stream}` would have answered
    next_offset: int | None = None    # characters in the reply after it
    producer_seq: int | None = None   # the highest accepted seq of its producer
    closed: str | None = None         # how the reply ended, when it ended
    error: ErrorDetail | None = None


class AppendsDone(Answer):
    results: list[AppendDone]


class ReplyProgressed(Answer):
    reply_id: str
    tokens: Tokens


class Stopped(Answer):
    msg_id: str


class Project(Answer):
    id: str
    name: str
    path: str
    is_default: bool
    path_missing: bool


class ProjectList(Answer):
    projects: list[Project]


class ProjectCreated(Answer):
    project: Project


class Relocated(Answer):
    ok: bool
    old_path: str
    path: str
    node_id: str


class RunningReply(Answer):
    session_id: str
    msg_id: str
    kind: str
    role: str
    caller: str | None
    started_at: float | None
    length: int
    owner: str | UnsetType = UNSET


class RunningList(Answer):
    running: list[RunningReply]


class SearchHit(Answer):
    session_id: str
    msg_id: str
    role: str
    kind: str
    at: float
    snippet: str          # the message's text around the matches ("…" where cut)
    marks: list[list[int]]  # [start, end) of each match in `snippet`, in code points
    title: str
    archived: bool


class SearchResults(Answer):
    query: str
    hits: list[SearchHit]
    indexing: bool        # a start is still indexing sessions written while it was down: more may come
    complete: bool        # false: the index stopped writing (the server's log says why): older hits only


class ErrorDetail(Answer):
    code: str
    message: str


class Error(Answer):
    """Every refusal: its stable code (docs/HTTP.md, docs/PROTOCOL.md) and words for people."""
    error: ErrorDetail
