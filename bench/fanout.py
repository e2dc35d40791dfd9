"""Fan-out: push latency from the append to a WebSocket client's receipt, over
loopback (from the moment the progress record is appended, i.e. after the
throttle interval, to the client's receipt), with 100 running messages and 1,000 subscribers (10 per message),
and with many subscribers on one message; each run again with one client
subscribed to everything that never reads.

    python -m bench fanout [--quick]

The server, the producers and the clients share one process (and so the
machine's cores).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import trio
from trio_websocket import open_websocket

from server.agent import DemoAgent
from server.client import open_client
from server.store import StoreConfig
from server.ws import Server, ServerConfig, serve_store

from .report import pct, save, table, verdict

TOKEN = "bench"


async def scenario(root: str, messages: int, subscribers: int, stalled: bool, seconds: float) -> dict[str, float]:
    lat: list[float] = []
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    cfg = ServerConfig(port=0, token=TOKEN, send_timeout=2.0)
    async with trio.open_nursery() as root_n:
        root_n.start_soon(lambda: serve_store(root, cfg, agent=DemoAgent(speed=0),
                                              store_config=StoreConfig(checkpoint_interval=3600), on_ready=on_ready))
        await ready.wait()
        server = holder["s"]
        store, port = server.store, server.port
        stop = trio.Event()
        targets: list[tuple[str, str]] = []
        appended: dict[tuple[str, int], float] = {}
        store.es.listeners.append(lambda sid, rec, end: appended.__setitem__((sid, rec.seq), time.perf_counter()))
        started = trio.Event()

        async def producer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            meta, _ = await store.create_session(first_message="fan out")
            async with store.inflight(meta.id) as msg:
                targets.append((meta.id, msg.msg_id))
                task_status.started()
                await started.wait()
                while not stop.is_set():
                    msg.write(f"<{time.perf_counter():.6f}>")
                    await trio.sleep(0.05)

        async def subscriber(sid: str, mid: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with open_client("127.0.0.1", port, TOKEN) as c:
                await c.request("subscribe_msg", session_id=sid, msg_id=mid, offset=0)
                task_status.started()
                seen = 0
                while not stop.is_set():
                    await c._changed.wait()
                    now = time.perf_counter()
                    for f in c.pushes[seen:]:
                        if f["type"] == "msg_update" and started.is_set():
                            t = appended.get((f["data"]["session_id"], f["data"]["seq"]))
                            if t is not None:
                                lat.append(now - t)
                    seen = len(c.pushes)

        async def sleeper() -> None:
            async with open_websocket("127.0.0.1", port, f"/ws?token={TOKEN}", use_ssl=False,
                                      message_queue_size=1) as ws:
                for sid, mid in targets:
                    await ws.send_message(f'{{"action":"subscribe_msg","session_id":"{sid}","msg_id":"{mid}"}}')
                await stop.wait()

        async with trio.open_nursery() as n:
            for _ in range(messages):
                await n.start(producer)
            for i in range(subscribers):
                sid, mid = targets[i % len(targets)]
                await n.start(subscriber, sid, mid)
            if stalled:
                n.start_soon(sleeper)
            started.set()
            await trio.sleep(seconds)
            stop.set()
            n.cancel_scope.cancel()
        root_n.cancel_scope.cancel()
    return {"pushes": len(lat), "p50 ms": pct(lat, 50) * 1e3, "p99 ms": pct(lat, 99) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench fanout")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args(argv)
    seconds = 4.0 if a.quick else 10.0
    subs = 300 if a.quick else 1000
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        for messages, subscribers in ((100, subs), (1, subs // 2)):
            for stalled in (False, True):
                r = trio.run(scenario, os.path.join(d, f"{messages}-{subscribers}-{stalled}"), messages,
                             subscribers, stalled, seconds)
                rows.append({"messages": messages, "subscribers": subscribers, "stalled client": stalled, **r})
    print(table(f"push latency, append -> client receipt ({seconds:.0f} s each; server, producers and "
                "clients in one process)", rows))
    print(verdict(f"p99 ms, 100 messages x {subs} subscribers", rows[0]["p99 ms"], 50.0, higher_is_better=False))
    print(verdict("p99 ms with one stalled client", rows[1]["p99 ms"], 50.0, higher_is_better=False))
    print("saved", save("fanout", {"rows": rows, "seconds": seconds}))
    return 0
