"""Fan-out: latency from a progress record's append to its receipt by WebSocket
clients that run in *other processes* than the server.

    python -m bench fanout [--quick] [--clients-per-process 250]

The server process (`--role server`) opens a store, starts M producers
streaming through the real in-flight API (a write every 50 ms, so one
progress record per 250 ms interval each) and notes when each progress
record is appended (CLOCK_MONOTONIC, the same clock in every process here).
Client processes (`--role clients`) hold hundreds of connections each,
subscribe and note when each `msg_update` arrives. With one client process
that subscribes to every message and never reads (a stalled client), and
without. Every record counts: an update that carries several records
(coalesced for a slow reader) counts each of them, from its own append.

The machine's two cores are shared by the server and the client processes:
read the figures next to each other, not as a server's capacity.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec
import trio

from .report import pct, save, table, verdict

TOKEN = "bench"


# -- the server process --------------------------------------------------------

async def run_server(root: str, messages: int, out: str) -> None:
    from sessionlog_store.eventstore.events import MessageProgress
    from sessionlog_store.server.agents.demo import DemoAgent
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.edge.ws import Server, ServerConfig
    from sessionlog_store.server.run import serve_store

    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    cfg = ServerConfig(port=0, token=TOKEN, send_timeout=2.0)
    appended: dict[str, list[tuple[int, float]]] = {}
    async with trio.open_nursery() as root_n:
        root_n.start_soon(lambda: serve_store(root, cfg, agent=DemoAgent(speed=0),
                                              store_config=StoreConfig(checkpoint_interval=3600), on_ready=on_ready))
        await ready.wait()
        server = holder["s"]
        store = server.store

        def on_record(sid: str, rec: Any, end: int) -> None:
            if type(rec.event) is MessageProgress:
                appended.setdefault(sid, []).append((rec.seq, time.perf_counter()))
        store.es.listeners.append(on_record)
        targets: list[list[str]] = []
        stop = trio.Event()

        async def producer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            meta, _ = await store.create_session(first_message="fan out")
            async with store.inflight(meta.id) as msg:
                targets.append([meta.id, msg.msg_id])
                task_status.started()
                while not stop.is_set():
                    msg.write("token ")
                    await trio.sleep(0.05)

        async with trio.open_nursery() as n:
            for _ in range(messages):
                await n.start(producer)
            print(json.dumps({"port": server.port, "targets": targets}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
            stop.set()
            n.cancel_scope.cancel()
        with open(out, "w") as f:
            json.dump(appended, f)
        root_n.cancel_scope.cancel()


# -- a client process ----------------------------------------------------------

class _Update(msgspec.Struct):
    session_id: str
    seq: int


class _Frame(msgspec.Struct):
    type: str
    data: Any = None


async def run_clients(port: int, targets: list[list[str]], n: int, first: int, stalled: bool, out: str) -> None:
    from trio_websocket import open_websocket
    decode = msgspec.json.Decoder(_Frame).decode
    got: list[tuple[int, str, int, float]] = []  # (connection, session, seq, receipt time)
    recording = [False]
    connected = [0]
    all_connected = trio.Event()

    async def one(i: int) -> None:
        async with open_websocket("127.0.0.1", port, f"/ws?token={TOKEN}", use_ssl=False,
                                  message_queue_size=1 if stalled else 64) as ws:
            subs = targets if stalled else [targets[(first + i) % len(targets)]]
            for sid, mid in subs:
                await ws.send_message(json.dumps({"action": "subscribe_msg", "session_id": sid, "msg_id": mid}))
            connected[0] += 1
            if connected[0] == n:
                all_connected.set()
            if stalled:
                await trio.sleep_forever()
            while True:
                frame = await ws.get_message()
                now = time.perf_counter()
                if recording[0] and '"msg_update"' in frame[:30]:
                    f = decode(frame)
                    got.append((i, f.data["session_id"], f.data["seq"], now))

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
        await all_connected.wait()
        print("connected", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
        recording[0] = True
        await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
        recording[0] = False
        with open(out, "w") as f:
            json.dump(got, f)
        nursery.cancel_scope.cancel()


# -- the harness -----------------------------------------------------------------

def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.fanout", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def scenario(d: str, messages: int, subscribers: int, per_process: int, stalled: bool,
             seconds: float) -> dict[str, Any]:
    srv_out = os.path.join(d, "appended.json")
    server = _spawn("--role", "server", "--root", os.path.join(d, "store"), "--messages", str(messages),
                    "--out", srv_out)
    assert server.stdout is not None and server.stdin is not None
    hello = json.loads(server.stdout.readline())
    port, targets = hello["port"], hello["targets"]
    tfile = os.path.join(d, "targets.json")
    with open(tfile, "w") as f:
        json.dump(targets, f)
    clients = []
    first = 0
    while first < subscribers:
        k = min(per_process, subscribers - first)
        out = os.path.join(d, f"got-{first}.json")
        clients.append((_spawn("--role", "clients", "--port", str(port), "--targets", tfile, "--n", str(k),
                               "--first", str(first), "--out", out), out))
        first += k
    if stalled:
        clients.append((_spawn("--role", "clients", "--port", str(port), "--targets", tfile, "--n", "1",
                               "--stalled", "--out", os.path.join(d, "stalled.json")), None))
    for c, _ in clients:
        assert c.stdout is not None and c.stdout.readline().strip() == "connected"
    for c, _ in clients:
        assert c.stdin is not None
        c.stdin.write("go\n")
        c.stdin.flush()
    time.sleep(seconds)
    for c, _ in clients:
        assert c.stdin is not None
        c.stdin.write("stop\n")
        c.stdin.flush()
    for c, _ in clients:
        c.wait(60)
    server.stdin.write("stop\n")
    server.stdin.flush()
    server.wait(60)
    with open(srv_out) as f:
        appended = {sid: sorted(v) for sid, v in json.load(f).items()}
    lat: list[float] = []
    updates = 0
    for _, out in clients:
        if out is None:
            continue
        with open(out) as f:
            got = json.load(f)
        updates += len(got)
        last: dict[tuple[int, str], int] = {}
        for conn, sid, seq, t in sorted(got, key=lambda g: (g[0], g[1], g[2])):
            prev = last.get((conn, sid))
            last[(conn, sid)] = seq
            if prev is None:
                continue  # the first update after "go" may carry records from before it
            for s, ta in appended.get(sid, ()):
                if prev < s <= seq:
                    lat.append(t - ta)
    return {"messages": messages, "subscribers": subscribers, "client processes": len(clients) - stalled,
            "stalled client": stalled, "updates": updates, "records received": len(lat),
            "p50 ms": pct(lat, 50) * 1e3, "p99 ms": pct(lat, 99) * 1e3, "max ms": max(lat or [0]) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fanout")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--clients-per-process", type=int, default=250)
    ap.add_argument("--role", choices=["harness", "server", "clients"], default="harness")
    ap.add_argument("--root")
    ap.add_argument("--messages", type=int, default=100)
    ap.add_argument("--out")
    ap.add_argument("--port", type=int)
    ap.add_argument("--targets")
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--stalled", action="store_true")
    a = ap.parse_args(argv)
    if a.role == "server":
        trio.run(run_server, a.root, a.messages, a.out)
        return 0
    if a.role == "clients":
        with open(a.targets) as f:
            targets = json.load(f)
        trio.run(run_clients, a.port, targets, a.n, a.first, a.stalled, a.out)
        return 0
    seconds = 4.0 if a.quick else 10.0
    subs = 300 if a.quick else 1000
    rows = []
    for messages, subscribers in ((100, subs), (1, subs // 2)):
        for stalled in (False, True):
            with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
                rows.append(scenario(d, messages, subscribers, a.clients_per_process, stalled, seconds))
    print(table(f"push latency, append -> receipt, clients in other processes ({seconds:.0f} s each)", rows))
    print(verdict(f"p99 ms, 100 messages x {subs} subscribers, a stalled client present", rows[1]["p99 ms"], 50.0,
                  higher_is_better=False))
    print(verdict("p99 ms, the same without the stalled client", rows[0]["p99 ms"], 50.0, higher_is_better=False))
    print("saved", save("fanout", {"rows": rows, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
