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
_BARE_LF: Final = re.compile(rb"(?<!\r)\n")
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
        return urlsplit(self.target).path

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(urlsplit(self.target).query)


class Exchange:
    """One connection's request and its answer."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.request: Request | None = None

    async def read_request(self) -> Request | None:
        """The request head, or None when it is malformed, too long, repeats
        Host or Origin, or does not arrive within HEAD_TIMEOUT."""
        raw = b""
        with trio.move_on_after(HEAD_TIMEOUT):
            while True:
                try:
                    event = self.h11.next_event()
                except h11.RemoteProtocolError:
                    return None
                if event is h11.NEED_DATA:
                    data = bytes(await self.stream.receive_some(4096))
                    raw += data
                    self.h11.receive_data(data)
                    continue
                if not isinstance(event, h11.Request):
                    return None  # the peer closed before a whole head
                break
        if not isinstance(event, h11.Request):
            return None  # timed out
        head = raw[:len(raw) - len(self.h11.trailing_data[0])]
        if _BARE_LF.search(head):
            # RFC 9112 lets a server take a bare LF for a line end; a proxy in
            # front may not (one header to it, two to us): refuse it
            return None
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            if key in headers:
                if key in ("host", "origin"):
                    return None  # a repeated Host or Origin is ambiguous: refuse
                headers[key] += ", " + text
            else:
                headers[key] = text
        self.request = Request(event.method.decode("latin-1"), event.target.decode("latin-1"), headers,
                               list(event.headers))
        return self.request

    async def reply(self, status: int, body: bytes = b"", content_type: str = "text/plain; charset=utf-8",
                    headers: dict[str, str] | None = None) -> None:
        """Answer and let the caller close. A HEAD request gets the headers only."""
        fields = [(b"Content-Type", content_type.encode()), (b"Content-Length", str(len(body)).encode()),
                  *_COMMON, *((k.encode(), v.encode("latin-1")) for k, v in (headers or {}).items())]
        try:
            data = self.h11.send(h11.Response(status_code=status, headers=fields,
                                              reason=HTTPStatus(status).phrase.encode()))
            if body and not (self.request is not None and self.request.method == "HEAD"):
                data += self.h11.send(h11.Data(data=body)) or b""
            data += self.h11.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:  # no answer fits this state (a broken head): just close
            return
        with trio.move_on_after(REPLY_TIMEOUT):
            await self.stream.send_all(data)

    async def upgrade(self, nursery: trio.Nursery, max_message_size: int) -> WebSocketRequest:
        """Hand the (checked) upgrade request to wsproto, as its
        `initiate_upgrade_connection` is meant for: a request another HTTP
        parser already read. The WebSocket's reader runs in `nursery`."""
        assert self.request is not None
        ws = WSConnection(ConnectionType.SERVER)
        ws.initiate_upgrade_connection(self.request.raw_headers, self.request.target)
        trailing, _closed = self.h11.trailing_data
        if trailing:  # frames the client sent before our 101 (allowed to pipeline)
            ws.receive_data(trailing)
        conn = WebSocketConnection(self.stream, ws, max_message_size=max_message_size)
        # What trio_websocket.wrap_server_stream does after making its own
        # WSConnection (it cannot be given ours); pinned in pyproject.toml.
        nursery.start_soon(conn._reader_task)
        return await conn._get_request()
