"""The HTTP/1.1 side of the port, through h11: read a request head (and its
body, within a size and a deadline), answer it, and read the next one on
the same connection (keep-alive); or hand a WebSocket upgrade to wsproto
(trio-websocket). An answer may stream (`start_stream`/`send`/`end_stream`:
chunked, for SSE).

A connection closes after a refusal (`reply(..., close=True)`), when the
client asks (HTTP/1.0, `Connection: close`), when a request's body was not
read to its end, and when no next head arrives within HEAD_TIMEOUT.
Measured against an ASGI stack on trio: bench/README.md, "The HTTP side's
stack".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Final
from urllib.parse import parse_qs, urlsplit

import re

import h11
import trio
from trio_websocket import WebSocketConnection, WebSocketRequest
from wsproto import ConnectionType, WSConnection

# Request heads longer than this are refused (nginx's default is 8 KiB; 16 KiB
# leaves room for long cookies on localhost).
MAX_HEAD: Final = 16 * 1024
# A head must arrive within this (on a kept-alive connection: the next head).
HEAD_TIMEOUT: Final = 10.0
# Request bodies: at most this many bytes (413 past it), the whole body within
# BODY_TIMEOUT (408: a client trickling a body holds no connection for long).
MAX_BODY: Final = 1024 * 1024
BODY_TIMEOUT: Final = 10.0
REPLY_TIMEOUT: Final = 5.0
# How long a refused client may go on sending before we close (nginx: lingering_time 30 s,
# lingering_timeout 5 s; a refused head needs far less).
LINGER: Final = 2.0
_BARE_LF: Final = re.compile(rb"(?<!\r)\n")
_FOLDED: Final = re.compile(rb"\r\n[ \t]")
_COMMON: Final = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


class HTTPError(Exception):
    """A request the edge refuses while reading it (its status and text)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]  # names in lower case; a repeated header's values joined by ", "
    raw_headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def path(self) -> str:
        """The target's path ("" when the target cannot be parsed)."""
        try:
            return urlsplit(self.target).path
        except ValueError:  # "//[x/"
            return ""

    @property
    def query(self) -> dict[str, list[str]]:
        try:
            return parse_qs(urlsplit(self.target).query)
        except ValueError:
            return {}


class Exchange:
    """One connection's request and its answer."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.request: Request | None = None
        self._head_only = False  # the request is a HEAD (known before its head parses)
        self.served = 0  # requests answered on this connection
        self.idle_end = False  # the last read_request found the peer gone (or silent) between requests
        self.extra: dict[str, str] = {}  # headers every answer to this request carries (CORS)

    async def read_request(self) -> Request | None:
        """The request head, or None when it is malformed, over MAX_HEAD bytes,
        not HTTP/1.0 or 1.1, has a bare LF line end or a folded header line,
        repeats Host or Origin, or does not arrive within HEAD_TIMEOUT (then
        `idle_end` says whether that was a kept-alive connection's quiet end:
        nothing of a next request came)."""
        raw = bytes(self.h11.trailing_data[0])  # (a pipelined next request's bytes, read already)
        self.request, self.idle_end = None, False
        self._head_only = raw.startswith(b"HEAD ")
        with trio.move_on_after(HEAD_TIMEOUT):
            while True:
                try:
                    event = self.h11.next_event()
                except h11.RemoteProtocolError:
                    return None
                if event is h11.NEED_DATA:
                    if len(raw) > MAX_HEAD:
                        return None
                    data = bytes(await self.stream.receive_some(4096))
                    raw += data
                    self._head_only = raw.startswith(b"HEAD ")
                    self.h11.receive_data(data)
                    continue
                if not isinstance(event, h11.Request):
                    self.idle_end = self.served > 0 and not raw.strip()
                    return None  # the peer closed before a whole head
                break
        if not isinstance(event, h11.Request):
            self.idle_end = self.served > 0 and not raw.strip()
            return None  # timed out
        headers: dict[str, str] = {}
        repeated = False
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            if key in headers:
                repeated |= key in ("host", "origin")
                headers[key] += ", " + text
            else:
                headers[key] = text
        # Known from here on (a refusal to a HEAD carries no body).
        self.request = Request(event.method.decode("latin-1"), event.target.decode("latin-1"), headers,
                               list(event.headers))
        head = raw[:len(raw) - len(self.h11.trailing_data[0])]
        if (len(head) > MAX_HEAD or event.http_version not in (b"1.0", b"1.1") or repeated
                or _BARE_LF.search(head) or _FOLDED.search(head)):
            # A bare LF or a folded line: RFC 9112 lets a server accept them, a
            # proxy in front may read them differently (one header to it, two
            # to us). A repeated Host or Origin is ambiguous. All refused.
            return None
        return self.request

    def upgrade_problem(self) -> tuple[int, str] | None:
        """Why the request is not a WebSocket upgrade wsproto can accept (status, text), or None."""
        req = self.request
        assert req is not None
        if req.method != "GET":
            return 400, "a WebSocket upgrade is a GET"
        if req.headers.get("sec-websocket-version", "").strip() != "13":
            return 426, "Sec-WebSocket-Version 13 is needed"
        if not req.headers.get("sec-websocket-key", "").strip():
            return 400, "no Sec-WebSocket-Key"
        if "upgrade" not in {t.strip().lower() for t in req.headers.get("connection", "").split(",")}:
            return 400, "no Connection: Upgrade"
        if "content-length" in req.headers or "transfer-encoding" in req.headers:
            return 400, "an upgrade has no body"
        return None

    async def read_body(self, limit: int = MAX_BODY) -> bytes:
        """The request's body (b"" for none), whole, within BODY_TIMEOUT.
        Raises HTTPError: 413 over `limit` bytes (said by Content-Length before
        any is read), 408 past the deadline, 400 for a malformed body."""
        declared = (self.request.headers.get("content-length", "") if self.request is not None else "").strip()
        if declared.isdigit() and int(declared) > limit:
            raise HTTPError(413, f"the request body is over {limit} bytes")
        body = bytearray()
        with trio.move_on_after(BODY_TIMEOUT):
            while True:
                try:
                    event = self.h11.next_event()
                except h11.RemoteProtocolError as e:
                    raise HTTPError(400, f"malformed request body: {e}") from None
                if event is h11.NEED_DATA:
                    self.h11.receive_data(bytes(await self.stream.receive_some(65536)))
                    continue
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limit:
                        raise HTTPError(413, f"the request body is over {limit} bytes")
                    continue
                if isinstance(event, h11.EndOfMessage):
                    return bytes(body)
                raise HTTPError(400, "the request body ended early")
        raise HTTPError(408, f"the request body did not arrive within {BODY_TIMEOUT:g} s")

    def _head(self, status: int, headers: dict[str, str], close: bool) -> bytes:
        fields = {**_COMMON, **self.extra, **headers}
        if close:
            fields["Connection"] = "close"
        return self.h11.send(h11.Response(status_code=status, headers=[
            (k.encode(), v.encode("latin-1")) for k, v in fields.items()], reason=HTTPStatus(status).phrase.encode()))

    async def reply(self, status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8",
                    headers: dict[str, str] | None = None, *, close: bool = False) -> None:
        """Answer (with `close`, and after any refusal the caller does not
        follow with `next_cycle`, the connection ends after it). A HEAD
        request gets the headers only."""
        fields = {} if status in (204, 304) else {"Content-Type": content_type, "Content-Length": str(len(body))}
        try:
            data = self._head(status, {**fields, **(headers or {})}, close)
            if not self._head_only:
                if body and status not in (204, 304):
                    data += self.h11.send(h11.Data(data=body)) or b""
                data += self.h11.send(h11.EndOfMessage()) or b""
            elif self.h11.their_state is not h11.ERROR:  # a HEAD h11 read: its answer ends with its head
                data += self.h11.send(h11.EndOfMessage()) or b""
            # (a HEAD h11 refused to read: the head alone, and the connection closes)
        except h11.LocalProtocolError:  # no answer fits this state (a broken head): just close
            return
        self.served += 1
        with trio.move_on_after(REPLY_TIMEOUT):
            await self.stream.send_all(data)

    async def start_stream(self, status: int, content_type: str, headers: dict[str, str] | None = None) -> None:
        """Begin an answer whose body follows in pieces (`send`; chunked on
        HTTP/1.1, to the connection's end on 1.0) until `end_stream`."""
        await self.stream.send_all(self._head(status, {"Content-Type": content_type, **(headers or {})}, False))

    async def send(self, data: bytes) -> None:
        if data:
            await self.stream.send_all(self.h11.send(h11.Data(data=data)) or b"")

    async def end_stream(self) -> None:
        self.served += 1
        await self.stream.send_all(self.h11.send(h11.EndOfMessage()) or b"")

    def next_cycle(self) -> bool:
        """After an answer: ready for the connection's next request, or False
        (close it): the client asked to close, or its body was not read."""
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            self.extra = {}
            return True
        return False

    async def linger(self) -> None:
        """After refusing a head we did not read to its end: half-close, then
        read and drop what the client still sends (for up to LINGER seconds),
        so that closing with unread bytes does not reset the connection and
        take our answer with it (nginx's lingering_close)."""
        try:
            await self.stream.send_eof()  # type: ignore[attr-defined]
            with trio.move_on_after(LINGER):
                while await self.stream.receive_some(65536):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, AttributeError):
            pass

    async def upgrade(self, nursery: trio.Nursery, max_message_size: int) -> WebSocketRequest:
        """Hand the upgrade request (checked by `upgrade_problem`) to wsproto,
        as its `initiate_upgrade_connection` is meant for: a request another
        HTTP parser already read. The WebSocket's reader runs in `nursery`.
        Bytes a client sent after its head and before our 101 are not
        frames (RFC 6455 4.1: a client waits for the 101) and are dropped.
        Raises wsproto's RemoteProtocolError for what it refuses."""
        assert self.request is not None
        ws = WSConnection(ConnectionType.SERVER)
        ws.initiate_upgrade_connection(self.request.raw_headers, self.request.target)
        conn = WebSocketConnection(self.stream, ws, max_message_size=max_message_size)
        # What trio_websocket.wrap_server_stream does after making its own
        # WSConnection (it cannot be given ours); pinned in pyproject.toml.
        nursery.start_soon(conn._reader_task)
        return await conn._get_request()
