"""The WebSocket protocol, pure: client frames as one tagged union on `action`,
server frames as `{"type": ..., "data": {...}, "request_id"?}`. No sockets
here; server/edge/ws.py is the adapter. docs/PROTOCOL.md documents every field.
"""
from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

# A client frame longer than this gets a `frame_too_large` error (and the
# connection stays); one longer than WS_HARD_LIMIT closes the connection with
# 1009, as trio-websocket does. A chat message of 1 MiB is a book chapter.
MAX_FRAME: Final = 1024 * 1024
WS_HARD_LIMIT: Final = 4 * MAX_FRAME
# Rows one list_sessions may return (the registry holds up to ~1000 by default).
MAX_LIMIT: Final = 10_000

RequestId = str | int | None
Sid = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
Short = Annotated[str, msgspec.Meta(max_length=200)]
Scalar = str | int | bool | None
Count = Annotated[int, msgspec.Meta(ge=0, le=2**53)]


class Action(msgspec.Struct, frozen=True, kw_only=True, tag_field="action", forbid_unknown_fields=True):
    request_id: RequestId = None


class ListSessions(Action, tag="list_sessions", kw_only=True, frozen=True):
    filters: dict[Short, Scalar] | None = None
    include_archived: bool = False
    archived: bool | None = None
    offset: Count = 0
    limit: Annotated[int, msgspec.Meta(ge=0, le=MAX_LIMIT)] | None = None
    # A position from an earlier `sessions_list` or push (`rev`): answer with the
    # changes since then (`sessions_changes`), or a full list with `relist: true`.
    since: Short | None = None


class CreateSession(Action, tag="create_session", kw_only=True, frozen=True):
    agent_id: Short = "default"
    project_id: Short | None = None
    source: Short = "web"
    title: Short = ""


class LoadSession(Action, tag="load_session", kw_only=True, frozen=True):
    session_id: Sid
    # Read the branch through this message (to its tip) without switching to it.
    msg_id: Sid | None = None


class SwitchBranch(Action, tag="switch_branch", kw_only=True, frozen=True):
    session_id: Sid
    msg_id: Sid


class ListRunning(Action, tag="list_running", kw_only=True, frozen=True):
    pass


class Search(Action, tag="search", kw_only=True, frozen=True):
    """Full-text search over the user's finished messages (server/local/search.py)."""
    query: Annotated[str, msgspec.Meta(max_length=500)]
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20
    offset: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 0


class Chat(Action, tag="chat", kw_only=True, frozen=True):
    session_id: Sid | None = None
    content: str
    project_id: Short | None = None
    agent_id: Short | None = None
    # Where a new session comes from (a channel: "wechat", "discord"...); only
    # with no session_id: the session is born with its first message, one write.
    source: Short | None = None


class SubscribeMsg(Action, tag="subscribe_msg", kw_only=True, frozen=True):
    session_id: Sid
    msg_id: Sid
    after_seq: Count | None = None
    offset: Count | None = None


class UnsubscribeMsg(Action, tag="unsubscribe_msg", kw_only=True, frozen=True):
    session_id: Sid
    msg_id: Sid


class Stop(Action, tag="stop", kw_only=True, frozen=True):
    session_id: Sid
    msg_id: Sid


class Retry(Action, tag="retry", kw_only=True, frozen=True):
    session_id: Sid
    msg_id: Sid


class RenameSession(Action, tag="rename_session", kw_only=True, frozen=True):
    session_id: Sid
    title: Annotated[str, msgspec.Meta(max_length=500)] | None = None
    regenerate: bool = False


class SetArchived(Action, tag="set_archived", kw_only=True, frozen=True):
    session_id: Sid
    archived: bool


class SetPinned(Action, tag="set_pinned", kw_only=True, frozen=True):
    session_id: Sid
    pinned: bool


class SetUnread(Action, tag="set_unread", kw_only=True, frozen=True):
    session_id: Sid
    unread: bool


class DeleteSession(Action, tag="delete_session", kw_only=True, frozen=True):
    session_id: Sid


class SetSessionProject(Action, tag="set_session_project", kw_only=True, frozen=True):
    session_id: Sid
    project_id: Short


class ListProjects(Action, tag="list_projects", kw_only=True, frozen=True):
    pass


class CreateProject(Action, tag="create_project", kw_only=True, frozen=True):
    name: Short = ""
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class RelocateProject(Action, tag="relocate_project", kw_only=True, frozen=True):
    session_id: Sid
    project_id: Short
    path: Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


ClientAction = (ListSessions | CreateSession | LoadSession | Chat | SubscribeMsg | UnsubscribeMsg | Stop
                | Retry | SwitchBranch | RenameSession | SetArchived | SetPinned | SetUnread | DeleteSession
                | SetSessionProject | ListProjects | CreateProject | RelocateProject | ListRunning | Search)

ACTIONS: Final = frozenset(c.__struct_config__.tag for c in ClientAction.__args__)


class _Head(msgspec.Struct):
    """What can be read of any object frame, to name it in an error."""
    action: Any = None
    request_id: Any = None


_HEAD: Final = msgspec.json.Decoder(_Head)
_DECODER: Final = msgspec.json.Decoder(ClientAction)
_ENCODER: Final = msgspec.json.Encoder()


class ProtocolError(Exception):
    """A bad client frame: `code` and `message` go back in the error frame."""

    def __init__(self, code: str, message: str, action: str | None = None,
                 request_id: RequestId = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.action = action
        self.request_id = request_id


# Every error code a client can receive, with its meaning (docs/PROTOCOL.md).
ERROR_CODES: Final = {
    "bad_json": "the frame is not valid JSON",
    "bad_frame": "the frame is not a JSON object, is binary, or is nested too deeply",
    "frame_too_large": f"the frame is over {MAX_FRAME} bytes",
    "unknown_action": "`action` is missing or not one of the actions",
    "bad_request": "a field is unknown, missing or of the wrong type",
    "bad_field": "a value is not acceptable (empty title, bad kind...)",
    "bad_filter": "list_sessions filters on a field that cannot be filtered",
    "bad_offset": "subscribe_msg names an offset beyond the message's content",
    "bad_path": "a project path is not an existing folder under a project root (whatever is wrong, one answer)",
    "limit_sessions": "the user owns as many sessions as allowed (--limit-sessions)",
    "limit_running": "the user has as many replies running as allowed (--limit-running)",
    "rate_limited": "the user sent frames faster than allowed (--limit-rate); that frame was not handled",
    "invalid_session_id": "a session id is not a short file-name-safe token",
    "unknown_session": "no such session (or it was deleted)",
    "unknown_message": "no such message in that session",
    "unknown_project": "no such project",
    "project_frozen": "project is frozen after the first turn",
    "default_project": "the default project cannot be relocated",
    "project_not_missing": "relocate_project only repairs a project whose folder is missing",
    "path_in_use": "another project of the same user already points at that folder",
    "project_not_bound": "relocate_project named a session that is not bound to that project",
    "not_conversational": "switch_branch named a tool call or relocation node, which is on no branch",
    "not_running": "stop named a message that is not running here",
    "message_running": "retry named a message that is still running",
    "not_retryable": "retry named a message that is not an assistant reply",
    "read_only": "the session is quarantined (damaged log) until `sessionlog repair`",
    "too_many_subscriptions": "this connection has too many subscriptions",
    "shutting_down": "the server is shutting down",
    "store_broken": "a disk write or sync failed; the server must be restarted",
    "too_slow": "a subscription was dropped because the client fell behind; subscribe again",
    "internal": "a bug in the server; the request may not have been carried out",
}


def peek(frame: str | bytes) -> tuple[str | None, RequestId]:
    """The action and request_id of a frame that will not be handled (to
    answer it), or (None, None) when they cannot be read."""
    try:
        head = _HEAD.decode(frame)
    except (msgspec.DecodeError, RecursionError):
        return None, None
    action = head.action if isinstance(head.action, str) and head.action in ACTIONS else None
    rid = head.request_id if isinstance(head.request_id, str | int) and not isinstance(head.request_id, bool) else None
    return action, rid


def decode_action(frame: str | bytes) -> ClientAction:
    """Decode one client frame, or raise ProtocolError naming what is wrong."""
    if isinstance(frame, bytes):
        raise ProtocolError("bad_frame", "binary frames are not part of the protocol; send JSON text")
    data = frame.encode("utf-8", "surrogatepass") if isinstance(frame, str) else frame
    if len(data) > MAX_FRAME:
        raise ProtocolError("frame_too_large", f"frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    try:
        head = _HEAD.decode(data)
    except RecursionError:
        raise ProtocolError("bad_frame", "the frame is nested too deeply") from None
    except msgspec.ValidationError:
        raise ProtocolError("bad_frame", "a frame must be a JSON object") from None
    except msgspec.DecodeError as e:
        raise ProtocolError("bad_json", f"not valid JSON: {e}") from None
    action = head.action if isinstance(head.action, str) else None
    rid = head.request_id if isinstance(head.request_id, str | int) and not isinstance(head.request_id, bool) \
        else None
    if action not in ACTIONS:
        shown = repr(head.action)[:60]
        raise ProtocolError("unknown_action", f"unknown action {shown}; known: {', '.join(sorted(ACTIONS))}",
                            None, rid)
    try:
        return _DECODER.decode(data)
    except RecursionError:
        raise ProtocolError("bad_frame", "the frame is nested too deeply", action, rid) from None
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ProtocolError("bad_request", f"{action}: {e}", action, rid) from None


def encode_frame(type_: str, data: Any, request_id: RequestId = None) -> str:
    frame: dict[str, Any] = {"type": type_, "data": data}
    if request_id is not None:
        frame["request_id"] = request_id
    return _ENCODER.encode(frame).decode()


def encode_error(code: str, message: str, action: str | None = None, request_id: RequestId = None) -> str:
    return encode_frame("error", {"action": action, "code": code, "message": message,
                                  "request_id": request_id}, request_id)


def to_wire(obj: Any) -> Any:
    """Structs (rows, messages, updates) as plain JSON-ready values."""
    return msgspec.to_builtins(obj)
