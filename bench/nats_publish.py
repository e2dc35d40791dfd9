"""What one message costs on the scale-out path, measured apart from the
store (issue 29 item 4): rounds of N messages, one per subject as a
worker's committer sends them (a message id, the fence header, the writer
header), to a real 3-node R3 cluster (`sync_interval: always`,
tests/nats_cluster.py), published

  one by one    one answer a message (`Publisher.publish_all`)
  batched       JetStream atomic batches of up to 1,000, one answer a batch
                (`Publisher.publish_batched`, what a worker does now)

each without and with the worker's tail (nats-py's ordered consumer on
the stream, receiving every message back as a worker's tail does). For
each: the client's CPU a message (this process: the publisher and, with
the tail, the consumer), the three servers' CPU a message (from
/proc/<pid>/stat), and how long a round takes to be acknowledged (and,
with the tail, delivered back). Medians over the rounds after the first.

    python -m bench nats_publish [--quick] [--messages 5000] [--rounds 7]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .report import median, save, table


def _server_cpu(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def _measure(urls: list[str], pids: list[int], n: int, rounds: int) -> list[dict[str, Any]]:
    import nats
    from nats.js.api import DeliverPolicy

    from sessionlog_store.eventstore.jetstream.natsio import WRITER_HEADER, Publisher, until_led
    from sessionlog_store.eventstore.jetstream.tail import stream_seq

    nc = await nats.connect(servers=urls)
    rows = []
    try:
        for k, (how, tail) in enumerate((("one by one", False), ("batched", False),
                                         ("one by one", True), ("batched", True))):
            stream = f"NP{k}"
            await until_led(nc.jetstream(timeout=5), stream, lambda: nc.jetstream(timeout=5).add_stream(
                name=stream, subjects=[f"{stream}.>"], num_replicas=3, duplicate_window=120.0, allow_atomic=True))
            got = [0]

            async def on_message(msg: Any) -> None:  # (what Tail's callback reads of each)
                got[0] += 1
                _ = (msg.headers or {}).get(WRITER_HEADER) == "w", stream_seq(msg)
            js = nc.jetstream(timeout=30)
            sub = (await js.subscribe(f"{stream}.>", stream=stream, cb=on_message, ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.NEW) if tail else None)
            pub = Publisher(nc, 30.0)
            fence = [0] * n
            client, servers, walls = [], [], []
            for r in range(rounds):
                messages = [(f"{stream}.s.{i}", b"x" * 300, {
                    "Nats-Msg-Id": f"s{i}:1:{r}", "Nats-Expected-Last-Subject-Sequence": str(fence[i]),
                    WRITER_HEADER: "w"}) for i in range(n)]
                got[0] = 0
                c0, s0, w0 = time.process_time(), _server_cpu(pids), time.perf_counter()
                acks = await (pub.publish_batched(messages) if how == "batched" else pub.publish_all(messages))
                while tail and got[0] < n:
                    await asyncio.sleep(0.001)
                walls.append(time.perf_counter() - w0)
                client.append(time.process_time() - c0)
                servers.append(_server_cpu(pids) - s0)
                for i, ack in enumerate(acks):
                    if isinstance(ack, BaseException):
                        raise ack
                    fence[i] = ack.seq
            if sub is not None:
                await sub.unsubscribe()
            rows.append({"publish": how, "tail": "yes" if tail else "no", "messages a round": n,
                         "client us/msg": median(client[1:]) / n * 1e6,
                         "servers us/msg": median(servers[1:]) / n * 1e6,
                         "round ms": median(walls[1:]) * 1e3})
    finally:
        await nc.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench nats_publish")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args(argv)
    n = a.messages or (1000 if a.quick else 5000)
    rounds = a.rounds or (3 if a.quick else 7)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.nats_cluster import NatsCluster
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        with NatsCluster(Path(d)) as cluster:
            pids = [p.pid for p in cluster.procs if p is not None]
            rows = asyncio.run(_measure(cluster.urls, pids, n, rounds))
    print(table(f"{n} messages a round to {n} subjects, a 3-node R3 cluster (sync always), median of "
                f"{rounds - 1} rounds", rows))
    for tail in ("no", "yes"):
        one, batched = (next(r for r in rows if r["publish"] == how and r["tail"] == tail)
                        for how in ("one by one", "batched"))
        print(f"  tail {tail}: atomic batches / one by one: client CPU {batched['client us/msg'] / one['client us/msg']:.2f}x, "
              f"servers' {batched['servers us/msg'] / one['servers us/msg']:.2f}x, "
              f"round {batched['round ms'] / one['round ms']:.2f}x")
    print(f"saved {save('nats_publish', {'rows': rows})}")
    return 0
