"""The HTTP edge (edge/http.py) against hostile or odd request heads, over
real sockets: what h11 accepts but a proxy in front could read differently
is refused, an upgrade wsproto would choke on gets a clear status, and a
peer that never answers pings is dropped however busy it keeps us."""
from __future__ import annotations

import json

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Message, Ping, Request, TextMessage

from .test_deploy import UPGRADE, start
from .test_ws import TOKEN, raw_http


def head_and_body(reply: bytes) -> tuple[bytes, bytes]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return head, body


async def test_an_oversized_head_is_refused_and_the_server_serves_on(root, nursery):
    server = await start(nursery, root)
    host = f"127.0.0.1:{server.port}"
    filler = "".join(f"X-Pad-{i}: {'a' * 100}\r\n" for i in range(200))  # ~21 KB of headers
    reply = await raw_http(server.port, f"GET / HTTP/1.1\r\nHost: {host}\r\n{filler}\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 400"), reply[:80]
    assert (await raw_http(server.port, f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())).startswith(
        b"HTTP/1.1 200")


async def test_folded_lines_unknown_versions_and_repeated_hosts_are_refused(root, nursery):
    server = await start(nursery, root)
    host = f"127.0.0.1:{server.port}"
    folded = f"GET / HTTP/1.1\r\nHost: {host}\r\nX-A: 1\r\n  X-Injected: 2\r\n\r\n".encode()
    assert (await raw_http(server.port, folded)).startswith(b"HTTP/1.1 400")
    for version in ("HTTP/1.2", "HTTP/1.9"):
        r = await raw_http(server.port, f"GET / {version}\r\nHost: {host}\r\n\r\n".encode())
        assert r.startswith(b"HTTP/1.1 400"), (version, r[:60])
    r = await raw_http(server.port, f"HEAD / HTTP/1.1\r\nHost: {host}\r\nHost: evil.example\r\n\r\n".encode())
    head, body = head_and_body(r)
    assert head.startswith(b"HTTP/1.1 400") and body == b"", "a refused HEAD gets no body"
    r = await raw_http(server.port, f"GET / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
    assert r.startswith(b"HTTP/1.1 200"), "HTTP/1.0 is still served"


async def test_an_upgrade_wsproto_cannot_take_gets_a_clear_status(root, nursery):
    server = await start(nursery, root)
    host = f"127.0.0.1:{server.port}"
    good = UPGRADE.format(path=f"/ws?token={TOKEN}", host=host, extra="")
    cases = {
        "POST": (good.replace("GET ", "POST ", 1), b"400"),
        "version 8": (good.replace("Version: 13", "Version: 8"), b"426"),
        "no key": (good.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", ""), b"400"),
        "no Connection: Upgrade": (good.replace("Connection: Upgrade", "Connection: keep-alive"), b"400"),
        "a body": (good.replace("\r\n\r\n", "\r\nContent-Length: 0\r\n\r\n"), b"400"),
    }
    for name, (request, status) in cases.items():
        head, _ = head_and_body(await raw_http(server.port, request.encode()))
        assert head.startswith(b"HTTP/1.1 " + status), (name, head)
        if status == b"426":
            assert b"Sec-WebSocket-Version: 13" in head
    assert not server.connections
    head, _ = head_and_body(await raw_http(server.port, f"GET /favicon.ico HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()))
    assert head.startswith(b"HTTP/1.1 204")
    assert b"\r\ncontent-length:" not in head.lower() and b"\r\ncontent-type:" not in head.lower(), head


class RawClient:
    """A WebSocket client on wsproto over a bare TCP stream, which answers
    pings only when told to (trio-websocket always answers)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream, self.ws = stream, WSConnection(ConnectionType.CLIENT)
        self.pings = 0
        self.messages: list[str] = []

    @classmethod
    async def connect(cls, port: int) -> RawClient:
        c = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await c.stream.send_all(c.ws.send(Request(host=f"127.0.0.1:{port}", target=f"/ws?token={TOKEN}")))
        with trio.fail_after(10):
            while not any(isinstance(e, AcceptConnection) for e in await c.pump()):
                pass
        return c

    def frame(self, obj: dict[str, object]) -> bytes:
        return self.ws.send(Message(data=json.dumps(obj)))

    async def pump(self) -> list[object]:
        data = await self.stream.receive_some(65536)
        if not data:
            raise EOFError
        self.ws.receive_data(data)
        events = list(self.ws.events())
        for e in events:
            if isinstance(e, Ping):
                self.pings += 1
            elif isinstance(e, TextMessage):
                self.messages.append(str(e.data))
        return events


async def test_frames_sent_before_the_101_are_not_taken_as_requests(root, nursery):
    server = await start(nursery, root)
    c = await RawClient.connect(server.port)
    await c.stream.send_all(c.frame({"action": "list_sessions", "request_id": 7}))
    with trio.fail_after(10):
        while not any(json.loads(m).get("request_id") == 7 for m in c.messages):
            await c.pump()
    await c.stream.aclose()
    early = RawClient(await trio.open_tcp_stream("127.0.0.1", server.port))
    req = early.ws.send(Request(host=f"127.0.0.1:{server.port}", target=f"/ws?token={TOKEN}"))
    # what a client that does not wait for the 101 would send right after its head
    payload = b'{"action":"list_sessions","request_id":8}'
    pipelined = bytes([0x81, 0x80 | len(payload)]) + b"\x00" * 4 + payload  # masked with a zero key
    await early.stream.send_all(req + pipelined)
    with trio.fail_after(10):
        while not any(isinstance(e, AcceptConnection) for e in await early.pump()):
            pass
    await early.stream.send_all(early.frame({"action": "list_sessions", "request_id": 9}))
    with trio.fail_after(10):
        while not any(json.loads(m).get("request_id") == 9 for m in early.messages):
            await early.pump()
    assert not any(json.loads(m).get("request_id") == 8 for m in early.messages)
    await early.stream.aclose()


async def test_a_peer_that_never_pongs_is_dropped_however_often_it_sends(root, nursery):
    """Review finding: quick requests reset the keepalive's "we were busy"
    excuse, so a peer sending a frame every few ms was never dropped."""
    server = await start(nursery, root, ping_interval=0.2, ping_timeout=0.3)
    c = await RawClient.connect(server.port)
    got_eof = False
    with trio.fail_after(15):
        try:
            i = 0
            while True:
                i += 1
                await c.stream.send_all(c.frame({"action": "list_sessions", "request_id": i}))
                with trio.move_on_after(0.02):
                    await c.pump()
        except (EOFError, trio.BrokenResourceError):
            got_eof = True
    assert got_eof and c.pings >= 1 and server.dropped == 1
