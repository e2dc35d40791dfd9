"""The lease bucket of a shared stream after many replies (issue 17's
leases, eventstore/jetstream/leases.py): what a sweep's listing of the
bucket costs once `--replies` leases were taken and released, on a real
3-node R3 cluster (tests/nats_cluster.py).

    python -m bench leases [--quick] [--replies 20000]

Baseline, same run: the same replies released as before, with a KV delete
(a compare-and-set delete marker left a reply, for good). Then a sweep on
that bucket: the markers it purges (1,000 a sweep).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from .report import save, table
from .scaleout import _cluster

BATCH = 500


async def one(cluster: Any, stream: str, replies: int, how: str) -> dict[str, Any]:
    from sessionlog_store.eventstore.jetstream.leases import Leases, bucket_name, lease_key
    from sessionlog_store.eventstore.jetstream.natsio import bucket_entries
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    async with open_jetstream_log(cluster.urls, stream=stream, prefix=stream.lower(), timeout=10) as log:
        leases = await Leases.open(log, ttl=60)
        kv, js, bucket = leases.kv, log.js, bucket_name(stream)
        for i in range(0, replies, BATCH):
            keys = [lease_key(f"s{j}", "m") for j in range(i, min(replies, i + BATCH))]

            async def make_and_release(keys: list[str] = keys) -> None:
                import asyncio
                revs = await asyncio.gather(*[kv.create(k, b"{}") for k in keys])
                if how == "kv.delete":  # (what a release did before)
                    await asyncio.gather(*[kv.delete(k, last=r) for k, r in zip(keys, revs)])
                else:  # (what Leases._drop does)
                    await asyncio.gather(*[js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{k}", seq=r + 1)
                                           for k, r in zip(keys, revs)])
            await log.bridge.run(make_and_release)
        for j in range(10):
            await leases.acquire(f"live{j}", "m")
        info = await log.bridge.run(lambda: js.stream_info(f"KV_{bucket}"))
        t0, c0 = time.perf_counter(), time.process_time()
        live, markers = await log.bridge.run(lambda: bucket_entries(js, bucket))
        listing = (time.perf_counter() - t0, time.process_time() - c0)
        assert len(live) == 10
        t0 = time.perf_counter()
        await leases.sweep()
        swept = time.perf_counter() - t0
        after = await log.bridge.run(lambda: js.stream_info(f"KV_{bucket}"))
        return {"released by": how, "replies": replies, "bucket messages": int(info.state.messages),
                "listing s": listing[0], "listing CPU ms": listing[1] * 1e3,
                "a sweep s": swept, "bucket messages after it": int(after.state.messages)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench leases")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--replies", type=int, default=None)
    a = ap.parse_args(argv)
    replies = a.replies or (2000 if a.quick else 20000)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cluster = _cluster(Path(d) / "cluster")
        try:
            for i, how in enumerate(("kv.delete", "purge up to its revision")):
                rows.append(trio.run(one, cluster, f"LEASEBENCH{i}", replies, how))
        finally:
            cluster.stop()
    print(table(f"the lease bucket after {replies:,} replies: a sweep's listing", rows))
    print(f"  listing CPU, now / kv.delete: {rows[1]['listing CPU ms'] / max(1e-9, rows[0]['listing CPU ms']):.3f}x")
    print("saved", save("leases", {"rows": rows}))
    return 0
