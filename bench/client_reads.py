"""python -m bench client_reads [--quick]: how the Python client reads a
busy reply (issue 28 item 1: "measure and decide"), beside PyPI's
`durable-streams` reader on the same reply in the same run.

A `serve` subprocess; a producer process appends to one reply every 20 ms
(each piece carries its send time); readers, each in its own process,
follow the reply to its end: the client's long-poll reader under asyncio
and under trio, and `durable_streams.astream` by SSE and by long-poll
(asyncio: it is asyncio-only for writing, not for reading). Each reports
the delay from an append's send to its arrival (p50, p99), how many HTTP
requests it made, and its CPU time. The client reads by SSE (under asyncio
and trio) and, as it did first, by long-poll."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.report import pct, save, table

TOKEN = "bench-client-reads"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(root: str) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store.server.cli", "serve", "--root", root, "--port",
                             str(port), "--token", TOKEN, "--log-level", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("serve did not start")


def produce(port: str, sid: str, rid_file: str, seconds: str) -> None:
    """(A process.) One reply, a piece every 20 ms for `seconds`, each
    `<send time in ns>;`."""
    import anyio

    from sessionlog_store.client import Client

    async def main() -> None:
        async with Client(f"http://127.0.0.1:{port}", TOKEN) as sl:
            async with sl.reply(sid, interval=0.02) as r:
                with open(rid_file, "w") as f:
                    f.write(r.reply_id)
                while not os.path.exists(rid_file + ".go"):  # (every reader at the tail first)
                    await anyio.sleep(0.01)
                end = time.monotonic() + float(seconds)
                while time.monotonic() < end:
                    r.write(f"{time.time_ns()};")
                    await anyio.sleep(0.02)
    anyio.run(main)


def read(kind: str, port: str, sid: str, rid: str, out: str) -> None:
    """(A process.) Follow the reply to its end; write what was seen."""
    import httpx
    requests = [0]
    arrivals: list[tuple[float, str]] = []

    async def count(_: Any) -> None:
        requests[0] += 1
    url = f"http://127.0.0.1:{port}/v1/stream/sessions/{sid}/messages/{rid}"
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def client_reader() -> None:
        from sessionlog_store.client import Client
        http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=60,
                                 event_hooks={"request": [count]})
        async with Client("", http=http) as sl:
            async for chunk in sl.read_message(sid, rid, mode="long-poll" if kind.endswith("long-poll") else "sse"):
                arrivals.append((time.time_ns(), chunk.text))

    async def ds_reader(live: str) -> None:
        import durable_streams
        async with httpx.AsyncClient(headers=headers, timeout=60, event_hooks={"request": [count]}) as http:
            async with durable_streams.astream(url, live=live, client=http) as res:  # type: ignore[arg-type]
                async for text in res.iter_text():
                    arrivals.append((time.time_ns(), text))

    t0 = time.process_time()
    if kind.startswith("client"):
        import anyio
        anyio.run(client_reader, backend="trio" if kind == "client-trio" else "asyncio")
    else:
        import asyncio
        try:
            asyncio.run(asyncio.wait_for(ds_reader(kind.split("-", 1)[1]), 120))
        except (TimeoutError, asyncio.TimeoutError):
            pass  # (a reader that never saw the end: its figures stand, marked)
    cpu = time.process_time() - t0
    delays = []
    text = ""
    for at, piece in arrivals:
        text += piece
        for sent in piece.split(";"):
            if sent.strip():
                delays.append((at - int(sent)) / 1e6)
    with open(out, "w") as f:
        json.dump({"delays": delays, "requests": requests[0], "cpu": cpu, "pieces": text.count(";")}, f)


KINDS = ("client-asyncio", "client-trio", "client-long-poll", "ds-sse", "ds-long-poll")


def main(argv: list[str]) -> int:
    if argv and argv[0] in ("produce", "read"):
        (produce if argv[0] == "produce" else read)(*argv[1:])  # type: ignore[operator]
        return 0
    seconds = 4.0 if "--quick" in argv else 15.0
    with tempfile.TemporaryDirectory() as d:
        server, port = _serve(os.path.join(d, "root"))
        try:
            import httpx
            h = {"Authorization": f"Bearer {TOKEN}"}
            sid = httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json={}, headers=h).json()["session"]["id"]
            httpx.post(f"http://127.0.0.1:{port}/v1/sessions/{sid}/messages", json={"content": "go"}, headers=h)
            rid_file = os.path.join(d, "rid")
            prod = subprocess.Popen([sys.executable, "-m", "bench", "client_reads", "produce", str(port), sid,
                                     rid_file, str(seconds)])
            while not os.path.exists(rid_file) or not open(rid_file).read():
                time.sleep(0.02)
            rid = open(rid_file).read()
            readers = {k: subprocess.Popen([sys.executable, "-m", "bench", "client_reads", "read", k, str(port), sid,
                                            rid, os.path.join(d, f"{k}.json")]) for k in KINDS}
            time.sleep(2.0)  # (the readers' first reads: each waits at the tail when the pieces start)
            open(rid_file + ".go", "w").close()
            prod.wait()
            rows = []
            for k, p in readers.items():
                p.wait(180)
                r = json.load(open(os.path.join(d, f"{k}.json")))
                rows.append({"reader": k, "pieces": r["pieces"], "delay p50 ms": pct(r["delays"], 50),
                             "delay p99 ms": pct(r["delays"], 99), "requests": r["requests"],
                             "CPU ms": round(r["cpu"] * 1000)})
        finally:
            server.terminate()
            server.wait(30)
    print(table(f"one reply, a piece every 20 ms for {seconds:.0f} s, five readers in their own processes", rows))
    print(f"saved {save('client_reads', {'seconds': seconds, 'rows': rows})}")
    return 0
