"""RSS of a server process holding a registry of 100,000 sessions, and what
one `/metrics` scrape costs on its event loop there, next to an empty store's.

The store is written directly with the real record encoder (a session created
plus a user message each, no fsync: this is about memory, not the disk), then
a fresh process opens it with `open_session_store` (full recovery) and reports
its RSS, next to an empty store's in the same run.

    python -m bench memory [--quick] [--sessions 100000]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from sessionlog_store.eventstore.events import MessageCreated, SessionCreated
from sessionlog_store.eventstore.record import encode_record

from .report import save, table, verdict

PROBE = r"""
import collections, gc, statistics, sys, time, trio
from types import SimpleNamespace
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store
from sessionlog_store.server.edge.metrics import ServerMetrics
from sessionlog_store.server.gc_policy import tune_gc
async def main():
    t = time.perf_counter()
    async with open_session_store(sys.argv[1], config=StoreConfig(checkpoint_interval=3600)) as store:
        secs = time.perf_counter() - t
        tune_gc()
        rss = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
        # a scrape as the server's /metrics makes it (no connections here)
        server = SimpleNamespace(store=store, connections=[], dropped=0, live_reads=0,
                                 quotas=SimpleNamespace(refused=collections.Counter()))
        m = ServerMetrics(server)
        times = []
        for _ in range(30):
            t = time.perf_counter()
            m.render()
            times.append(time.perf_counter() - t)
        print(len(store.registry), f"{rss:.1f}", f"{secs:.2f}", f"{statistics.median(times) * 1000:.3f}", flush=True)
trio.run(main)
"""


def build(root: str, n: int) -> None:
    now = time.time()
    base = os.path.join(root, "sessions")
    os.makedirs(base, exist_ok=True)
    for i in range(n):
        sid = f"s{i:07d}"
        os.mkdir(os.path.join(base, sid))
        data = (encode_record(1, now, SessionCreated(session_id=sid, agent_id="coder", source="web",
                                                     title=f"Session number {i}", created_at=now))
                + encode_record(2, now, MessageCreated(msg_id=f"m{i}", content=f"hello, this is message {i} " * 3)))
        with open(os.path.join(base, sid, "log.jsonl"), "wb") as f:
            f.write(data)


def probe(root: str) -> tuple[int, float, float, float]:
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", PROBE, root], capture_output=True, text=True, env=env, check=True)
    n, rss, secs, scrape = out.stdout.split()
    return int(n), float(rss), float(secs), float(scrape)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench memory")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int, default=None)
    a = ap.parse_args(argv)
    n = a.sessions or (20_000 if a.quick else 100_000)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        empty = probe(os.path.join(d, "empty"))
        root = os.path.join(d, "big")
        t = time.perf_counter()
        build(root, n)
        built = time.perf_counter() - t
        full = probe(root)      # no checkpoint yet: full replay
        again = probe(root)     # with the checkpoint the first open wrote
    rows = [{"store": "empty", "sessions": empty[0], "RSS MB": empty[1], "open s": empty[2],
             "scrape ms": empty[3]},
            {"store": f"{n} sessions, first open (full replay)", "sessions": full[0], "RSS MB": full[1],
             "open s": full[2], "scrape ms": full[3]},
            {"store": f"{n} sessions, with checkpoint", "sessions": again[0], "RSS MB": again[1], "open s": again[2],
             "scrape ms": again[3]}]
    print(f"(store written in {built:.1f} s)")
    print(table("server RSS holding the registry", rows))
    per = (again[1] - empty[1]) * 1024 / max(1, n)
    print(f"  about {per:.2f} KB per session")
    target_n = 100_000
    print(verdict(f"RSS with {target_n} sessions (MB, extrapolated when fewer were built)",
                  empty[1] + per * target_n / 1024, 150.0, higher_is_better=False))
    print(verdict(f"a /metrics scrape with {n} sessions, as a multiple of an empty store's (median of 30)",
                  again[3] / max(empty[3], 1e-6), 2.0, higher_is_better=False))
    print("saved", save("memory", {"rows": rows, "kb_per_session": per}))
    return 0
