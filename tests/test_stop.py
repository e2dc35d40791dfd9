"""Stopping while replies stream (issue 11, item 1 and item 8).

A real `sessionlog serve` subprocess with replies streaming over real
WebSockets gets SIGTERM or SIGINT: it exits 0 within a bounded time, every
running reply is finalized `aborted` "server shutdown" with its text, and the
checkpoint is written. A stop that outlasts --stop-grace (a producer that
ignores cancellation) finalizes what it can and exits 4 with one line. Through
the library, a cancel around the store's block returns, and a cancel at any
await of open or close leaves no descriptor and no lock behind. Over real
sockets, every request read before a stop begins gets its answer before the
close handshake, and one read after gets `shutting_down`.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

from contextlib import AsyncExitStack
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket

from sessionlog_store.eventstore.local.fsio import lock_root
from sessionlog_store.projections.checkpoint import read_index
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import read_log
from sessionlog_store.eventstore.record import scan
from sessionlog_store.server.edge.client import open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import ROOT
from .test_ws import TOKEN as WS_TOKEN
from .test_ws import start_server

TOKEN = "stop-test-token"


def start_serve(root: str, *extra: str, code: str | None = None) -> tuple[subprocess.Popen[str], int]:
    """A real `sessionlog serve` (or `code` calling run_server) on port 0; returns it and its port."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    args = ["serve", "--root", root, "--port", "0", "--token", TOKEN, *extra]
    cmd = [sys.executable, "-m", "sessionlog_store", *args] if code is None else [sys.executable, "-c", code, *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return p, int(m.group(1))
    p.kill()
    raise AssertionError(f"the server did not start: {p.stderr.read() if p.stderr else ''}")


async def stream_replies(port: int, n: int, min_chars: int) -> dict[str, tuple[str, str]]:
    """Start n chats, wait until each reply has min_chars characters; returns
    reply_id -> (session_id, content seen by a client)."""
    async with open_client("127.0.0.1", port, TOKEN) as c:
        acks = [await c.request("chat", content=f"tell me about durable logs, take {k}") for k in range(n)]
        for a in acks:
            await c.request("subscribe_msg", session_id=a["session_id"], msg_id=a["reply_id"], offset=0)
        with trio.fail_after(30):
            while any(len(c.content.get((a["session_id"], a["reply_id"]), "")) < min_chars for a in acks):
                await trio.sleep(0.05)
        running = {a["reply_id"]: c.status.get((a["session_id"], a["reply_id"])) for a in acks}
        assert set(running.values()) == {"running"}, running
        return {a["reply_id"]: (a["session_id"], c.content[(a["session_id"], a["reply_id"])]) for a in acks}


async def stored_reply(root: str, sid: str, mid: str):  # type: ignore[no-untyped-def]
    async with open_session_store(root, config=StoreConfig(check_after_start=False)) as store:
        return (await store.load_session(sid)).messages[mid]


def log_last_seq(root: str, sid: str) -> int:
    s = scan(sid, read_log(OS_FILES, root, sid), expect_seq=1)
    return s.records[-1].seq


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_while_replies_stream_stops_cleanly(root, sig):
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--agent-speed", "8"))
    try:
        seen = await stream_replies(port, 3, 20)
        signalled = time.time()
        p.send_signal(sig)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "Traceback" not in err
    ckpt, how = read_index(OS_FILES, root)
    assert how == "loaded" and ckpt is not None and ckpt.written_at >= signalled
    from sessionlog_store.projections.checkpoint import read_snapshot
    for mid, (sid, text) in seen.items():
        assert ckpt.sessions[sid].seq == log_last_seq(root, sid), "the checkpoint covers the finalize"
        snap = read_snapshot(OS_FILES, root, sid)  # the sessions whose replies the stop ended: snapshotted
        assert snap is not None and snap.seq == log_last_seq(root, sid)
        m = await stored_reply(root, sid, mid)
        assert m.status == "aborted" and m.metadata["aborted_reason"] == "server shutdown"
        assert m.content.startswith(text) and len(m.content) >= len(text), "the text seen live is kept"


async def chars_at_least(c, key: tuple[str, str], n: int) -> str:  # type: ignore[no-untyped-def]
    """Wait (on the client's pushes) until the reply `key` has n characters."""
    with trio.fail_after(60):
        while len(c.content.get(key, "")) < n:
            await c._changed.wait()
    return str(c.content[key])


@pytest.mark.slow
async def test_a_pause_while_lines_linger_then_the_reply_goes_on_exactly_and_a_stop_writes_every_log(root):
    """SIGSTOP a server while a reply streams and the log writer holds its
    lines (the 1 s linger), for longer than the linger and several saver
    intervals, then SIGCONT: the saver wakes late, the log writer finds
    every log due at once. The reply goes on where it was, to the same
    client (no offset skipped or repeated) and to one joining mid-reply at
    an offset; a SIGTERM then stops cleanly, every log holds its records
    in order and the journal is emptied."""
    from .test_journal import segments
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--agent-speed", "8"))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as c:
            ack = await c.request("chat", content="tell me about pauses")
            key = (ack["session_id"], ack["reply_id"])
            await c.request("subscribe_msg", session_id=key[0], msg_id=key[1], offset=0)
            before = await chars_at_least(c, key, 20)
            os.kill(p.pid, signal.SIGSTOP)
            try:
                await trio.sleep(2.0)  # (the pause itself: past the linger and eight saver intervals)
            finally:
                os.kill(p.pid, signal.SIGCONT)
            after = await chars_at_least(c, key, len(c.content[key]) + 20)
            assert after.startswith(before) and c.status[key] == "running"
            async with open_client("127.0.0.1", port, TOKEN) as late:
                offset = len(before) // 2
                late.content[key] = after[:offset]
                await late.request("subscribe_msg", session_id=key[0], msg_id=key[1], offset=offset)
                joined = await chars_at_least(late, key, len(after) + 10)
            assert joined.startswith(after) and c.content[key].startswith(joined[:len(c.content[key])])
            assert c.duplicated_or_missing == [] and late.duplicated_or_missing == []
            seen = c.content[key]
        p.send_signal(signal.SIGTERM)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert segments(root) == [], "the stop wrote every log: nothing left only in the journal"
    m = await stored_reply(root, *key)
    assert m.status == "aborted" and m.content.startswith(seen)
    log_last_seq(root, key[0])  # (scans the log from seq 1: every record, in order, none missing)


STUBBORN = r"""
import sys, time, trio
from sessionlog_store.server.cli import build_parser
from sessionlog_store.server.run import run_server

class Stubborn:
    async def respond(self, store, session_id, history, reply):
        reply.write("started; now blocking in a thread that ignores cancellation")
        await trio.to_thread.run_sync(time.sleep, 60)

sys.exit(run_server(build_parser().parse_args(sys.argv[1:]), agent=Stubborn()))
"""


@pytest.mark.slow
async def test_a_stop_longer_than_the_grace_period_finalizes_and_exits_non_zero(root):
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--stop-grace", "1", code=STUBBORN))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as c:
            ack = await c.request("chat", content="block please")
            await c.request("subscribe_msg", session_id=ack["session_id"], msg_id=ack["reply_id"], offset=0)
            key = (ack["session_id"], ack["reply_id"])
            with trio.fail_after(20):
                while not c.content.get(key):
                    await trio.sleep(0.05)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 4, err
    lines = [ln for ln in err.splitlines() if ln.startswith("sessionlog: error:")]
    assert len(lines) == 1 and "--stop-grace" in lines[0], err
    assert "Traceback" not in err
    assert took < 25  # bounded by the grace (1 s), not by the 60 s thread
    m = await stored_reply(root, *key)
    assert m.status == "aborted" and m.metadata["aborted_reason"] == "server shutdown"
    assert m.content.startswith("started;")


@pytest.mark.slow
async def test_a_second_signal_during_a_stuck_stop_exits_at_once(root):
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--stop-grace", "60", code=STUBBORN))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as c:
            ack = await c.request("chat", content="block please")
            with trio.fail_after(20):
                while True:
                    rows = (await c.request("load_session", session_id=ack["session_id"]))["messages"]
                    if any(m["content"] for m in rows if m["msg_id"] == ack["reply_id"]):
                        break
                    await trio.sleep(0.1)
        p.send_signal(signal.SIGTERM)
        await trio.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=20))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 4, err
    assert "second SIGINT" in err


async def test_a_cancel_around_the_store_with_a_running_message_returns(root):
    """The library case: the stop's cancel used to reach the committer, and
    the shielded finalize then waited forever for a batch nobody committed."""
    with trio.move_on_after(0.5) as scope:
        async with open_session_store(root) as store:
            meta, _ = await store.create_session(first_message="hi")
            async with store.inflight(meta.id) as msg:
                msg.write("partial ")
                await trio.sleep_forever()
    assert scope.cancelled_caught
    async with open_session_store(root) as store:
        m = store.get_row(meta.id)
        assert m["status"] == "idle"
        state = await store.load_session(meta.id)
        reply = state.messages[state.head]  # type: ignore[index]
        assert reply.status == "aborted" and reply.metadata["aborted_reason"] == "server shutdown"
        assert reply.content == "partial "


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


class _CancelAtStep(trio.abc.Instrument):
    """Cancel `scope` just before the watched task's k-th step: the cancel
    lands at whatever await the task reaches next."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.steps = 0
        self.scope: trio.CancelScope | None = None
        self.task: trio.lowlevel.Task | None = None
        self.fired = False

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task and self.scope is not None and not self.fired:
            self.steps += 1
            if self.steps >= self.k:
                self.fired = True
                self.scope.cancel()


async def test_a_cancel_at_any_await_of_open_or_close_leaks_no_descriptor_and_no_lock(root):
    async with open_session_store(root) as store:  # a store with a session and a checkpoint to read
        meta, _ = await store.create_session(first_message="hi")
        async with store.inflight(meta.id) as msg:
            msg.write("x")
    before = _open_fds()
    k = 1
    completed_uncancelled = 0
    while completed_uncancelled < 3 and k < 400:
        inst = _CancelAtStep(k)
        trio.lowlevel.add_instrument(inst)
        try:
            with trio.CancelScope() as scope:
                inst.scope, inst.task = scope, trio.lowlevel.current_task()
                async with open_session_store(root, config=StoreConfig(check_after_start=False)) as store:
                    await trio.sleep(0)
        finally:
            trio.lowlevel.remove_instrument(inst)
        if not inst.fired:
            completed_uncancelled += 1
        assert _open_fds() <= before, f"a descriptor leaked when cancelled at step {k}"
        fd = lock_root(root)  # the lock is free again
        os.close(fd)
        k += 1
    assert completed_uncancelled == 3, "the instrument never reached the end of open and close"


class GatedTitler:
    """A title generator that holds every call until `gate` is set: a
    `rename_session` with `regenerate` stays in flight for as long as the test
    wants. `entered` is set once `n` calls are waiting."""

    def __init__(self, n: int) -> None:
        self.n, self.waiting = n, 0
        self.entered, self.gate = trio.Event(), trio.Event()

    async def generate(self, messages: Any) -> str:
        self.waiting += 1
        if self.waiting == self.n:
            self.entered.set()
        await self.gate.wait()
        return "named as the server stopped"


async def _send(ws: WebSocketConnection, action: str, request_id: str, **kw: Any) -> None:
    await ws.send_message(json.dumps({"action": action, "request_id": request_id, **kw}))


async def _answer(ws: WebSocketConnection, request_id: str) -> dict[str, Any]:
    """The next frame answering `request_id` (pushes are skipped)."""
    while True:
        frame = json.loads(await ws.get_message())
        if frame.get("request_id") == request_id:
            return frame  # type: ignore[no-any-return]


async def _answers_until_close(ws: WebSocketConnection) -> tuple[list[dict[str, Any]], int | None]:
    """Every answer (a frame with a request_id) until the server's close, and the close code."""
    answers = []
    while True:
        try:
            frame = json.loads(await ws.get_message())
        except ConnectionClosed as e:
            return answers, e.reason.code if e.reason is not None else None
        if "request_id" in frame:
            answers.append(frame)


async def test_requests_in_flight_as_a_stop_begins_are_answered_before_the_close(root, nursery):
    """Three connections each have a request in flight (held by the titler)
    and a second one waiting to be read as the stop begins: each first one
    gets its result before the close handshake, a second one at most
    `shutting_down` (never a result), and a request sent after the stop began
    gets `shutting_down` at once."""
    server = await start_server(nursery, root)
    titler = GatedTitler(3)
    server.store.titler = titler
    stopped = trio.Event()

    async def stop() -> None:
        await server.server.prepare_stop()
        stopped.set()

    url = f"/ws?token={WS_TOKEN}"
    with trio.fail_after(30):
        async with AsyncExitStack() as stack:
            busy = [await stack.enter_async_context(open_websocket("127.0.0.1", server.port, url, use_ssl=False))
                    for _ in range(3)]
            late = await stack.enter_async_context(open_websocket("127.0.0.1", server.port, url, use_ssl=False))
            for k, ws in enumerate(busy):
                await _send(ws, "create_session", "create", title=f"session {k}")
                sid = (await _answer(ws, "create"))["data"]["session"]["id"]
                await _send(ws, "rename_session", "named", session_id=sid, regenerate=True)
                await _send(ws, "list_sessions", "after")  # read once "named" is answered
            await titler.entered.wait()  # the three renames are in flight
            nursery.start_soon(stop)
            await trio.testing.wait_all_tasks_blocked()  # the stop began: it waits for the renames
            assert server.store.shutting_down and not stopped.is_set()

            await _send(late, "list_sessions", "late")
            refused = await _answer(late, "late")
            assert refused["type"] == "error" and refused["data"]["code"] == "shutting_down"

            titler.gate.set()
            closes: dict[int, tuple[list[dict[str, Any]], int | None]] = {}

            async def read(k: int, ws: WebSocketConnection) -> None:
                closes[k] = await _answers_until_close(ws)
            async with trio.open_nursery() as readers:  # each reads on: its close handshake is answered
                for k, ws in enumerate([*busy, late]):
                    readers.start_soon(read, k, ws)
            for k in range(len(busy)):
                answers, code = closes[k]
                assert code == 1001
                named = [a for a in answers if a["request_id"] == "named"]
                assert [(a["type"], a["data"]["action"]) for a in named] == [("ok", "rename_session")], answers
                after = [a for a in answers if a["request_id"] == "after"]
                assert len(after) <= 1 and all(a["data"]["code"] == "shutting_down" for a in after), answers
                assert len(answers) == len(named) + len(after), answers
            assert closes[len(busy)] == ([], 1001)
        await stopped.wait()
    titles = sorted(row["title"] for row in server.store.list_sessions()[0])
    assert titles == ["named as the server stopped"] * 3
