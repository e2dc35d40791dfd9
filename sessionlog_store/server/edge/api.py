"""The HTTP API under /v1/ (docs/HTTP.md): the WebSocket's operations over
plain HTTP/JSON, on the same port, with the same authenticators, scoping,
quotas and error codes, and the same store calls underneath
(operations.py: each request is one action of its user).

A request is routed by method and path (`ROUTES`), its query or body
decoded into the msgspec type the route names (apitypes.py; unknown fields
refused), carried out, and its answer checked against the route's answer
type before it is sent: what /v1/openapi.json says (openapi.py, made from
the same table) is what is sent. Errors are `{"error": {code, message}}`
with the status `STATUS` gives the code.
"""
from __future__ import annotations

import logging
import re
from typing import Any, Final, Protocol
from urllib.parse import parse_qsl, urlsplit

import msgspec
import trio
from msgspec import UNSET

from sessionlog_store.projections.dstream import Refused
from sessionlog_store.server.domain.errors import ServiceError
from sessionlog_store.server.edge import apitypes as t
from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.edge.aisdk import ALLOW_HEADERS, AiChat, is_ai_path
from sessionlog_store.server.edge.auth import REFUSED, Principal
from sessionlog_store.server.edge.connection import error_of
from sessionlog_store.server.edge.http import MAX_BODY, Exchange, Request
from sessionlog_store.server.edge.logstream import LogTaps, SessionLogStream
from sessionlog_store.server.edge.namespace import Namespace
from sessionlog_store.server.edge.openapi import openapi_document
from sessionlog_store.server.edge.operations import Operations, OperationsHost
from sessionlog_store.server.edge.routes import Call, Route
from sessionlog_store.server.edge.producers import Producers, SeqGap, StaleEpoch
from sessionlog_store.server.edge.streams import MessageStream, encode_offset, stream_tag

log = logging.getLogger("sessionlog.http")

V1: Final = "/v1/"
# Any API version's prefix: a major version this server does not speak is
# answered 404 unsupported_version (docs/HTTP.md: Versions).
VERSIONED: Final = re.compile(r"^/v\d+(/|$)")
STREAM: Final = "/v1/stream/"
_MESSAGE_STREAM: Final = re.compile(r"^/v1/stream/sessions/(?P<session_id>[^/]+)/messages/(?P<msg_id>[^/]+)$")
_LOG_STREAM: Final = re.compile(r"^/v1/stream/sessions/(?P<session_id>[^/]+)$")
JSON: Final = "application/json"
# CORS for the generic streams (to an origin of --allow-origin): what a
# browser may send, and read of the answers.
STREAM_REQUEST_HEADERS: Final = ("Authorization, Content-Type, If-None-Match, Stream-Seq, Stream-TTL, "
                                 "Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, "
                                 "Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset")
STREAM_EXPOSED: Final = ("Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, "
                         "Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, "
                         "Producer-Expected-Seq, Producer-Received-Seq, ETag, Location")

# An error code's HTTP status; a code not named here is a 400 (the caller's input).
STATUS: Final[dict[str, int]] = {
    "unauthorized": 401, "forbidden": 403,
    "unknown_session": 404, "unknown_message": 404, "unknown_project": 404, "not_found": 404,
    "method_not_allowed": 405,
    "session_exists": 409, "reply_running": 409, "message_running": 409, "not_retryable": 409,
    "message_finished": 409, "project_frozen": 409, "project_not_bound": 409, "project_not_missing": 409,
    "path_in_use": 409, "default_project": 409, "not_running": 409, "read_only": 409, "shutting_down": 503,
    "not_producer": 409, "content_type_mismatch": 409, "producer_seq_gap": 409, "stale_epoch": 403,
    "frame_too_large": 413, "body_too_large": 413, "body_timeout": 408,
    "rate_limited": 429, "limit_sessions": 429, "limit_projects": 429, "limit_running": 429,
    "store_broken": 503, "unavailable": 503, "internal": 500,
}


def status_of(code: str) -> int:
    return STATUS.get(code, 400)


class ApiError(Exception):
    def __init__(self, code: str, message: str, status: int | None = None, allow: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, message, status or status_of(code)
        self.headers = {**(headers or {}), **({"Allow": allow} if allow else {})}


# -- the handlers: each one action (or a few) through the operations -------------

async def _list(c: Call) -> Any:
    q: t.SessionQuery = c.query
    filters = {f: getattr(q, f) for f in t.FILTER_FIELDS if getattr(q, f) is not UNSET}
    kind, data = await c.ops.run(p.ListSessions(
        filters=filters or None, include_archived=q.include_archived, offset=q.offset,
        archived=None if q.archived is UNSET else q.archived, limit=None if q.limit is UNSET else q.limit,
        since=None if q.since is UNSET else q.since))
    return {"type": kind, **data}


async def _create(c: Call) -> Any:
    b: t.NewSession = c.body
    return (await c.ops.run(p.CreateSession(agent_id=b.agent_id, project_id=b.project_id, source=b.source,
                                            title=b.title)))[1]


async def _load(c: Call) -> Any:
    msg_id = c.query.msg_id
    return (await c.ops.run(p.LoadSession(session_id=c.args["session_id"],
                                          msg_id=None if msg_id is UNSET else msg_id)))[1]


async def _patch(c: Call) -> Any:
    b: t.SessionPatch = c.body
    sid = c.args["session_id"]
    actions: list[p.ClientAction] = []
    if b.title is not None or b.regenerate_title:
        actions.append(p.RenameSession(session_id=sid, title=b.title, regenerate=b.regenerate_title))
    if b.archived is not None:
        actions.append(p.SetArchived(session_id=sid, archived=b.archived))
    if b.pinned is not None:
        actions.append(p.SetPinned(session_id=sid, pinned=b.pinned))
    if b.unread is not None:
        actions.append(p.SetUnread(session_id=sid, unread=b.unread))
    if b.project_id is not None:
        actions.append(p.SetSessionProject(session_id=sid, project_id=b.project_id))
    if not actions:
        c.ops.own(sid)  # (an empty patch of an unknown session is still unknown)
    changed: dict[str, Any] = {}
    for action in actions:
        _, data = await c.ops.run(action)
        got = data.get("changed", {})
        if isinstance(action, p.RenameSession):  # (its answer says whether the title changed)
            got = {"title": c.ops.store.get_meta(sid).title} if got else {}
        changed.update(got)
    return {"changed": changed}


async def _delete(c: Call) -> None:
    await c.ops.run(p.DeleteSession(session_id=c.args["session_id"]))


async def _append(c: Call) -> Any:
    b: t.NewMessage = c.body
    sid = c.args["session_id"]
    msg_id = await c.ops.append_message(sid, b.content, role=b.role, kind=b.kind, parent_id=b.parent_id,
                                        metadata=b.metadata)
    return {"session_id": sid, "msg_id": msg_id}


async def _branch(c: Call) -> Any:
    _, data = await c.ops.run(p.SwitchBranch(session_id=c.args["session_id"], msg_id=c.body.msg_id))
    return {"session_id": data["session_id"], "head": data["head"]}


async def _stop(c: Call) -> Any:
    _, data = await c.ops.run(p.Stop(session_id=c.args["session_id"], msg_id=c.args["msg_id"]))
    return {"msg_id": data["msg_id"]}


async def _retry(c: Call) -> Any:
    return (await c.ops.run(p.Retry(session_id=c.args["session_id"], msg_id=c.args["msg_id"])))[1]


async def _chat(c: Call) -> Any:
    b: t.NewChat = c.body
    return (await c.ops.run(p.Chat(content=b.content, session_id=b.session_id, project_id=b.project_id,
                                   agent_id=b.agent_id, source=b.source)))[1]


async def _relocate(c: Call) -> Any:
    b: t.Relocation = c.body
    return (await c.ops.run(p.RelocateProject(session_id=c.args["session_id"], project_id=b.project_id,
                                              path=b.path)))[1]


async def _open_reply(c: Call) -> Any:
    b: t.NewReply = c.body
    sid = c.args["session_id"]
    reply = await c.ops.open_reply(sid, kind=b.kind, parent_id=b.parent_id, caller=b.caller, role=b.role,
                                   metadata=b.metadata)
    return {"session_id": sid, "reply_id": reply.msg_id, "stream": f"{STREAM}sessions/{sid}/messages/{reply.msg_id}",
            "producer_timeout": c.ops.server.producer_timeout}


async def _reply_progress(c: Call) -> Any:
    b: t.ReplyProgress = c.body
    sid, rid = c.args["session_id"], c.args["reply_id"]
    c.ops.own(sid)
    producers = c.ops.server.producers
    tokens = (b.tokens.input, b.tokens.output) if b.tokens is not None else None
    return {"reply_id": rid, "tokens": await producers.progress(producers.reply_of(sid, rid), tokens, b.tree)}


async def _appends(c: Call) -> Any:
    """Many replies' appends in one request: each as its own `POST {stream}`
    (the same checks, producer rules and answers), in order."""
    b: t.Appends = c.body
    producers = c.ops.server.producers
    owned: set[str] = set()
    out: list[dict[str, Any]] = []
    for a in b.appends:
        sid, rid = a.session_id, a.reply_id
        try:
            if sid not in owned:
                c.ops.own(sid)
                owned.add(sid)
            if not a.text and a.close is None:
                raise ServiceError("bad_request", "an empty append (no text and no close)")
            who = (a.producer.id, a.producer.epoch, a.producer.seq) if a.producer is not None else None
            got = producers.retried(sid, rid, who)
            if got is None:
                got = await producers.append(producers.reply_of(sid, rid), a.text, who, a.close, a.error)
            out.append({"status": got.status, "next_offset": got.next_offset,
                        "producer_seq": got.producer[1] if got.producer is not None else None, "closed": got.closed})
        except ServiceError as e:
            out.append({"status": status_of(e.code), "error": {"code": e.code, "message": e.message}})
    return {"results": out}


async def _search(c: Call) -> Any:
    q: t.SearchQuery = c.query
    return (await c.ops.run(p.Search(query=q.q, limit=q.limit, offset=q.offset)))[1]


async def _running(c: Call) -> Any:
    return (await c.ops.run(p.ListRunning()))[1]


async def _projects(c: Call) -> Any:
    return (await c.ops.run(p.ListProjects()))[1]


async def _new_project(c: Call) -> Any:
    b: t.NewProject = c.body
    return (await c.ops.run(p.CreateProject(name=b.name, path=b.path)))[1]


_S = "/v1/sessions/{session_id}"
ROUTES: Final = (
    Route("GET", "/v1/sessions", "listSessions", "The user's sessions, newest first (or the changes since `since`)",
          _list, t.SessionList | t.SessionChanges, query=t.SessionQuery, errors=(400, 401)),
    Route("POST", "/v1/sessions", "createSession", "A new session, durable at birth, with no message",
          _create, t.SessionCreated, 201, body=t.NewSession, errors=(400, 401, 404, 429)),
    Route("GET", _S, "loadSession", "A session and the messages of its current branch (or of the branch "
          "through `msg_id`)", _load, t.SessionLoaded, query=t.LoadQuery),
    Route("PATCH", _S, "updateSession", "Rename (or regenerate the title), archive, pin, mark unread, bind a "
          "project", _patch, t.Changed, body=t.SessionPatch, errors=(400, 401, 404, 409)),
    Route("DELETE", _S, "deleteSession", "Delete a session (a durable tombstone)", _delete, None, 204),
    Route("POST", f"{_S}/messages", "appendMessage", "Append a finished message on the current branch",
          _append, t.MessageAppended, 201, body=t.NewMessage, errors=(400, 401, 404, 409)),
    Route("POST", f"{_S}/branch", "switchBranch", "Make the branch through a message the current one",
          _branch, t.Head, body=t.BranchSwitch),
    Route("POST", f"{_S}/messages/{{msg_id}}/stop", "stopMessage", "Stop a running reply (it ends aborted, "
          "\"stopped by user\")", _stop, t.Stopped, errors=(400, 401, 404, 409)),
    Route("POST", f"{_S}/messages/{{msg_id}}/retry", "retryMessage", "A new reply beside a finished one",
          _retry, t.RetryStarted, 201, errors=(400, 401, 404, 409, 429)),
    Route("POST", f"{_S}/replies", "openReply", "A reply an external producer streams into (its placeholder "
          "durable on return): append to its `stream`, close it to end it", _open_reply, t.ReplyOpened, 201,
          body=t.NewReply, errors=(400, 401, 404, 409, 429)),
    Route("PATCH", f"{_S}/replies/{{reply_id}}", "replyProgress", "A running reply's token totals and agentic "
          "tree, from its external producer", _reply_progress, t.ReplyProgressed, body=t.ReplyProgress,
          errors=(400, 401, 404, 409)),
    Route("POST", "/v1/appends", "appendMany", "Appends to many external replies in one request (a backend "
          "streaming many at once): each answered as its own append", _appends, t.AppendsDone, body=t.Appends,
          errors=(400, 401, 429)),
    Route("POST", f"{_S}/relocate", "relocateProject", "Point a session's project at its moved folder",
          _relocate, t.Relocated, body=t.Relocation, errors=(400, 401, 404, 409)),
    Route("POST", "/v1/chat", "chat", "A user's message and the server's agent's reply to it (in a new "
          "session without `session_id`)", _chat, t.ChatAck, 201, body=t.NewChat, errors=(400, 401, 404, 409, 429)),
    Route("GET", "/v1/search", "search", "Full-text search over the user's finished messages, best first, with "
          "snippets and the matches' ranges", _search, t.SearchResults, query=t.SearchQuery, errors=(400, 401, 503)),
    Route("GET", "/v1/running", "listRunning", "The replies running now", _running, t.RunningList,
          errors=(400, 401)),
    Route("GET", "/v1/projects", "listProjects", "The default project and the user's", _projects, t.ProjectList,
          errors=(400, 401)),
    Route("POST", "/v1/projects", "createProject", "A project on an existing folder under a project root",
          _new_project, t.ProjectCreated, 201, body=t.NewProject, errors=(400, 401, 409, 429)),
)

def _decode_query(target: str, kind: type) -> Any:
    pairs = parse_qsl(urlsplit(target).query, keep_blank_values=True)
    raw: dict[str, Any] = {}
    for k, v in pairs:
        if k == "token":
            continue  # (the credential of scripts: edge/auth.py)
        if k in raw:
            raise ApiError("bad_request", f"the query names {k!r} twice")
        raw[k] = v  # (strings: converted to the field's type, "true"/"false" to a bool)
    try:
        return msgspec.convert(raw, kind, strict=False)
    except msgspec.ValidationError as e:
        raise ApiError("bad_request", f"bad query: {e}") from None


class ApiHost(OperationsHost, Protocol):
    """What the API asks of its server (edge/ws.py's Server) beyond the operations'."""
    producers: Producers
    log_taps: LogTaps
    namespace: Namespace | None
    live_reads: int
    stopping: trio.Event  # the generic streams (None: this server keeps none)

    def anonymous(self, req: Request, remote: str) -> Principal | None: ...

    def allowed_hosts(self) -> set[str]: ...
    def allowed_origins(self) -> set[str]: ...
    def check_handshake(self, req: Request, trusted_peer: bool) -> Principal | str: ...


class Api:
    """The /v1/ routes of one server."""

    def __init__(self, server: ApiHost, max_body: int = MAX_BODY) -> None:
        self.server = server
        self.max_body = max_body
        self._routes = [(r, r.pattern) for r in ROUTES]
        self._document: bytes | None = None
        self._decoders: dict[type, msgspec.json.Decoder[Any]] = {}
        self._encoder = msgspec.json.Encoder()

    async def handle(self, ex: Exchange, req: Request, body: bytes, remote: str, trusted_peer: bool) -> bool:
        """Answer one /v1/ request; False: close the connection after it."""
        try:
            await self._handle(ex, req, body, remote, trusted_peer)
        except ApiError as e:
            await self._error(ex, e.status, e.code, e.message, e.headers)
        except Refused as e:  # (the generic namespace's: namespace.py)
            await self._error(ex, e.status, e.code, e.message, e.headers)
        except StaleEpoch as e:
            await self._error(ex, 403, e.code, e.message, {"Producer-Epoch": str(e.epoch)})
        except SeqGap as e:
            await self._error(ex, 409, e.code, e.message, {"Producer-Expected-Seq": str(e.expected),
                                                           "Producer-Received-Seq": str(e.received)})
        except msgspec.DecodeError as e:  # (a ValidationError is one)
            await self._error(ex, 400, "bad_request", f"bad body: {e}")
        except ServiceError as e:
            await self._error(ex, status_of(e.code), e.code, e.message)
        except (trio.Cancelled, KeyboardInterrupt):
            raise
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False  # the client went away (a reader leaving its SSE answer): nothing to answer
        except Exception as e:
            code, message = error_of(e)
            if code == "internal":
                log.exception("%s %s failed", req.method, req.path, extra={"remote": remote})
            await self._error(ex, status_of(code), code, message)
        return True

    async def _handle(self, ex: Exchange, req: Request, body: bytes, remote: str, trusted_peer: bool) -> None:
        server = self.server
        if not req.path.startswith(V1):
            raise ApiError("unsupported_version", f"this server speaks API version 1 ({V1}), not "
                           f"{req.path.split('/')[1][:12]!r}", 404)
        if req.path == "/v1/openapi.json" and req.method in ("GET", "HEAD"):
            if req.headers.get("host", "").lower() not in server.allowed_hosts():
                raise ApiError("forbidden", "Host not allowed", 403)
            await ex.reply(200, self.document(), JSON, headers={"Cache-Control": "no-cache"})
            return
        if req.path.startswith(STREAM):
            server.live_reads += 1
            try:
                if req.path.startswith(STREAM + "sessions/") or req.path == STREAM + "sessions":
                    await self._stream(ex, req, body, remote, trusted_peer)
                else:
                    await self._generic(ex, req, body, remote, trusted_peer)
            finally:
                server.live_reads -= 1
            return
        if is_ai_path(req.path):
            server.live_reads += 1
            try:
                await self._ai(ex, req, body, remote, trusted_peer)
            finally:
                server.live_reads -= 1
            return
        route, args = self._route(req)
        who = await self._principal(req, body, trusted_peer)
        call = Call(ops=self._operations(who, remote), args=args,
                    query=_decode_query(req.target, route.query) if route.query is not None else None,
                    body=self._decode(body, route.body) if route.body is not None else None)
        if route.body is None and body:
            raise ApiError("bad_request", f"{route.method} {route.path} takes no body")
        result = await route.handler(call)
        if route.answer is None:
            await ex.reply(route.status)
            return
        try:
            checked: Any = msgspec.convert(result, route.answer)
        except msgspec.ValidationError as e:  # a handler's answer off its own document: ours to fix
            raise RuntimeError(f"{route.name}'s answer does not match its document: {e}") from None
        await ex.reply(route.status, self._encoder.encode(checked), JSON)

    async def _generic(self, ex: Exchange, req: Request, body: bytes, remote: str, trusted_peer: bool) -> None:
        """/v1/stream/<name>: the generic namespace (namespace.py), the
        streams of the request's user (or, in the loopback anonymous mode, of
        nobody's but the anonymous callers')."""
        namespace = self.server.namespace
        if namespace is None:
            raise ApiError("not_found", f"no such stream: {req.path} (this server keeps no generic streams)")
        origin = req.headers.get("origin")
        ex.extra = {"Cross-Origin-Resource-Policy": "cross-origin"}
        if origin is not None and origin.lower() in self.server.allowed_origins():
            ex.extra.update({"Access-Control-Allow-Origin": origin, "Vary": "Origin",
                             "Access-Control-Expose-Headers": STREAM_EXPOSED})
        if req.method == "OPTIONS":  # a browser's preflight (the origin's answer is in ex.extra)
            await ex.reply(204, headers={"Access-Control-Allow-Methods": "GET, HEAD, POST, PUT, DELETE",
                                         "Access-Control-Allow-Headers": STREAM_REQUEST_HEADERS,
                                         "Access-Control-Max-Age": "600"})
            return
        who = await self._principal(req, body, trusted_peer, remote)
        await namespace.answer(ex, req, body, who.user)

    async def _ai(self, ex: Exchange, req: Request, body: bytes, remote: str, trusted_peer: bool) -> None:
        """/v1/ai/chat: the Vercel AI SDK's door (aisdk.py), to a page of
        another origin too when it is one of --allow-origin (CORS)."""
        origin = req.headers.get("origin")
        if origin is not None and origin.lower() in self.server.allowed_origins():
            ex.extra = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if req.method == "OPTIONS":  # a browser's preflight (the origin's answer is in ex.extra)
            await ex.reply(204, headers={"Access-Control-Allow-Methods": "GET, POST", "Vary": "Origin",
                                         "Access-Control-Allow-Headers": ALLOW_HEADERS,
                                         "Access-Control-Max-Age": "600"})
            return
        who = await self._principal(req, body, trusted_peer)
        await AiChat(ex, self._operations(who, remote), self.server.log_taps).answer(req, body)

    async def _principal(self, req: Request, body: bytes, trusted_peer: bool, remote: str | None = None) -> Principal:
        """Who sends the request (as a WebSocket's handshake is checked), within
        its rate. With `remote` (the generic namespace only), a request
        without credentials may be the anonymous principal."""
        server = self.server
        who = server.check_handshake(req, trusted_peer)
        if who == REFUSED and remote is not None:
            who = server.anonymous(req, remote) or who
        if isinstance(who, str):
            if who == REFUSED:
                raise ApiError("unauthorized", who, 401)
            raise ApiError("forbidden", who, 403)
        refused, wait = server.quotas.check_frame(who.user, len(body), trio.current_time())
        if refused is not None:
            raise ApiError(refused.code, refused.message)
        if wait:
            with trio.move_on_after(wait):
                await server.stopping.wait()  # (a stop does not wait for a request held back by the rate)
        if server.store.shutting_down:
            raise ApiError("shutting_down", "the server is shutting down")
        return who

    async def _stream(self, ex: Exchange, req: Request, body: bytes, remote: str, trusted_peer: bool) -> None:
        """/v1/stream/: the Durable Streams protocol (streams.py)."""
        m = _MESSAGE_STREAM.match(req.path)
        log_stream = _LOG_STREAM.match(req.path) if m is None else None
        if log_stream is not None:
            if req.method not in ("GET", "HEAD"):
                raise ApiError("method_not_allowed", f"{req.method} is not allowed here (allowed: GET, HEAD)",
                               allow="GET, HEAD")
            who = await self._principal(req, body, trusted_peer)
            if body:
                raise ApiError("bad_request", "a read takes no body")
            read = SessionLogStream(ex, self._operations(who, remote), self.server.log_taps, req.target,
                                    log_stream["session_id"])
            await read.answer(req.method, req.headers.get("if-none-match", ""))
            return
        if m is None:
            raise ApiError("not_found", f"no such stream: {req.path}")
        if req.method not in ("GET", "HEAD", "POST"):
            raise ApiError("method_not_allowed", f"{req.method} is not allowed here (allowed: GET, HEAD, POST)",
                           allow="GET, HEAD, POST")
        who = await self._principal(req, body, trusted_peer)
        ops = self._operations(who, remote)
        if req.method == "POST":
            await self._append(ex, req, body, ops, m["session_id"], m["msg_id"])
            return
        if body:
            raise ApiError("bad_request", "a read takes no body")
        stream = MessageStream(ex, ops, req.target, m["session_id"], m["msg_id"])
        await stream.answer(req.method, req.headers.get("if-none-match", ""))

    async def _append(self, ex: Exchange, req: Request, body: bytes, ops: Operations, sid: str, mid: str) -> None:
        """An external producer's append (and, with `Stream-Closed: true`, the reply's end): producers.py."""
        h = req.headers
        ctype = h.get("content-type", "").split(";")[0].strip().lower()
        close = h.get("stream-closed", "").strip().lower() == "true"
        if not ctype and body:
            raise ApiError("bad_request", "an append needs Content-Type: text/plain")
        if body and ctype != "text/plain":
            raise ApiError("content_type_mismatch", f"this stream is text/plain, not {ctype[:60]!r}", 409)
        if not body and not close:
            raise ApiError("bad_request", "an empty append (no body and no Stream-Closed: true)")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError("bad_request", "the body is not UTF-8") from None
        names = ("producer-id", "producer-epoch", "producer-seq")
        given = [h.get(n) for n in names]
        producer = None
        if any(v is not None for v in given):
            pid, epoch, seq = (v.strip() if v is not None else "" for v in given)
            if not pid or not epoch.isdigit() or not seq.isdigit() or max(int(epoch), int(seq)) > 2**53 - 1:
                raise ApiError("bad_request", "Producer-Id, Producer-Epoch and Producer-Seq go together: "
                               "a non-empty id and two integers from 0 to 2^53-1")
            producer = (pid, int(epoch), int(seq))
        status = h.get("stream-status", "done").strip().lower() if close else None
        if status not in (None, "done", "error"):
            raise ApiError("bad_request", "Stream-Status: done or error")
        ops.own(sid)
        producers = self.server.producers
        got = producers.retried(sid, mid, producer)
        if got is None:
            reply = producers.reply_of(sid, mid)
            got = await producers.append(reply, text, producer, status, h.get("stream-error"))
        headers = {"Stream-Next-Offset": encode_offset(got.next_offset, stream_tag(sid, mid))}
        if got.producer is not None:
            headers.update({"Producer-Epoch": str(got.producer[0]), "Producer-Seq": str(got.producer[1])})
        if got.closed is not None:
            headers.update({"Stream-Closed": "true", "Stream-Status": got.closed})
        await ex.reply(got.status, headers=headers)

    def _route(self, req: Request) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route, pattern in self._routes:
            m = pattern.match(req.path)
            if m is None:
                continue
            if route.method == req.method or (req.method == "HEAD" and route.method == "GET"):
                return route, m.groupdict()
            allowed.append(route.method)
        if allowed:
            methods = sorted({*allowed, *(["HEAD"] if "GET" in allowed else [])})
            raise ApiError("method_not_allowed", f"{req.method} is not allowed here (allowed: {', '.join(methods)})",
                           allow=", ".join(methods))
        raise ApiError("not_found", f"no such endpoint: {req.method} {req.path}")

    def _operations(self, who: Principal, remote: str) -> Operations:
        return Operations(self.server, who, remote)

    def _decode(self, body: bytes, kind: type) -> Any:
        if not body.strip():
            raise ApiError("bad_request", "a JSON body is needed")
        dec = self._decoders.get(kind)
        if dec is None:
            dec = self._decoders[kind] = msgspec.json.Decoder(kind)
        return dec.decode(body)

    async def refuse(self, ex: Exchange, status: int, message: str) -> None:
        """A request the edge refused while reading its body (413, 408, 400):
        answered, and the connection closes."""
        code = {413: "body_too_large", 408: "body_timeout"}.get(status, "bad_request")
        await ex.reply(status, self._encoder.encode(t.Error(error=t.ErrorDetail(code=code, message=message))),
                       JSON, close=True)

    async def _error(self, ex: Exchange, status: int, code: str, message: str,
                     headers: dict[str, str] | None = None) -> None:
        if status == 401:
            headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="sessionlog"'}
        await ex.reply(status, self._encoder.encode(t.Error(error=t.ErrorDetail(code=code, message=message))),
                       JSON, headers=headers)

    def document(self) -> bytes:
        if self._document is None:
            self._document = self._encoder.encode(openapi_document(ROUTES, STATUS))
        return self._document
