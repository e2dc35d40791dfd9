"""The WebSocket server over real sockets on 127.0.0.1, port 0."""
from __future__ import annotations

import json
import os
import re
import random
import signal
import subprocess
import sys

import msgspec
import pytest
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.recovery import load_session_state
from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.edge.client import ServerError, open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store

from .conftest import ROOT, read_logs

TOKEN = "test-token"


class Running:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.port = server.port
        self.store = server.store

    def client(self, **kw):  # type: ignore[no-untyped-def]
        return open_client("127.0.0.1", self.port, TOKEN, **kw)


async def start_server(nursery: trio.Nursery, root: str, *, speed: float = 400.0, tokens=(60, 140),
                       send_timeout: float = 5.0, progress_interval: float = 0.05) -> Running:
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(server: Server) -> None:
        holder["s"] = server
        ready.set()
    config = ServerConfig(port=0, token=TOKEN, send_timeout=send_timeout)
    nursery.start_soon(lambda: serve_store(root, config, agent=DemoAgent(speed=speed, tokens=tokens),
                                           store_config=StoreConfig(progress_interval=progress_interval),
                                           on_ready=on_ready))
    await ready.wait()
    return Running(holder["s"])


@pytest.fixture
async def server(root, nursery):
    return await start_server(nursery, root)


async def log_content(server: Running, root: str, sid: str, msg_id: str) -> str:
    """The message as its log file holds it (the journal's log writer
    caught up first: a durable record reaches the file a moment later)."""
    await server.store.es.flush()
    state, _ = load_session_state(OS_FILES, root, sid, use_snapshot=False)
    return state.messages[msg_id].content


async def test_chat_stream_and_a_second_client_joining_mid_stream(server, root):
    with trio.fail_after(30):
        async with server.client() as a, server.client() as b:
            ack = await a.request("chat", content="tell me about durable logs")
            sid, rid = ack["session_id"], ack["reply_id"]
            await a.follow(sid)
            await a.wait_for(lambda f: f["type"] == "msg_update" and len(f["data"]["content_delta"]) > 0)
            await b.follow(sid)
            assert await a.wait_done(sid, rid) == "done"
            assert await b.wait_done(sid, rid) == "done"
            assert a.content[(sid, rid)] == b.content[(sid, rid)]
            assert not a.duplicated_or_missing and not b.duplicated_or_missing
            loaded = await b.request("load_session", session_id=sid)
            final = next(m for m in loaded["messages"] if m["msg_id"] == rid)
            assert final["content"] == a.content[(sid, rid)] != ""
    assert await log_content(server, root, sid, rid) == final["content"]


async def test_reload_mid_stream_at_random_moments_gives_identical_content(root, nursery):
    server = await start_server(nursery, root, speed=150.0, tokens=(120, 160))
    rng = random.Random(5)
    with trio.fail_after(60):
        async with server.client() as watcher:
            ack = await watcher.request("chat", content="a long answer please")
            sid, rid = ack["session_id"], ack["reply_id"]
            await watcher.follow(sid)
            have: dict[tuple[str, str], str] = {}
            reloads = 0
            while True:
                async with server.client() as page:
                    page.content.update(have)  # what the page had before its reload
                    await page.follow(sid)
                    with trio.move_on_after(rng.uniform(0.05, 0.3)):
                        await page.wait_done(sid, rid)
                    assert not page.duplicated_or_missing
                    have = dict(page.content)
                    reloads += 1
                    if page.status.get((sid, rid)) == "done":
                        break
            assert reloads >= 3
            await watcher.wait_done(sid, rid)
            assert have[(sid, rid)] == watcher.content[(sid, rid)] == await log_content(server, root, sid, rid)


def _norev(data: dict) -> dict:
    """A push without its feed position (`rev`)."""
    return {k: v for k, v in data.items() if k != "rev"}


async def test_broadcasts_carry_only_the_changed_fields(server):
    with trio.fail_after(20):
        async with server.client() as a, server.client() as b:
            created = await a.request("create_session", title="x")
            sid = created["session"]["id"]
            await b.wait_for(lambda f: f["type"] == "session_created" and f["data"]["session"]["id"] == sid)
            await a.request("rename_session", session_id=sid, title="Renamed")
            f = await b.wait_for(lambda f: f["type"] == "session_updated" and "title" in f["data"])
            assert _norev(f["data"]) == {"id": sid, "title": "Renamed"}
            await a.request("set_pinned", session_id=sid, pinned=True)
            f = await b.wait_for(lambda f: f["type"] == "session_updated" and "pinned" in f["data"])
            assert _norev(f["data"]) == {"id": sid, "pinned": True}
            await a.request("set_archived", session_id=sid, archived=True)
            f = await b.wait_for(lambda f: f["type"] == "session_updated" and "archived" in f["data"])
            assert _norev(f["data"]) == {"id": sid, "archived": True}
            await a.request("delete_session", session_id=sid)
            f = await b.wait_for(lambda f: f["type"] == "session_deleted")
            assert _norev(f["data"]) == {"session_id": sid}


BAD_FRAMES = [
    ("not json", "bad_json"),
    ("[1, 2]", "bad_frame"),
    ('"just a string"', "bad_frame"),
    ("{}", "unknown_action"),
    ('{"action": "teleport"}', "unknown_action"),
    ('{"action": 5}', "unknown_action"),
    ('{"action": "list_sessions", "bogus": 1}', "bad_request"),
    ('{"action": "load_session"}', "bad_request"),
    ('{"action": "load_session", "session_id": 5}', "bad_request"),
    ('{"action": "list_sessions", "limit": -1}', "bad_request"),
    ('{"action": "list_sessions", "offset": 1e400}', "bad_request"),
    ('{"action": "list_sessions", "offset": 123456789012345678901234567890}', "bad_request"),
    ('{"action": "list_sessions", "filters": {"a": {"b": {"c": 1}}}}', "bad_request"),
    ('{"action": "list_sessions", "filters": ' + "[" * 5000 + "]" * 5000 + "}", "bad_frame"),
    ("[" * 100000 + "]" * 100000, "bad_frame"),
    ('{"action": "load_session", "session_id": "../../etc"}', "invalid_session_id"),
    ('{"action": "load_session", "session_id": "/etc/passwd"}', "invalid_session_id"),
    ('{"action": "delete_session", "session_id": "a/../b"}', "invalid_session_id"),
    ('{"action": "load_session", "session_id": "nosuchsession"}', "unknown_session"),
    ('{"action": "chat", "content": ""}', "bad_field"),
    ('{"action": "relocate_project", "session_id": "abc", "project_id": "default", "path": "/tmp"}', "unknown_session"),
    ('{"action": "list_sessions", "filters": {"nope": 1}}', "bad_filter"),
    ('{"action": "rename_session", "session_id": "x\\u0000y", "title": "t"}', "invalid_session_id"),
    ('{"action": "chat", "content": "\\ud800"}', None),  # a lone surrogate escape: either accepted or refused
]


async def test_every_bad_frame_gets_an_error_and_changes_nothing(server, root):
    with trio.fail_after(30):
        async with server.client() as good:
            created = await good.request("create_session")
            before = read_logs(root)
            async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
                for frame, code in BAD_FRAMES:
                    await ws.send_message(frame)
                    reply = json.loads(await ws.get_message())
                    if code is None:
                        continue
                    assert reply["type"] == "error", (frame[:60], reply)
                    assert reply["data"]["code"] == code, (frame[:60], reply)
                    assert reply["data"]["message"]
                await ws.send_message(b"\x00\x01binary")
                reply = json.loads(await ws.get_message())
                assert reply["data"]["code"] == "bad_frame"
                await ws.send_message('{"action": "list_sessions", "request_id": 9, "x": ' + '"y' * (1 << 20) + '"}')
                reply = json.loads(await ws.get_message())
                assert reply["data"]["code"] == "frame_too_large"
                await ws.send_message('{"action": "load_session", "request_id": "r1"}')
                reply = json.loads(await ws.get_message())
                assert reply["data"]["request_id"] == "r1" and reply["request_id"] == "r1"
                # still usable
                await ws.send_message('{"action": "list_sessions", "request_id": 7}')
                reply = json.loads(await ws.get_message())
                assert reply["type"] == "sessions_list" and reply["request_id"] == 7
            after = {k: v for k, v in read_logs(root).items() if k in before}
            assert after == before
            rows = await good.request("list_sessions")  # the server keeps serving others
            assert created["session"]["id"] in [r["id"] for r in rows["rows"]]
    assert sorted(os.listdir(root)) == [".lock", "FORMAT", "index.json", "journal", "projects", "search.sqlite",
                                        "search.sqlite-shm", "search.sqlite-wal", "sessions", "streams"]


HOSTILE = [
    ("Origin", "http://evil.example"),
    ("Origin", "null"),
    ("Origin", "http://127.0.0.1.evil.example"),
    ("Origin", "http://localhost.evil.example:1"),
    ("Origin", "https://127.0.0.1"),
]


@pytest.mark.parametrize("header,value", HOSTILE)
async def test_hostile_origins_are_refused_before_any_data(server, header, value):
    with pytest.raises(HandshakeError):
        async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False,
                                  extra_headers=[(header, value)]):
            pass


@pytest.mark.parametrize("path", ["/ws", "/ws?token=", "/ws?token=wrong", f"/ws?token={TOKEN}x",
                                  f"/ws?token={TOKEN[:-1]}"])
async def test_missing_or_wrong_token_is_refused(server, path):
    with pytest.raises(HandshakeError):
        async with open_websocket("127.0.0.1", server.port, path, use_ssl=False):
            pass


def _whole(request: bytes, data: bytes) -> bool:
    """`data` holds one whole answer with a length (the connection may stay
    open for the next request: keep-alive); a 101 or an answer without a
    length is whole when the server closes."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    status = head[9:12]
    if request.startswith(b"HEAD ") or status in (b"204", b"304"):
        return True
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


async def raw_http(port: int, request: bytes) -> bytes:
    """Send raw bytes, read the answer: to the connection's end, or one whole
    answer with a length."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(request)
    data = b""
    with trio.fail_after(10):
        while not _whole(request, data) and (chunk := await stream.receive_some(65536)):
            data += chunk
    await stream.aclose()
    return data


async def test_wrong_host_is_refused_dns_rebinding(server):
    up = (b"GET /ws?token=" + TOKEN.encode() + b" HTTP/1.1\r\nHost: evil.example:%d\r\nUpgrade: websocket\r\n"
          b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
          % server.port)
    reply = await raw_http(server.port, up)
    assert reply.startswith(b"HTTP/1.1 403") and b"Host" in reply
    page = await raw_http(server.port, b"GET / HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    assert page.startswith(b"HTTP/1.1 403")


async def test_the_page_and_the_websocket_share_one_port(server):
    page = await raw_http(server.port, b"GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.port)
    assert page.startswith(b"HTTP/1.1 200") and b"<html" in page.lower()
    for bad in (b"GET /../server/store.py HTTP/1.1", b"GET /static/../store.py HTTP/1.1",
                b"GET /static/nope.js HTTP/1.1"):
        r = await raw_http(server.port, bad + b"\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.port)
        assert r.startswith(b"HTTP/1.1 404")
    assert (await raw_http(server.port, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
    r = await raw_http(server.port, b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % server.port)
    assert r.startswith(b"HTTP/1.1 405")


async def test_a_client_that_stops_reading_is_dropped_while_others_stream_on(root, nursery):
    server = await start_server(nursery, root, speed=100.0, send_timeout=1.0)
    for i in range(150):
        await server.store.create_session(title="padding " * 20, first_message="x" * 70)
    with trio.fail_after(60):
        async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False,
                                  message_queue_size=1) as stalled:
            # Ask for megabytes and never read them. On a busy machine the server
            # may drop it (its send timeout passed) before it has asked 300 times.
            try:
                for i in range(300):
                    await stalled.send_message('{"action": "list_sessions", "include_archived": true}')
            except ConnectionClosed:
                pass
            async with server.client() as live:
                ack = await live.request("chat", content="keep streaming to me")
                sid, rid = ack["session_id"], ack["reply_id"]
                await live.follow(sid)
                assert await live.wait_done(sid, rid) == "done"
                assert live.content[(sid, rid)] == await log_content(server, root, sid, rid)
                while len(server.server.connections) > 1:
                    await trio.sleep(0.05)  # the stalled one goes once its send timeout passes
            with pytest.raises(ConnectionClosed):
                while True:
                    await stalled.get_message()


def start_serve_process(root: str) -> tuple[subprocess.Popen[str], int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", root, "--port", "0",
                             "--token", TOKEN, "--agent-speed", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else "server ended"
        if "serving http://" in line:
            return proc, int(re.search(r"http://[^/]+:(\d+)/", line).group(1))  # type: ignore[union-attr]


async def spawn_server(root: str) -> tuple[subprocess.Popen[str], int]:
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(start_serve_process, root, abandon_on_cancel=True)


async def test_sigkill_of_the_real_server_mid_stream(root):
    proc, port = await spawn_server(root)
    try:
        with trio.fail_after(30):
            async with open_client("127.0.0.1", port, TOKEN) as c:
                ack = await c.request("chat", content="stream something long")
                sid, rid = ack["session_id"], ack["reply_id"]
                await c.follow(sid)

                def some_text_durable() -> bool:
                    """40 characters seen, and a later update says the first delta is durable
                    (its durable_seq covers that delta's seq): the kill cannot take it all."""
                    ups = [f["data"] for f in c.pushes if f["type"] == "msg_update" and f["data"]["msg_id"] == rid]
                    first = next((u["seq"] for u in ups if u["content_delta"]), None)
                    return (len(c.content.get((sid, rid), "")) >= 40 and first is not None
                            and max(u["durable_seq"] for u in ups) >= first)
                while not some_text_durable():
                    await c._changed.wait()
                seen = c.content[(sid, rid)]
                os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    proc, port = await spawn_server(root)
    try:
        with trio.fail_after(30):
            async with open_client("127.0.0.1", port, TOKEN) as c:
                rows = await c.request("list_sessions")
                assert sid in [r["id"] for r in rows["rows"]]
                loaded = await c.request("load_session", session_id=sid)
                m = next(x for x in loaded["messages"] if x["msg_id"] == rid)
                assert m["status"] == "aborted" and m["metadata"]["aborted_reason"] == "worker restart"
                assert m["content"] and (seen.startswith(m["content"]) or m["content"].startswith(seen))
                sub = await c.request("subscribe_msg", session_id=sid, msg_id=rid, offset=0)
                assert sub["msg_id"] == rid
                assert await c.wait_done(sid, rid) == "aborted"
                retry = await c.request("retry", session_id=sid, msg_id=rid)
                await c.follow(sid)
                assert await c.wait_done(sid, retry["reply_id"]) == "done"
                loaded = await c.request("load_session", session_id=sid)
                assert [m["msg_id"] for m in loaded["messages"] if m["caller"] is None][-1] == retry["reply_id"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await trio.to_thread.run_sync(proc.communicate)
        assert proc.returncode == 0, err


async def test_errors_carry_request_ids_and_codes(server):
    async with server.client() as c:
        with pytest.raises(ServerError) as e:
            await c.request("stop", session_id="nosuch", msg_id="m")
        assert e.value.code == "unknown_session"
        created = await c.request("create_session")
        with pytest.raises(ServerError) as e:
            await c.request("stop", session_id=created["session"]["id"], msg_id="m")
        assert e.value.code == "not_running"
        with pytest.raises(ServerError) as e:
            await c.request("set_session_project", session_id=created["session"]["id"], project_id="p-x")
        assert e.value.code == "unknown_project"


def test_error_codes_are_documented():
    from sessionlog_store.server.edge.protocol import ERROR_CODES
    doc = open(os.path.join(ROOT, "docs", "PROTOCOL.md")).read()
    for code in ERROR_CODES:
        assert f"`{code}`" in doc, code
    msgspec.json.encode(ERROR_CODES)


async def test_a_slow_reader_gets_its_updates_coalesced_not_dropped(root, nursery):
    """Issue 12: a subscriber that stops reading for a while is not sent a
    queue of every update (nor dropped): what it has not taken yet is merged
    into one update, and the content it assembles is exact."""
    import json

    from sessionlog_store.eventstore.events import MessageProgress
    from trio_websocket import wrap_client_stream
    server = await start_server(nursery, root, send_timeout=10.0, progress_interval=0.01)
    store = server.store
    meta, _ = await store.create_session(first_message="big")
    records = []
    go = trio.Event()
    chunk = "".join(chr(ord("a") + i % 26) for i in range(30_000))
    rounds = 300

    async def produce(task_status=trio.TASK_STATUS_IGNORED):  # type: ignore[no-untyped-def]
        async with store.inflight(meta.id) as msg:
            task_status.started(msg.msg_id)
            await go.wait()
            for i in range(rounds):  # 9 MB over ~3 s, a record per 10 ms interval
                msg.write(chunk)
                await trio.sleep(0.01)
    mid = await nursery.start(produce)
    store.es.listeners.append(lambda sid, rec, end: records.append(rec.seq)
                              if type(rec.event) is MessageProgress and rec.event.msg_id == mid else None)
    # a small receive buffer: the server's sends back up soon after the
    # client stops reading
    sock = trio.socket.socket()
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_RCVBUF, 4096)
    await sock.connect(("127.0.0.1", server.port))
    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            ws = await wrap_client_stream(n, trio.SocketStream(sock), f"127.0.0.1:{server.port}", f"/ws?token={TOKEN}",
                                          message_queue_size=1)
            await ws.send_message(json.dumps({"action": "subscribe_msg", "session_id": meta.id, "msg_id": mid}))
            go.set()
            await trio.sleep(2.5)  # not reading: the socket backs up
            content, updates, status = "", 0, "running"
            while status == "running":
                f = json.loads(await ws.get_message())
                if f["type"] != "msg_update":
                    continue
                d = f["data"]
                assert d["offset"] == len(content), "every update starts where the last one ended"
                content += d["content_delta"]
                status = d["status"]
                updates += 1
            await ws.aclose()
    assert status == "done" and content == chunk * rounds
    assert len(records) >= 30 and updates < len(records) / 2, (updates, len(records))
    assert len(server.server.connections) == 0 or all(not c.dropped for c in server.server.connections)


async def test_a_long_catch_up_comes_in_pieces_a_client_can_take(root, nursery):
    """Subscribing to a long message: the content so far comes in pieces that
    each fit a 1 MiB WebSocket message even when every character needs an
    escape, and together are the content exactly."""
    import json
    server = await start_server(nursery, root)
    store = server.store
    meta, _ = await store.create_session(first_message="long")
    text = "\u0001\"" * 300_000  # 600,000 characters, 6 and 2 bytes of JSON each
    async with store.inflight(meta.id) as msg:
        msg.write(text)
        store.saver.flush(msg)
        mid = msg.msg_id
        with trio.fail_after(30):
            async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
                await ws.send_message(json.dumps({"action": "subscribe_msg", "session_id": meta.id,
                                                  "msg_id": mid}))
                content, pieces = "", 0
                while len(content) < len(text):
                    f = json.loads(await ws.get_message())  # default limit: 1 MiB
                    if f["type"] == "msg_update":
                        assert f["data"]["offset"] == len(content)
                        content += f["data"]["content_delta"]
                        pieces += 1
    assert content == text and pieces >= 5
