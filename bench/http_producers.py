"""External producers and stream readers over HTTP (issue 27 item 6), next to
the in-process path in the same run; every load generator runs in processes
of its own, never in the server's.

    python -m bench http_producers [--quick] [--replies 1000] [--readers 1000] [--seconds 10]

1. Producers: N external replies, each appended to once per 250 ms (the
   durability interval: a producer batches its model's deltas, as
   docs/HTTP.md advises) with the idempotent producer's headers, by
   producer processes holding 250 kept-alive connections each (one request
   per append), and again by processes of 250 replies sending one request
   per interval for all of them (POST /v1/appends, a backend's way). Measured:
   append -> durable (the producer's send to the group commit that made its
   record durable, CLOCK_MONOTONIC in both processes), appends answered
   within their interval, and the server's CPU per record; the same
   server's CPU per record with N in-process replies written as often
   (the baseline: an agent inside the server).
2. Readers: 100 replies streamed in-process, read over SSE by R readers in
   reader processes: append -> receipt of each record's text.
3. Resume: a reader cut mid-reply and resumed from its offset: the requests
   it took and whether it got exactly the rest.
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

import trio

from .report import cpu_seconds, pct, save, table, verdict

TOKEN = "bench-http-producers"
INTERVAL = 0.25
TEXT = "tok " * 12  # one append: ~12 tokens of a model's output


# -- the server process ----------------------------------------------------------

async def run_server(root: str, mode: str, n: int, out: str) -> None:
    """mode: external (N sessions for producers elsewhere), inprocess (N
    replies written here), readers (N replies written here, for SSE readers)."""
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
    cfg = ServerConfig(port=0, token=TOKEN, send_timeout=2.0, producer_timeout=600.0)
    appended: list[tuple[str, int, float]] = []   # (msg id, char offset, append time)
    durable: list[tuple[str, int, float]] = []    # (msg id, char offset, durable time)
    pending: list[tuple[str, int, str, int]] = []  # (session, seq, msg id, offset) not yet durable
    window = {"on": False, "records": 0}
    async with trio.open_nursery() as root_n:
        root_n.start_soon(lambda: serve_store(root, cfg, agent=DemoAgent(speed=0),
                                              store_config=StoreConfig(checkpoint_interval=3600), on_ready=on_ready))
        await ready.wait()
        server = holder["s"]
        store, es = server.store, server.store.es

        def on_record(sid: str, rec: Any, end: int) -> None:
            ev = rec.event
            if type(ev) is MessageProgress and window["on"]:
                window["records"] += 1
                appended.append((ev.msg_id, ev.offset, time.perf_counter()))
                pending.append((sid, rec.seq, ev.msg_id, ev.offset))

        def on_batch(records: int, first: float, done: float) -> None:
            keep = []
            for p in pending:
                if es.durable_seq(p[0]) >= p[1]:
                    durable.append((p[2], p[3], done))
                else:
                    keep.append(p)
            pending[:] = keep
        es.listeners.append(on_record)
        es.batch_listeners.append(on_batch)
        stop = trio.Event()
        targets: list[list[str]] = []
        msgs: list[Any] = []

        async def reply(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            meta, _ = await store.create_session(first_message="bench")
            async with store.inflight(meta.id) as msg:
                targets.append([meta.id, msg.msg_id])
                msgs.append(msg)
                task_status.started()
                await stop.wait()

        async def drive() -> None:  # every reply written once per interval, spread over it
            i = 0
            step = INTERVAL / max(1, len(msgs))
            nxt = trio.current_time()
            while not stop.is_set():
                msgs[i % len(msgs)].write(TEXT)
                i += 1
                nxt += step
                if i % 50 == 0:
                    await trio.sleep_until(nxt)

        async with trio.open_nursery() as nursery:
            if mode in ("external", "batched"):
                for _ in range(n):
                    meta, _ = await store.create_session(first_message="bench")
                    targets.append([meta.id, ""])
            else:
                for _ in range(n):
                    await nursery.start(reply)
                nursery.start_soon(drive)
            print(json.dumps({"port": server.port, "targets": targets}), flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
            window["on"] = True
            cpu0 = cpu_seconds()
            await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
            cpu = cpu_seconds() - cpu0
            window["on"] = False
            with open(out, "w") as f:
                json.dump({"appended": appended, "durable": durable, "cpu": cpu, "records": window["records"]}, f)
            stop.set()
            nursery.cancel_scope.cancel()
        root_n.cancel_scope.cancel()


# -- HTTP/1.1 on a kept-alive connection, by hand (a load generator's) ----------

class Conn:
    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buf = b""
        self.requests = 0

    async def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
                      ) -> tuple[int, dict[str, str], bytes]:
        if self.stream is None:
            self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
        self.requests += 1
        h = {"Host": f"127.0.0.1:{self.port}", "Authorization": f"Bearer {TOKEN}",
             "Content-Length": str(len(body)), **(headers or {})}
        head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        await self.stream.send_all(head.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += await self._more()
        raw, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        size = int(fields.get("content-length", "0"))
        while len(self.buf) < size:
            self.buf += await self._more()
        data, self.buf = self.buf[:size], self.buf[size:]
        return status, fields, data

    async def _more(self) -> bytes:
        assert self.stream is not None
        data = await self.stream.receive_some(65536)
        if not data:
            raise ConnectionError("closed")
        return bytes(data)


async def run_producers(port: int, sessions: list[str], first: int, out: str) -> None:
    sent: list[tuple[str, int, float, float]] = []  # (msg id, char offset, send, answer)
    opened = [0]
    all_open = trio.Event()
    go, recording = trio.Event(), [False]

    async def one(i: int, sid: str) -> None:
        c = Conn(port)
        status, _, body = await c.request("POST", f"/v1/sessions/{sid}/replies", b"{}",
                                          {"Content-Type": "application/json"})
        assert status == 201, body
        stream = json.loads(body)["stream"]
        mid = json.loads(body)["reply_id"]
        opened[0] += 1
        if opened[0] == len(sessions):
            all_open.set()
        await go.wait()
        await trio.sleep(INTERVAL * ((first + i) % 997) / 997)  # spread over the interval
        offset, seq = 0, 0
        nxt = trio.current_time()
        while True:
            t0 = time.perf_counter()
            status, _, _ = await c.request("POST", stream, TEXT.encode(), {
                "Content-Type": "text/plain", "Producer-Id": f"bench-{i}", "Producer-Epoch": "0",
                "Producer-Seq": str(seq)})
            t1 = time.perf_counter()
            assert status in (200, 204), status
            if recording[0]:
                sent.append((mid, offset, t0, t1))
            offset += len(TEXT)
            seq += 1
            nxt += INTERVAL
            await trio.sleep_until(nxt)

    async with trio.open_nursery() as nursery:
        for i, sid in enumerate(sessions):
            nursery.start_soon(one, i, sid)
        await all_open.wait()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
        go.set()
        await trio.sleep(2 * INTERVAL)
        recording[0] = True
        await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
        recording[0] = False
        with open(out, "w") as f:
            json.dump(sent, f)
        nursery.cancel_scope.cancel()


async def run_batched(port: int, sessions: list[str], first: int, out: str) -> None:
    """One backend streaming all its replies: every interval, one request
    (POST /v1/appends) carries one append to each, with its producer ids."""
    sent: list[tuple[str, int, float, float]] = []
    c = Conn(port)
    replies = []
    for sid in sessions:
        status, _, body = await c.request("POST", f"/v1/sessions/{sid}/replies", b"{}",
                                          {"Content-Type": "application/json"})
        assert status == 201, body
        replies.append((sid, json.loads(body)["reply_id"]))
    print("ready", flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
    recording = [False]
    stopping = trio.Event()

    async def loop() -> None:
        offset, seq = 0, 0
        await trio.sleep(INTERVAL * (first % 997) / 997)
        nxt = trio.current_time()
        while not stopping.is_set():
            body = json.dumps({"appends": [{"session_id": sid, "reply_id": rid, "text": TEXT,
                                            "producer": {"id": f"bench-{rid}", "epoch": 0, "seq": seq}}
                                           for sid, rid in replies]}).encode()
            t0 = time.perf_counter()
            status, _, answer = await c.request("POST", "/v1/appends", body, {"Content-Type": "application/json"})
            t1 = time.perf_counter()
            assert status == 200 and all(r["status"] in (200, 204) for r in json.loads(answer)["results"]), answer
            if recording[0]:
                sent.extend((rid, offset, t0, t1) for _, rid in replies)
            offset += len(TEXT)
            seq += 1
            nxt += INTERVAL
            await trio.sleep_until(nxt)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop)
        await trio.sleep(2 * INTERVAL)
        recording[0] = True
        await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
        recording[0] = False
        with open(out, "w") as f:
            json.dump(sent, f)
        stopping.set()
        nursery.cancel_scope.cancel()


async def run_readers(port: int, targets: list[list[str]], n: int, first: int, out: str) -> None:
    got: list[tuple[str, int, int, float]] = []  # (msg id, first char, last char, receipt)
    connected = [0]
    all_connected = trio.Event()
    recording = [False]

    async def one(i: int) -> None:
        sid, mid = targets[(first + i) % len(targets)]
        s = await trio.open_tcp_stream("127.0.0.1", port)
        path = f"/v1/stream/sessions/{sid}/messages/{mid}?offset=now&live=sse"
        await s.send_all(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        buf, pos, counted = b"", -1, False
        while True:
            data = await s.receive_some(65536)
            if not data:
                return
            now = time.perf_counter()
            buf += data
            text = buf.decode("utf-8", "replace")
            for block in text.split("\n\n")[:-1]:
                if '"streamNextOffset"' in block:
                    nxt = int(json.loads(block.split("data: ", 1)[1].split("\n")[0])["streamNextOffset"][:16])
                    if pos >= 0 and nxt > pos and recording[0]:
                        got.append((mid, pos, nxt, now))
                    pos = nxt
                    if not counted:
                        counted = True
                        connected[0] += 1
                        if connected[0] == n:
                            all_connected.set()
            buf = text.rsplit("\n\n", 1)[-1].encode() if "\n\n" in text else buf

    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
        await all_connected.wait()
        print("ready", flush=True)
        await trio.to_thread.run_sync(sys.stdin.readline)  # "go"
        recording[0] = True
        await trio.to_thread.run_sync(sys.stdin.readline)  # "stop"
        recording[0] = False
        with open(out, "w") as f:
            json.dump(got, f)
        nursery.cancel_scope.cancel()


# -- the harness ------------------------------------------------------------------

def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.http_producers", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))


def _say(procs: list[subprocess.Popen[str]], line: str) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(line + "\n")
        p.stdin.flush()


def run(d: str, mode: str, n: int, clients: int, per_process: int, seconds: float) -> dict[str, Any]:
    """One server (mode) and its load generators; the server's figures and the clients' files."""
    srv_out = os.path.join(d, f"{mode}-server.json")
    server = _spawn("--role", "server", "--mode", mode, "--root", os.path.join(d, mode), "--n", str(n),
                    "--out", srv_out)
    assert server.stdout is not None
    hello = json.loads(server.stdout.readline())
    port, targets = hello["port"], hello["targets"]
    tfile = os.path.join(d, f"{mode}-targets.json")
    with open(tfile, "w") as f:
        json.dump(targets, f)
    gens, outs = [], []
    role = {"external": "producers", "batched": "batched"}.get(mode, "readers")
    for first in range(0, clients, per_process):
        k = min(per_process, clients - first)
        out = os.path.join(d, f"{mode}-{first}.json")
        gens.append(_spawn("--role", role, "--port", str(port), "--targets", tfile, "--n", str(k),
                           "--first", str(first), "--out", out))
        outs.append(out)
    for g in gens:
        assert g.stdout is not None and g.stdout.readline().strip() == "ready"
    _say(gens + [server], "go")
    time.sleep(seconds)
    _say(gens + [server], "stop")
    for g in gens:
        g.wait(60)
    server.wait(60)
    with open(srv_out) as f:
        srv = json.load(f)
    got: list[Any] = []
    for out in outs:
        with open(out) as f:
            got += json.load(f)
    return {"server": srv, "clients": got}


def producers_row(r: dict[str, Any], n: int, seconds: float) -> dict[str, Any]:
    durable = {(m, o): t for m, o, t in r["server"]["durable"]}
    lat = [durable[(m, o)] - t0 for m, o, t0, _ in r["clients"] if (m, o) in durable]
    answered = [t1 - t0 for _, _, t0, t1 in r["clients"]]
    srv = r["server"]
    return {"path": "HTTP producers", "replies": n, "records/s": srv["records"] / seconds,
            "append->durable p50 ms": pct(lat, 50) * 1e3, "p99 ms": pct(lat, 99) * 1e3,
            "answered within interval %": 100 * sum(a < INTERVAL for a in answered) / max(1, len(answered)),
            "server CPU us/record": srv["cpu"] / max(1, srv["records"]) * 1e6}


def inprocess_row(r: dict[str, Any], n: int, seconds: float) -> dict[str, Any]:
    srv = r["server"]
    return {"path": "in-process agent", "replies": n, "records/s": srv["records"] / seconds,
            "append->durable p50 ms": float("nan"), "p99 ms": float("nan"),
            "answered within interval %": float("nan"),
            "server CPU us/record": srv["cpu"] / max(1, srv["records"]) * 1e6}


def readers_row(r: dict[str, Any], readers: int) -> dict[str, Any]:
    appended: dict[str, list[tuple[int, float]]] = {}
    for m, o, t in r["server"]["appended"]:
        appended.setdefault(m, []).append((o, t))
    lat: list[float] = []
    for m, a, b, t in r["clients"]:
        for o, ta in appended.get(m, ()):
            if a <= o < b:
                lat.append(t - ta)
    return {"replies": 100, "SSE readers": readers, "records received": len(lat),
            "p50 ms": pct(lat, 50) * 1e3, "p99 ms": pct(lat, 99) * 1e3, "max ms": max(lat or [0]) * 1e3}


async def resume_requests(d: str) -> dict[str, Any]:
    """A reader cut mid-reply resumes from its offset: how many requests, and
    whether it got exactly the rest (a server in this process: a functional row)."""
    from sessionlog_store.server.agents.demo import DemoAgent
    from sessionlog_store.server.edge.ws import Server, ServerConfig
    from sessionlog_store.server.run import serve_store
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    async with trio.open_nursery() as n:
        n.start_soon(lambda: serve_store(os.path.join(d, "resume"), ServerConfig(port=0, token=TOKEN),
                                         agent=DemoAgent(speed=0), on_ready=on_ready))
        await ready.wait()
        port = holder["s"].port
        c = Conn(port)
        sid = json.loads((await c.request("POST", "/v1/sessions", b"{}", {"Content-Type": "application/json"}))[2])
        sid = sid["session"]["id"]
        rep = json.loads((await c.request("POST", f"/v1/sessions/{sid}/replies", b"{}",
                                          {"Content-Type": "application/json"}))[2])
        for i in range(20):
            await c.request("POST", rep["stream"], f"piece {i} ".encode(), {"Content-Type": "text/plain"})
        reader = Conn(port)
        _, h, first = await reader.request("GET", rep["stream"])
        cut = h["stream-next-offset"]
        for i in range(20, 40):
            await c.request("POST", rep["stream"], f"piece {i} ".encode(), {"Content-Type": "text/plain"})
        await c.request("POST", rep["stream"], b"end", {"Content-Type": "text/plain", "Stream-Closed": "true"})
        again = Conn(port)
        _, h2, rest = await again.request("GET", f"{rep['stream']}?offset={cut}")
        whole = "".join(f"piece {i} " for i in range(40)) + "end"
        n.cancel_scope.cancel()
    return {"requests to resume": again.requests, "exactly the rest": (first + rest).decode() == whole,
            "closed": h2.get("stream-closed") == "true"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench http_producers")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replies", type=int, default=1000)
    ap.add_argument("--readers", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--per-process", type=int, default=250)
    ap.add_argument("--role", choices=["harness", "server", "producers", "batched", "readers"], default="harness")
    ap.add_argument("--mode", choices=["external", "batched", "inprocess", "readers"])
    ap.add_argument("--root")
    ap.add_argument("--n", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--port", type=int)
    ap.add_argument("--targets")
    ap.add_argument("--first", type=int, default=0)
    a = ap.parse_args(argv)
    if a.role == "server":
        trio.run(run_server, a.root, a.mode, a.n, a.out)
        return 0
    if a.role in ("producers", "batched", "readers"):
        with open(a.targets) as f:
            targets = json.load(f)
        if a.role in ("producers", "batched"):
            trio.run(run_producers if a.role == "producers" else run_batched, a.port,
                     [t[0] for t in targets[a.first:a.first + a.n]], a.first, a.out)
        else:
            trio.run(run_readers, a.port, targets, a.n, a.first, a.out)
        return 0
    seconds = 4.0 if a.quick else a.seconds
    replies = 200 if a.quick else a.replies
    readers = 200 if a.quick else a.readers
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        ext = producers_row(run(d, "external", replies, replies, a.per_process, seconds), replies, seconds)
        bat = producers_row(run(d, "batched", replies, replies, a.per_process, seconds), replies, seconds)
        bat["path"] = "HTTP, batched"
        inp = inprocess_row(run(d, "inprocess", replies, 0, a.per_process, seconds), replies, seconds)
        fan = readers_row(run(d, "readers", 100, readers, a.per_process, seconds), readers)
        res = trio.run(resume_requests, d)
    rows = [ext, bat, inp]
    print(table(f"producers: one append per reply per {INTERVAL * 1e3:.0f} ms, producers in other processes "
                f"({seconds:.0f} s each)", rows))
    print(table("SSE readers in other processes: append -> receipt", [fan]))
    print(table("a reader's resume after a cut", [res]))
    ratio = ext["server CPU us/record"] / inp["server CPU us/record"]
    batched = bat["server CPU us/record"] / inp["server CPU us/record"]
    print(verdict(f"append->durable p99 ms, {replies} replies, one request per append", ext["p99 ms"], 50.0,
                  higher_is_better=False))
    print(verdict("server CPU per record, one request per append / in-process agent", ratio, 1.5,
                  higher_is_better=False))
    print(verdict(f"append->durable p99 ms, {replies} replies, batched (POST /v1/appends)", bat["p99 ms"], 50.0,
                  higher_is_better=False))
    print(verdict("server CPU per record, batched / in-process agent", batched, 1.5, higher_is_better=False))
    print(verdict(f"SSE fan-out p99 ms, {readers} readers", fan["p99 ms"], 50.0, higher_is_better=False))
    print(verdict("requests for a reader's resume", float(res["requests to resume"]), 1.0, higher_is_better=False))
    print("saved", save("http_producers", {"rows": rows, "readers": fan, "resume": res, "seconds": seconds,
                                            "cpu ratio": ratio, "cpu ratio batched": batched}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
