"""The Python client (sessionlog_store.client, issue 28 item 1) against a
real `serve` subprocess, every scenario under asyncio and under trio (one
code base on httpx and anyio): sessions and messages; a message read as it
is written, its reader cut mid-stream (a proxy drops every connection)
and resuming by itself to one gapless text; a producer's reply with token
counts, ended `done`, or `error` by an exception; a user's Stop learnt by
a silent producer within its interval; a producer's process killed, its
reply ended `aborted` "producer lost" with its text."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

anyio = pytest.importorskip("anyio")
pytest.importorskip("httpx")

from sessionlog_store.client import ApiError, Client  # noqa: E402

from .conftest import ROOT  # noqa: E402
from .processes import ServeProcess, free_port  # noqa: E402

TOKEN = "client-token"
BACKENDS = ["asyncio", "trio"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("client")
    proc = ServeProcess(str(root / "data"), free_port(), token=TOKEN, extra=("--producer-timeout", "2"),
                        log=root / "serve.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def run(backend: str, scenario: Callable[..., Awaitable[None]], *args: Any) -> None:
    anyio.run(scenario, *args, backend=backend)


async def until(pred: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    with anyio.fail_after(within):
        while not await pred():
            await anyio.sleep(0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sessions_and_messages(server: ServeProcess, backend: str) -> None:
    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl:
            row = await sl.create_session(title=f"{backend} one")
            assert (await sl.update_session(row.id, pinned=True))["pinned"] is True
            mid = await sl.add_message(row.id, "a finished message")
            loaded = await sl.get_session(row.id)
            assert [m.msg_id for m in loaded.messages] == [mid] and loaded.session.pinned
            assert row.id in [r.id for r in (await sl.list_sessions(limit=100)).rows]
            ack = await sl.chat("hello agent", session_id=row.id)
            text = "".join([c.text async for c in sl.read_message(row.id, ack.reply_id)])
            m = next(m for m in (await sl.get_session(row.id)).messages if m.msg_id == ack.reply_id)
            assert text == m.content and m.status == "done" and text
            await sl.delete_session(row.id)
            with pytest.raises(ApiError) as gone:
                await sl.get_session(row.id)
            assert (gone.value.status, gone.value.code) == (404, "unknown_session")
    run(backend, scenario)


@contextmanager
def cutting_proxy(port: int, answers: threading.Event | None = None) -> Iterator[tuple[int, Callable[[], int]]]:
    """A TCP proxy to `port`; `cut()` drops every connection through it (a
    network cut), returning how many. While `answers` (when given) is
    clear, the server's bytes are held (requests reach it, answers wait)."""
    listener = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    lock = threading.Lock()

    def pipe(a: socket.socket, b: socket.socket, gate: threading.Event | None = None) -> None:
        try:
            while data := a.recv(65536):
                if gate is not None:
                    gate.wait()
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while True:
            try:
                c, _ = listener.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", port))
            with lock:
                conns.extend((c, s))
            threading.Thread(target=pipe, args=(c, s), daemon=True).start()
            threading.Thread(target=pipe, args=(s, c, answers), daemon=True).start()

    def cut() -> int:
        with lock:
            n, gone = len(conns) // 2, list(conns)
            conns.clear()
        for s in gone:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        return n
    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1], cut
    finally:
        listener.close()
        cut()


@pytest.mark.parametrize("mode", ["sse", "long-poll"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reader_cut_mid_stream_resumes_to_one_gapless_text(server: ServeProcess, backend: str, mode: str) -> None:
    async def scenario() -> None:
        with cutting_proxy(server.port) as (port, cut):
            async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl, \
                    Client(f"http://127.0.0.1:{port}", TOKEN,
                           headers={"Host": f"127.0.0.1:{server.port}"}) as reader:  # (through the proxy)
                sid = (await sl.create_session()).id
                await sl.add_message(sid, "write")
                pieces = [f"piece {i};\r\n " for i in range(12)]  # (a CR and an LF are text too)
                got: list[str] = []
                last: list[Any] = []
                cuts = 0

                async def read(rid: str) -> None:
                    async for chunk in reader.read_message(sid, rid, mode=mode):
                        got.append(chunk.text)
                        last[:] = [chunk]
                async with anyio.create_task_group() as tg:
                    async with sl.reply(sid, interval=0.05) as r:
                        tg.start_soon(read, r.reply_id)
                        for i, piece in enumerate(pieces):
                            r.write(piece)
                            want = len("".join(pieces[:i + 1]))
                            await until(lambda: _true(len("".join(got)) >= want))
                            if i in (3, 7):
                                cuts += cut()  # (the reader's long-poll, mid-stream)
                        async with r.tool_call("search", call_id="call_1", arguments='{"q": "durable"}') as call:
                            call.write("3 results")
                        r.tokens(input=5, output=len(pieces))
                    # (the exit closes the reply: the reader sees its end and stops)
                assert cuts >= 2
                m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == r.reply_id)
                assert "".join(got) == "".join(pieces) == m.content
                assert last[0].status == "done" and m.status == "done"
                tool = next(t for t in (await sl.get_session(sid)).messages if t.kind == "tool_call")
                assert (tool.caller, tool.status, tool.content) == (r.reply_id, "done", "3 results")
                assert tool.metadata["arguments"] == '{"q": "durable"}'
                assert (tool.metadata["tool"], tool.metadata["tool_call_id"]) == ("search", "call_1")
                assert m.tokens == {"input": 5, "output": len(pieces)} or \
                    m.metadata.get("tokens_used") == {"input": 5, "output": len(pieces)}, (m.tokens, m.metadata)
    run(backend, scenario)


async def _true(value: bool) -> bool:
    return value


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_producers_exception_ends_the_reply_error_and_a_stop_reaches_a_silent_producer(
        server: ServeProcess, backend: str) -> None:
    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl:
            sid = (await sl.create_session()).id
            await sl.add_message(sid, "go")
            with pytest.raises(RuntimeError):
                async with sl.reply(sid, interval=0.05) as r:
                    r.write("half a thought")
                    raise RuntimeError("the model went away")
            m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == r.reply_id)
            assert (m.status, m.content) == ("error", "half a thought") and "the model went away" in (m.error or "")
            await sl.add_message(sid, "again")
            async with sl.reply(sid, interval=0.05) as r:
                r.write("thinking")
                await until(lambda: _content(sl, sid, r.reply_id, "thinking"))
                await sl.stop(sid, r.reply_id)
                with anyio.fail_after(10):
                    await r.stopped.wait()  # (silent: learnt from its own stream's closure)
                r.write("dropped")
            assert r.ended is not None and r.ended.status == "aborted"
            m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == r.reply_id)
            assert (m.status, m.content, m.metadata.get("aborted_reason")) == ("aborted", "thinking",
                                                                             "stopped by user")
    run(backend, scenario)


@asynccontextmanager
async def held_answers(server: ServeProcess) -> AsyncIterator[tuple[Client, threading.Event]]:
    """A client through a proxy whose server answers wait while the event
    is clear (requests still reach the server)."""
    answers = threading.Event()
    answers.set()
    with cutting_proxy(server.port, answers) as (port, _):
        async with Client(f"http://127.0.0.1:{port}", TOKEN, headers={"Host": f"127.0.0.1:{server.port}"}) as c:
            yield c, answers


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_append_in_flight_when_the_reply_exits_is_not_taken_for_its_close(server: ServeProcess,
                                                                            backend: str) -> None:
    """The reply's body ends while an interval's append is on the wire (the
    server took it, its answer not yet read): the exit sends that append
    again with its seq (answered as its duplicate), so its close is the next
    seq and ends the reply `done` (before: the close went with the cut
    append's seq, was answered as its duplicate, and the reply, left
    running, ended "producer lost")."""
    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl:
            sid = (await sl.create_session()).id
            await sl.add_message(sid, "go")
            async with held_answers(server) as (producer, answers):
                async with producer.reply(sid, interval=0.05) as r:
                    answers.clear()
                    r.write("all of it")
                    await until(lambda: _content(sl, sid, r.reply_id, "all of it"))  # (taken; answer held)
                    answers.set()  # (no checkpoint before the exit: its answer not read yet)
            await until(lambda: _ended(sl, sid, r.reply_id))
            m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == r.reply_id)
            assert (m.status, m.content) == ("done", "all of it"), (m.status, m.metadata)
    run(backend, scenario)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_caller_cancelling_a_reply_whose_server_does_not_answer_is_cancelled(
        server: ServeProcess, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's cancel ends the reply's body while the server answers
    nothing: the exit tries its close for CANCEL_GRACE and the cancel goes
    on (not a ConnectionError a minute later, the retries of a shielded
    append); the server's producer timeout then ends the reply with its text."""
    from sessionlog_store.client import producer
    monkeypatch.setattr(producer, "CANCEL_GRACE", 0.5)

    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl:
            sid = (await sl.create_session()).id
            await sl.add_message(sid, "go")
            async with held_answers(server) as (producer_client, answers):
                with anyio.CancelScope() as cs:
                    async with producer_client.reply(sid, interval=0.05) as r:
                        answers.clear()
                        r.write("said before the cancel")
                        await until(lambda: _content(sl, sid, r.reply_id, "said before the cancel"))
                        cs.cancel()
                        await anyio.sleep_forever()
                assert cs.cancelled_caught
                answers.set()
            await until(lambda: _ended(sl, sid, r.reply_id))
            m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == r.reply_id)
            assert (m.status, m.content, m.metadata.get("aborted_reason")) == (
                "aborted", "said before the cancel", "producer lost")
    run(backend, scenario)


async def _ended(sl: Client, sid: str, mid: str) -> bool:
    return any(m.msg_id == mid and m.status != "running" for m in (await sl.get_session(sid)).messages)


async def _content(sl: Client, sid: str, mid: str, text: str) -> bool:
    return any(m.msg_id == mid and m.content == text for m in (await sl.get_session(sid)).messages)


PRODUCER = textwrap.dedent("""
    import sys, anyio
    from sessionlog_store.client import Client

    async def main(url, token, sid):
        async with Client(url, token) as sl:
            async with sl.reply(sid, interval=0.05) as r:
                r.write("before the kill")
                while True:
                    await anyio.sleep(0.2)
                    print(r.reply_id, flush=True)

    anyio.run(main, *sys.argv[1:4], backend=sys.argv[4])
""")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_producers_reply_ends_producer_lost_with_its_text(server: ServeProcess, backend: str,
                                                                    tmp_path: Path) -> None:
    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{server.port}", TOKEN) as sl:
            sid = (await sl.create_session()).id
            await sl.add_message(sid, "go")
            proc = subprocess.Popen([sys.executable, "-c", PRODUCER, f"http://127.0.0.1:{server.port}", TOKEN, sid,
                                     backend], stdout=subprocess.PIPE, text=True, cwd=ROOT)
            try:
                assert proc.stdout is not None
                rid = (await anyio.to_thread.run_sync(proc.stdout.readline)).strip()
                await until(lambda: _content(sl, sid, rid, "before the kill"))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                await until(lambda: _status(sl, sid, rid, "aborted"))
                m = next(m for m in (await sl.get_session(sid)).messages if m.msg_id == rid)
                assert (m.content, m.metadata.get("aborted_reason")) == ("before the kill", "producer lost")
            finally:
                if proc.poll() is None:
                    proc.kill()
    run(backend, scenario)


async def _status(sl: Client, sid: str, mid: str, status: str) -> bool:
    return any(m.msg_id == mid and m.status == status for m in (await sl.get_session(sid)).messages)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_tail_lost_in_a_crash_is_taken_back_and_the_text_ends_as_stored(tmp_path: Path, backend: str) -> None:
    """The server sends text before it is written; a crash then loses a tail
    a reader has: the reader's resume is refused bad_offset, and it reads
    again from the start with `restart` (not an error, not a gap)."""
    hold = tmp_path / "hold"
    held = ServeProcess(str(tmp_path / "data"), free_port(), token=TOKEN,
                        runner=(str(ROOT / "tests" / "held_serve.py"),), env={"SESSIONLOG_HOLD": str(hold)})
    held.start()

    async def scenario() -> None:
        async with Client(f"http://127.0.0.1:{held.port}", TOKEN) as sl:
            ack = await sl.chat("a long one please")
            text, restarts, last, sent_at_stall = "", 0, None, None
            async for chunk in sl.read_message(ack.session_id, ack.reply_id):
                restarts += chunk.restart
                text = chunk.text if chunk.restart else text + chunk.text
                last = chunk
                if sent_at_stall is None and len(text) > 20:
                    hold.touch()  # the disk stalls: what is sent from now on is not written
                    sent_at_stall = len(text)
                elif sent_at_stall is not None and hold.exists() and len(text) > sent_at_stall + 10:
                    held.kill()  # a crash with a tail sent and not written
                    hold.unlink()
                    held.start()
            assert restarts == 1 and last is not None and last.status == "aborted"
            m = next(m for m in (await sl.get_session(ack.session_id)).messages if m.msg_id == ack.reply_id)
            assert text == m.content
    try:
        run(backend, scenario)
    finally:
        held.stop()
