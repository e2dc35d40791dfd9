"""The JetStream backend next to the local one, in the same run: N streaming
replies through the real in-flight API and throttled saver (bench throttle's
driver), their progress records made durable by the local journal, then by
a real 3-node R3 cluster (`sync_interval: always`, the pinned nats-server
from tests/nats_cluster.py, on loopback on this machine). Then a fault: the
stream's leader killed with SIGKILL in the middle of a run, the longest
append-to-durable wait measured against the Raft election timeout, and every
record the saver was told durable read back from the stream. Last, a
worker's start on the largest run's stream: a full replay, then from the
registry checkpoint the run's stop wrote (and the messages after it).

    python -m bench scaleout [--quick] [--streams 1000,5000] [--seconds 10]

Targets (issue 17): >= 15,000 durable records/s on the stream; the write
stall after the leader's loss <= the election timeout (NATS: 4-9 s, so 9 s);
a start from the checkpoint faster than the full replay of the same stream.
Issue 29 item 4: append->acknowledged p99 <= 250 ms (at 5,000 streams);
each count also runs on a stream made as before atomic batches (the
messages one by one), the baseline of the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from .report import save, table, verdict
from .throttle import run_streams

ELECTION_TIMEOUT = 9.0  # NATS Raft: a new leader within 4-9 s of the old one's loss


def _cluster(folder: Path):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.nats_cluster import NatsCluster
    folder.mkdir(parents=True, exist_ok=True)
    c = NatsCluster(folder)
    c.start()
    return c


def jetstream(cluster: Any, stream: str) -> dict[str, Any]:
    return {"backend": tuple(cluster.urls), "stream": stream, "lease_ttl": 60.0}


def premade_one_by_one(cluster: Any, stream: str) -> None:
    """Make `stream` as a worker did before atomic batches (no allow_atomic):
    a worker then uses it as it is, its messages one by one (the baseline of
    issue 29 item 4, beside the batched rows)."""
    import asyncio

    import nats

    from sessionlog_store.eventstore.jetstream.natsio import DUPLICATE_WINDOW, default_prefix, until_led

    async def make() -> None:
        nc = await nats.connect(servers=list(cluster.urls))
        try:
            js = nc.jetstream(timeout=5)
            await until_led(js, stream, lambda: js.add_stream(name=stream, subjects=[f"{default_prefix(stream)}.>"],
                                                              num_replicas=3, duplicate_window=DUPLICATE_WINDOW))
        finally:
            await nc.close()
    asyncio.run(make())


def leader_killer(cluster: Any, lost: dict[str, Any]):  # type: ignore[no-untyped-def]
    """Kill the stream's leader a third of the way into the run; after the
    run, check that every record told durable is on the stream."""
    async def during(store: Any, seconds: float) -> None:
        es = store.worker.es
        await trio.sleep(seconds / 3)
        info = await es.bridge.run(lambda: es.js.stream_info(es.stream))
        leader = str(info.cluster.leader)
        cluster.kill(int(leader.removeprefix("n")))
        lost["killed"] = leader
        lost["killed at"] = time.monotonic()
        await trio.sleep(seconds * 2 / 3 - 0.5)
        # every session's durable seq is on the stream (read back: a sample of 200)
        missing = 0
        for sid in list(es.session_ids())[:200]:
            durable = es.durable_seq(sid)
            records = await es.read(sid)
            if not records or records[-1].seq < durable:
                missing += 1
        lost["sessions missing records"] = missing
    return during


async def start(cluster: Any, root: str, stream: str, checkpoint: bool) -> dict[str, Any]:
    """A worker's start on `stream`: its replay, from the checkpoint or not."""
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.stores import open_session_store
    config = StoreConfig(**jetstream(cluster, stream), stream_checkpoint_interval=30.0 if checkpoint else 0.0)
    os.makedirs(root, exist_ok=True)
    t0 = time.monotonic()
    async with open_session_store(root, config=config) as store:
        assert store.worker is not None
        opened = time.monotonic() - t0
        es, ckpt = store.worker.es, store.worker.checkpoints.start
        return {"start": "from the checkpoint" if ckpt is not None else "full replay", "sessions": len(store.registry),
                "messages replayed": es.replayed, "replay s": round(es.replay_seconds, 2), "open s": round(opened, 2),
                "checkpoint as of": ckpt.position if ckpt is not None else 0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench scaleout")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--streams", default=None, help="comma-separated stream counts")
    ap.add_argument("--seconds", type=float, default=None)
    a = ap.parse_args(argv)
    counts = [int(x) for x in (a.streams or ("500,1000" if a.quick else "1000,5000")).split(",")]
    seconds = a.seconds or (5.0 if a.quick else 10.0)
    rows: list[dict[str, Any]] = []
    fault: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        cluster = _cluster(Path(d) / "nats")
        try:
            for n in counts:
                premade_one_by_one(cluster, f"B{n}o")
                for name, extra in (("local", None), ("jetstream", jetstream(cluster, f"B{n}")),
                                    ("jetstream, one by one", jetstream(cluster, f"B{n}o"))):
                    root = os.path.join(d, f"{name}-{n}".replace(", ", "-").replace(" ", "-"))
                    os.makedirs(root)
                    r = trio.run(lambda: run_streams(root, n, seconds, False, extra=extra))
                    rows.append({"backend": name, **r})
                    shutil.rmtree(root, ignore_errors=True)
                    print(f"  {name} {n} streams: {r['records/s']:.0f} records/s, p99 {r['durable p99 ms']:.0f} ms",
                          flush=True)
            n = counts[0]
            root = os.path.join(d, "fault")
            os.makedirs(root)
            r = trio.run(lambda: run_streams(root, n, max(seconds, 15.0), False,
                                             extra=jetstream(cluster, "BFAULT"),
                                             during=leader_killer(cluster, fault)))
            rows.append({"backend": f"jetstream, leader {fault.get('killed')} killed", **r})
            starts = [trio.run(start, cluster, os.path.join(d, f"start-{c}"), f"B{counts[-1]}", c)
                      for c in (False, True)]
        finally:
            cluster.stop()
    keep = ("backend", "streams", "offered/s", "records/s", "durable p50 ms", "durable p99 ms", "durable max ms",
            "longest stall ms", "on-time %", "cpu %", "bytes/rec", "kept up")
    shown = [{k: r[k] for k in keep} for r in rows]
    print(table(f"local journal vs a 3-node R3 JetStream cluster (sync always), same run, {seconds}s each", shown))
    js = [r for r in rows if r["backend"] == "jetstream"]
    best = max(js, key=lambda r: r["records/s"])
    print(verdict(f"durable records/s on the stream ({best['streams']} streams)", best["records/s"], 15000.0))
    for r in js:
        print(verdict(f"append->acknowledged p99 ms, {r['streams']} streams, atomic batches (issue 29 item 4; "
                      f"one by one: {next(o['durable p99 ms'] for o in rows if o['backend'] == 'jetstream, one by one' and o['streams'] == r['streams']):,.0f})",
                      r["durable p99 ms"], 250.0, higher_is_better=False))
    stall = max(rows[-1]["durable max ms"], rows[-1]["longest stall ms"]) / 1e3
    print(verdict("write stall after the leader's loss, s", stall, ELECTION_TIMEOUT, higher_is_better=False))
    print(verdict("sessions missing a record told durable (of 200 read back)",
                  float(fault.get("sessions missing records", -1)), 0.0, higher_is_better=False))
    print(table(f"a worker's start on the {counts[-1]}-stream run's stream", starts))
    full, ckpt = starts
    print(verdict("start from the checkpoint, s (target: under the full replay's)", ckpt["open s"], full["open s"],
                  higher_is_better=False))
    print(f"saved {save('scaleout', {'rows': shown, 'starts': starts, 'fault': {k: v for k, v in fault.items() if k != 'killed at'}})}")
    return 0
