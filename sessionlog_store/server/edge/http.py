"""The HTTP/1.1 side of the port, through h11: read one request head, answer
it and close, or hand a WebSocket upgrade to wsproto (trio-websocket).

One request per connection (every answer says `Connection: close`): the page
is four small files and the rest of the traffic is one WebSocket.
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
HEAD_TIMEOUT: Final = 10.0
REPLY_TIMEOUT: Final = 5.0
# How long a refused client may go on sending before we close (nginx: lingering_time 30 s,
# lingering_timeout 5 s; a refused head needs far less).
LINGER: Final = 2.0
_BARE_LF: Final = re.compile(rb"(?<!\r)\n")
_FOLDED: Final = re.compile(rb"\r\n[ \t]")
_COMMON: Final = [(b"Cache-Control", b"no-store"), (b"X-Content-Type-Options", b"nosniff"),
                  (b"Connection", b"close")]


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

    async def read_request(self) -> Request | None:
        """The request head, or None when it is malformed, over MAX_HEAD bytes,
        not HTTP/1.0 or 1.1, has a bare LF line end or a folded header line,
        repeats Host or Origin, or does not arrive within HEAD_TIMEOUT."""
        raw = b""
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
                    return None  # the peer closed before a whole head
                break
        if not isinstance(event, h11.Request):
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

    async def reply(self, status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8",
                    headers: dict[str, str] | None = None) -> None:
        """Answer and let the caller close. A HEAD request gets the headers only."""
        fields = [*([] if status == 204 else [(b"Content-Type", content_type.encode()),
                                              (b"Content-Length", str(len(body)).encode())]),
                  *_COMMON, *((k.encode(), v.encode("latin-1")) for k, v in (headers or {}).items())]
        try:
            data = self.h11.send(h11.Response(status_code=status, headers=fields,
                                              reason=HTTPStatus(status).phrase.encode()))
            if not self._head_only:  # a HEAD's answer ends with its head (we close after it)
                if body:
                    data += self.h11.send(h11.Data(data=body)) or b""
                data += self.h11.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:  # no answer fits this state (a broken head): just close
            return
        with trio.move_on_after(REPLY_TIMEOUT):
            await self.stream.send_all(data)

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
