"""Deploying beyond loopback (issue 15 item 2, the server's part): extra
allowed hosts, a public URL with a path prefix, trusted proxy headers and
WebSocket keepalive, over real sockets. Strict defaults stay (test_ws.py)."""
from __future__ import annotations

import json

import trio
from trio_websocket import open_websocket

from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store

from .test_ws import TOKEN, raw_http

UPGRADE = ("GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{extra}\r\n")


async def start(nursery: trio.Nursery, root: str, fs=None, **cfg) -> Server:  # type: ignore[no-untyped-def]
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    config = ServerConfig(port=0, token=TOKEN, **cfg)
    extra = {} if fs is None else {"fs": fs}
    nursery.start_soon(lambda: serve_store(root, config, agent=DemoAgent(speed=400), store_config=StoreConfig(),
                                           on_ready=on_ready, **extra))
    await ready.wait()
    return holder["s"]


async def handshake(port: int, path: str, host: str, extra: str = "") -> tuple[bytes, trio.SocketStream]:
    """Send an upgrade request; the response head, and the open stream."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(UPGRADE.format(path=path, host=host, extra=extra).encode())
    data = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            data += chunk
    return data, stream


def _req(xff: str):  # type: ignore[no-untyped-def]
    from sessionlog_store.server.edge.http import Request
    return Request("GET", "/", {"host": "chat.example", "x-forwarded-for": xff})


def get(path: str, host: str, extra: str = "") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n".encode()


async def test_an_allowed_host_is_served_and_others_still_refused(root, nursery):
    server = await start(nursery, root, allowed_hosts=("chat.lan:8765", "10.0.0.7:8765"))
    assert (await raw_http(server.port, get("/", "chat.lan:8765"))).startswith(b"HTTP/1.1 200")
    assert (await raw_http(server.port, get("/", "10.0.0.7:8765"))).startswith(b"HTTP/1.1 200")
    assert (await raw_http(server.port, get("/", "evil.example:8765"))).startswith(b"HTTP/1.1 403")
    head, s = await handshake(server.port, f"/ws?token={TOKEN}", "chat.lan:8765", "Origin: http://chat.lan:8765\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    await s.aclose()


async def test_a_public_url_with_a_path_prefix_serves_the_page_and_the_socket_under_it(root, nursery):
    server = await start(nursery, root, public_url="https://chat.example/chat")
    host = "chat.example"
    r = await raw_http(server.port, get("/chat?token=x", host))
    assert r.startswith(b"HTTP/1.1 301") and b"Location: /chat/?token=x\r\n" in r
    page = await raw_http(server.port, get("/chat/", host))
    assert page.startswith(b"HTTP/1.1 200") and b'src="static/app.js"' in page and b'"/static' not in page
    assert (await raw_http(server.port, get("/chat/static/app.js", host))).startswith(b"HTTP/1.1 200")
    assert (await raw_http(server.port, get("/static/app.js", host))).startswith(b"HTTP/1.1 200"), \
        "a proxy that strips the prefix works too"
    for ops in ("/chat/metrics", "/chat/readyz", "/chat/healthz"):  # never public under the proxy's prefix
        assert (await raw_http(server.port, get(ops, host))).startswith(b"HTTP/1.1 404"), ops
    assert (await raw_http(server.port, get("/chat/static/%00x", host))).startswith(b"HTTP/1.1 404")
    assert (await raw_http(server.port, get("/chat/static/" + "a" * 300, host))).startswith(b"HTTP/1.1 404")
    assert (await raw_http(server.port, get("//[x/", host))).startswith(b"HTTP/1.1 400")
    head, s = await handshake(server.port, f"/chat/ws?token={TOKEN}", host, "Origin: https://chat.example\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    await s.aclose()
    head, s = await handshake(server.port, f"/chat/ws?token={TOKEN}", host, "Origin: https://evil.example\r\n")
    assert head.startswith(b"HTTP/1.1 403")
    await s.aclose()


async def test_forwarded_headers_are_believed_only_from_trusted_proxies(root, nursery):
    fwd = "X-Forwarded-Host: chat.example\r\nX-Forwarded-Proto: https\r\nX-Forwarded-For: 203.0.113.9\r\n"
    trusting = await start(nursery, root + "-a", allowed_hosts=("chat.example",), forwarded_allow_ips=("127.0.0.1",))
    head, s = await handshake(trusting.port, f"/ws?token={TOKEN}", "backend:1234",
                              fwd + "Origin: https://chat.example\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    await s.aclose()
    bad = "X-Forwarded-For: 10.9.9.9\nX-Injected: 1\r\n"  # a bare LF in a value: refused, not logged
    head, s = await handshake(trusting.port, f"/ws?token={TOKEN}", "chat.example", bad)
    assert head.startswith(b"HTTP/1.1 400"), head
    await s.aclose()
    _, remote = trusting.localize(_req("1.2.3.4, 203.0.113.9"), "127.0.0.1")
    assert remote == "203.0.113.9", "the entry our proxy added, not the client's claim"
    wary = await start(nursery, root + "-b", allowed_hosts=("chat.example",))
    head, s = await handshake(wary.port, f"/ws?token={TOKEN}", "backend:1234", fwd + "Origin: https://chat.example\r\n")
    assert head.startswith(b"HTTP/1.1 403"), "an untrusted peer's X-Forwarded-Host is ignored"
    await s.aclose()


async def test_keepalive_drops_a_silent_peer_and_keeps_a_live_one(root, nursery):
    # (a timeout well above a busy machine's stalls: the live client answers
    # from this same process, which a CPU hog may hold off for a moment)
    server = await start(nursery, root, ping_interval=0.2, ping_timeout=2.0)
    async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as live:
        head, dead = await handshake(server.port, f"/ws?token={TOKEN}", f"127.0.0.1:{server.port}")
        assert head.startswith(b"HTTP/1.1 101")
        with trio.fail_after(10):
            while len(server.connections) != 2:
                await trio.sleep(0.01)
            while len(server.connections) != 1:  # the peer that never answers a ping goes
                await trio.sleep(0.05)
        await trio.sleep(1.0)  # several ping periods: the live client answers each
        assert len(server.connections) == 1 and server.dropped == 1
        await live.send_message('{"action": "list_sessions", "request_id": 1}')
        with trio.fail_after(5):
            while True:
                frame = json.loads(await live.get_message())
                if frame.get("request_id") == 1:
                    break
        assert frame["type"] != "error", frame
        await dead.aclose()


async def test_keepalive_spares_a_client_whose_own_request_is_slow(root, nursery):
    """Review finding: while we answer a slow request (here a rename whose
    sync stalls 1 s, as a busy disk does) with more frames queued, the client's
    pongs sit unread behind them; that is not the client's fault."""
    import time as _time

    from sessionlog_store.eventstore.local.fsio import FileOps

    class StallingFS(FileOps):
        stall = 0.0

        def fdatasync(self, fd):  # type: ignore[no-untyped-def]
            if self.stall:
                _time.sleep(self.stall)  # a worker thread, as every sync
            super().fdatasync(fd)
    fs = StallingFS()
    server = await start(nursery, root, fs=fs, ping_interval=0.2, ping_timeout=0.3)
    meta, _ = await server.store.create_session(first_message="x")
    fs.stall = 1.0
    async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as c:
        for i in range(3):
            await c.send_message(json.dumps({"action": "rename_session", "session_id": meta.id,
                                             "title": f"t{i}", "request_id": i}))
        got = 0
        with trio.fail_after(20):
            while got < 3:
                if json.loads(await c.get_message()).get("request_id") is not None:
                    got += 1
    assert server.dropped == 0
