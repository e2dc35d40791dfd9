"""The HTTP side's stack (issue 27 item 5): today's h11 edge extended by hand
against an ASGI stack on trio (Hypercorn's trio worker with Starlette), on
what an HTTP API adds to the edge: keep-alive requests for a static file
(with an ETag) and SSE fan-out.

    python -m bench http_stack [--quick] [--readers 200,1000] [--seconds 8]

(needs the `bench` extra: `.venv/bin/pip install -e '.[bench]'`)

Each server runs in a process of its own (`--role server --stack h11|asgi`)
and broadcasts one event every 50 ms to every SSE reader, carrying the
CLOCK_MONOTONIC time it was made (the same clock in every process here).
Reader processes (`--role readers`) hold the connections and note each
event's delay. The server's CPU is read from /proc over the measured window:
CPU per event delivered is that over (readers x events). Requests/s come from
wrk (Debian's) with 16 keep-alive connections on one thread.

Both servers share the broadcast (a bounded channel per reader, dropped when
full) and the event bytes: what differs is the HTTP stack under them. The
h11 one is a prototype of what the edge would grow (keep-alive, chunked
responses, ETag and 304), not the edge itself.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Any

import trio

from .report import pct, save, table, verdict

STATIC = os.path.join(os.path.dirname(__file__), "..", "sessionlog_store", "server", "edge", "static")
FILE = "app.js"
TICK = 0.05  # an event every 50 ms
PAD = "x" * 80


# -- the servers -----------------------------------------------------------------

class Hub:
    def __init__(self) -> None:
        self.readers: set[trio.MemorySendChannel[bytes]] = set()
        self.n = 0

    async def run(self) -> None:
        while True:
            await trio.sleep(TICK)
            self.n += 1
            frame = f'event: data\ndata: {{"t":{time.monotonic():.6f},"n":{self.n},"p":"{PAD}"}}\n\n'.encode()
            for ch in list(self.readers):
                try:
                    ch.send_nowait(frame)
                except trio.WouldBlock:
                    pass  # (a slow reader misses events; counted by its reader)


def _etag(data: bytes) -> str:
    import hashlib
    return '"' + hashlib.sha1(data).hexdigest()[:16] + '"'


async def serve_h11(hub: Hub, task_status: trio.TaskStatus[int]) -> None:
    import h11
    with open(os.path.join(STATIC, FILE), "rb") as f:
        body = f.read()
    tag = _etag(body).encode()

    async def handle(stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Request):
                    req = event
                    continue
                if isinstance(event, h11.EndOfMessage):
                    target = req.target
                    if target == b"/sse":
                        send, recv = trio.open_memory_channel[bytes](64)
                        hub.readers.add(send)
                        try:
                            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[
                                (b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-store"),
                                (b"X-Accel-Buffering", b"no")])))
                            async for frame in recv:
                                await stream.send_all(conn.send(h11.Data(data=frame)))
                        finally:
                            hub.readers.discard(send)
                        return
                    if target == f"/static/{FILE}".encode():
                        if dict(req.headers).get(b"if-none-match") == tag:
                            out = conn.send(h11.Response(status_code=304, headers=[(b"ETag", tag)]))
                        else:
                            out = conn.send(h11.Response(status_code=200, headers=[
                                (b"Content-Type", b"text/javascript; charset=utf-8"),
                                (b"Content-Length", str(len(body)).encode()), (b"ETag", tag)]))
                            out += conn.send(h11.Data(data=body))
                    else:
                        out = conn.send(h11.Response(status_code=404, headers=[(b"Content-Length", b"0")]))
                    out += conn.send(h11.EndOfMessage())
                    await stream.send_all(out)
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
                    continue
                if event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            return
        finally:
            await stream.aclose()

    async with trio.open_nursery() as n:
        listeners = await n.start(partial(trio.serve_tcp, host="127.0.0.1"), handle, 0)
        task_status.started(listeners[0].socket.getsockname()[1])


async def serve_asgi(hub: Hub, task_status: trio.TaskStatus[int]) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    async def sse(request: Request) -> StreamingResponse:
        send, recv = trio.open_memory_channel[bytes](64)
        hub.readers.add(send)

        async def frames() -> Any:
            try:
                async for frame in recv:
                    yield frame
            finally:
                hub.readers.discard(send)
        return StreamingResponse(frames(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    app = Starlette(routes=[Route("/sse", sse), Mount("/static", StaticFiles(directory=STATIC))])
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    async with trio.open_nursery() as n:
        binds = await n.start(lambda task_status: serve(app, config, task_status=task_status))  # type: ignore[arg-type]
        task_status.started(int(binds[0].rsplit(":", 1)[1]))


async def run_server(stack: str, port_file: str) -> None:
    hub = Hub()
    async with trio.open_nursery() as n:
        n.start_soon(hub.run)
        port = await n.start(serve_h11 if stack == "h11" else serve_asgi, hub)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.rename(port_file + ".tmp", port_file)


# -- the readers ----------------------------------------------------------------

async def run_readers(port: int, n: int, start: float, seconds: float, out: str, ready_file: str) -> None:
    delays: list[float] = []
    seen: list[int] = []
    connected = 0
    all_in = trio.Event()

    async def reader() -> None:
        nonlocal connected
        for _ in range(50):  # (a burst of connects can overflow the listen backlog: try again)
            try:
                s = await trio.open_tcp_stream("127.0.0.1", port)
                break
            except OSError:
                await trio.sleep(0.05)
        await s.send_all(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
        connected += 1
        if connected == n:
            all_in.set()
        buf = b""
        count = 0
        while True:
            data = await s.receive_some(65536)
            if not data:
                return
            buf += data
            while True:
                i = buf.find(b'{"t":')
                if i < 0:
                    break
                j = buf.find(b",", i)
                if j < 0:
                    break
                t = float(buf[i + 5:j])
                now = time.monotonic()
                if start <= t < start + seconds:
                    delays.append(now - t)
                    count += 1
                buf = buf[j:]
            if time.monotonic() > start + seconds + 1:
                seen.append(count)
                return

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(reader)
            if i % 50 == 49:
                await trio.sleep(0.02)
        await all_in.wait()
        with open(ready_file, "w") as f:
            f.write("ready")
    with open(out, "w") as f:
        json.dump({"delays": delays, "per_reader": seen}, f)


# -- the conductor --------------------------------------------------------------

def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_file(path: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)
    with open(path) as f:
        return f.read()


def measure(stack: str, readers: int, seconds: float, tmp: str) -> dict[str, Any]:
    port_file = os.path.join(tmp, f"{stack}.{readers}.port")
    me = [sys.executable, "-m", "bench.http_stack"]
    server = subprocess.Popen([*me, "--role", "server", "--stack", stack, "--port-file", port_file])
    try:
        port = int(_wait_file(port_file, 30))
        row: dict[str, Any] = {"stack": stack, "readers": readers, "static_rps": float("nan")}
        if shutil.which("wrk"):
            out = subprocess.run(["wrk", "-t1", "-c16", f"-d{max(2, int(seconds / 2))}s",
                                  f"http://127.0.0.1:{port}/static/{FILE}"], capture_output=True, text=True).stdout
            line = next((ln for ln in out.splitlines() if ln.startswith("Requests/sec")), "Requests/sec: 0")
            row["static_rps"] = float(line.split()[1])
        procs, outs = [], []
        start = time.monotonic() + 4 + readers / 200
        per = [readers // 2, readers - readers // 2]
        for i, k in enumerate(per):
            o, r = os.path.join(tmp, f"{stack}.{readers}.{i}.json"), os.path.join(tmp, f"{stack}.{readers}.{i}.ready")
            outs.append(o)
            procs.append(subprocess.Popen([*me, "--role", "readers", "--port", str(port), "--n", str(k),
                                           "--start", str(start), "--seconds", str(seconds), "--out", o,
                                           "--ready-file", r]))
            _wait_file(r, 60)
        while time.monotonic() < start:
            time.sleep(0.01)
        cpu0 = _cpu(server.pid)
        time.sleep(seconds)
        cpu1 = _cpu(server.pid)
        for p in procs:
            p.wait(timeout=60)
        delays: list[float] = []
        for o in outs:
            with open(o) as f:
                delays += json.load(f)["delays"]
        expected = readers * seconds / TICK
        row.update({"events": len(delays), "delivered_%": 100 * len(delays) / expected,
                    "p50_ms": 1000 * pct(delays, 50), "p99_ms": 1000 * pct(delays, 99),
                    "cpu_%": 100 * (cpu1 - cpu0) / seconds,
                    "cpu_us_per_event": 1e6 * (cpu1 - cpu0) / max(1, len(delays))})
        return row
    finally:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", default="conductor")
    ap.add_argument("--stack", default="h11")
    ap.add_argument("--port-file")
    ap.add_argument("--port", type=int)
    ap.add_argument("--n", type=int)
    ap.add_argument("--start", type=float)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out")
    ap.add_argument("--ready-file")
    ap.add_argument("--readers", default="200,1000")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    if a.role == "server":
        trio.run(run_server, a.stack, a.port_file)
        return
    if a.role == "readers":
        trio.run(run_readers, a.port, a.n, a.start, a.seconds, a.out, a.ready_file)
        return
    seconds = 4.0 if a.quick else a.seconds
    counts = [200] if a.quick else [int(x) for x in a.readers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for readers in counts:
            for stack in ("h11", "asgi"):
                rows.append(measure(stack, readers, seconds, tmp))
    print(table("HTTP stacks: static file over keep-alive (wrk), SSE fan-out to readers in other processes", rows))
    for readers in counts:
        h, s = [r for r in rows if r["readers"] == readers]
        print(verdict(f"SSE p99 at {readers} readers, ASGI stack, ms", s["p99_ms"], 50.0, higher_is_better=False))
        print(verdict(f"SSE p99 at {readers} readers, h11 prototype, ms", h["p99_ms"], 50.0, higher_is_better=False))
    save("http_stack", {"rows": rows})


if __name__ == "__main__":
    main()
