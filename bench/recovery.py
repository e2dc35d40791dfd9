"""Recovery: full replay next to a raw msgspec decode of the same bytes (the
limit), startup with the checkpoint (tail replay only), and loading a very long
session with and without its snapshot.

    python -m bench recovery [--quick] [--sessions 1000] [--records 1000]

The replay and the raw decode are timed in a fresh process, as a start is
one (the harness's own process has just written the store through the
store's write path: its heap then slowed its replay by ~15 %, not its raw
decode; issue 29's third round measured both ways).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import trio

from sessionlog_store.eventstore.events import EVENT_DECODER
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import list_session_ids, log_path
from sessionlog_store.projections.recovery import load_session_state, recover_registry
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.gc_policy import gc_paused
from sessionlog_store.server.stores import open_session_store

from .populate import populate
from .report import median, save, table, verdict


def raw_decode(root: str) -> tuple[int, int, float]:
    """Read every log and msgspec-decode each line into the event union: the limit."""
    t0 = time.perf_counter()
    n = size = 0
    dec = EVENT_DECODER.decode
    for sid in list_session_ids(OS_FILES, root):
        with open(log_path(root, sid), "rb") as f:
            data = f.read()
        size += len(data)
        for line in data.splitlines():
            dec(line)
            n += 1
    return n, size, time.perf_counter() - t0


def timed(root: str, runs: int) -> dict[str, float]:
    """Medians of `runs` alternated runs: raw decode, full replay, start with
    the checkpoint (in this process)."""
    raws, fulls, ckpts = [], [], []
    for _ in range(runs):
        n, size, secs = raw_decode(root)
        raws.append(secs)
        t = time.perf_counter()
        with gc_paused():  # (as a start replays: server/local/startup.py)
            _, _, rep = recover_registry(OS_FILES, root, use_checkpoint=False, repair=False)
        fulls.append(time.perf_counter() - t)
        t = time.perf_counter()
        with gc_paused():
            _, _, rep2 = recover_registry(OS_FILES, root, use_checkpoint=True, repair=False)
        ckpts.append(time.perf_counter() - t)
    return {"n": n, "size": size, "raw_s": median(raws), "full_s": median(fulls), "ckpt_s": median(ckpts),
            "records": rep.records, "bytes": rep.bytes, "ckpt_records": rep2.records, "ckpt_bytes": rep2.bytes,
            "checkpoint": rep2.checkpoint}  # type: ignore[dict-item]


def timed_in_a_fresh_process(root: str, runs: int) -> dict[str, float]:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", "import json, sys; from bench.recovery import timed; "
                          "print(json.dumps(timed(sys.argv[1], int(sys.argv[2]))))", root, str(runs)],
                         capture_output=True, text=True, check=True, cwd=here,
                         env=dict(os.environ, PYTHONPATH=here))
    return json.loads(out.stdout)


async def long_session(root: str, records: int) -> str:
    async with open_session_store(root, config=StoreConfig(checkpoint_interval=3600)) as store:
        meta, _ = await store.create_session(first_message="a very long session")
        async with store.inflight(meta.id) as msg:
            for i in range(records):
                msg.write("token %d " % i)
                store.saver.flush(msg)
                if i % 1000 == 0:
                    await store.es.flush()
        await store.load_session(meta.id)
        await store.write_snapshot(meta.id)
        for i in range(2):  # a tail past the snapshot
            await store.append_message(meta.id, f"tail {i}")
        return meta.id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench recovery")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int, default=None)
    ap.add_argument("--records", type=int, default=None, help="about this many records per session")
    ap.add_argument("--runs", type=int, default=None)
    a = ap.parse_args(argv)
    sessions = a.sessions or (200 if a.quick else 1000)
    per = a.records or (200 if a.quick else 1000)
    runs = a.runs or (1 if a.quick else 3)
    messages = max(2, per // 20 * 2)  # ~20 records per user+reply pair with 16 chunks
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        root = os.path.join(d, "store")
        t0 = time.perf_counter()
        info = trio.run(populate, root, sessions, messages, 0, 16)
        build = time.perf_counter() - t0
        here = timed(root, runs)  # (the harness's process, as measured before issue 29's third round)
        f = timed_in_a_fresh_process(root, runs)
        n, size, raw_s, full_s, ckpt_s = int(f["n"]), int(f["size"]), f["raw_s"], f["full_s"], f["ckpt_s"]
        long_root = os.path.join(d, "long")
        long_n = 5_000 if a.quick else 50_000
        sid = trio.run(long_session, long_root, long_n)
        t = time.perf_counter()
        load_session_state(OS_FILES, long_root, sid, use_snapshot=False)
        long_full = time.perf_counter() - t
        t = time.perf_counter()
        _, used = load_session_state(OS_FILES, long_root, sid, use_snapshot=True)
        long_snap = time.perf_counter() - t
    rows = [
        {"what": "raw msgspec decode (the limit)", "records": n, "MB": size / 2**20, "seconds": raw_s,
         "records/s": n / raw_s, "vs raw": 1.0},
        {"what": "full replay (read, check, decode, fold)", "records": f["records"], "MB": f["bytes"] / 2**20,
         "seconds": full_s, "records/s": f["records"] / full_s, "vs raw": (f["records"] / full_s) / (n / raw_s)},
        {"what": "  the same in the harness's process", "records": here["records"], "MB": here["bytes"] / 2**20,
         "seconds": here["full_s"], "records/s": here["records"] / here["full_s"],
         "vs raw": (here["records"] / here["full_s"]) / (here["n"] / here["raw_s"])},
        {"what": f"startup with checkpoint ({f['checkpoint']})", "records": f["ckpt_records"],
         "MB": f["ckpt_bytes"] / 2**20, "seconds": ckpt_s, "records/s": float("nan"), "vs raw": float("nan")},
        {"what": f"load a {long_n}-record session, full replay", "records": long_n, "MB": float("nan"),
         "seconds": long_full, "records/s": long_n / long_full, "vs raw": float("nan")},
        {"what": "the same with its snapshot + tail", "records": float("nan"), "MB": float("nan"),
         "seconds": long_snap, "records/s": float("nan"), "vs raw": float("nan")},
    ]
    print(f"store: {sessions} sessions, {info['records']} records (built in {build:.1f} s); median of {runs} run(s)")
    print(table("recovery", rows))
    print(verdict("full replay rate / raw decode rate", rows[1]["vs raw"], 0.5))
    print(verdict("checkpoint startup / full replay time", ckpt_s / full_s, 1 / 20, higher_is_better=False))
    print(f"  snapshot served the long session: {used}")
    print("saved", save("recovery", {"rows": rows, "sessions": sessions, "runs": runs}))
    return 0
