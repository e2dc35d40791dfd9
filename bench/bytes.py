"""Bytes written for one 20 KB reply streamed at 250 ms: the log (placeholder,
progress records, finalize) next to the spec's snapshot design, which rewrites
the growing message every interval.

    python -m bench bytes [--quick] [--seconds 20]
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import trio

from sessionlog_store.server.config import StoreConfig

from sessionlog_store.server.stores import open_session_store

from .report import save, table, verdict

REPLY = 20 * 1024


async def stream(root: str, seconds: float) -> tuple[int, int]:
    config = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600)
    async with open_session_store(root, config=config) as store:
        meta, _ = await store.create_session(first_message="write 20 KB")
        path = os.path.join(root, "sessions", meta.id, "log.jsonl")
        before = os.path.getsize(path)
        text = ("lorem ipsum dolor sit amet " * 1000)[:REPLY]
        ticks = int(seconds / 0.25)
        per = len(text) // ticks + 1
        async with store.inflight(meta.id) as msg:
            for i in range(0, len(text), per):
                msg.write(text[i:i + per])
                msg.add_tokens(output=per // 4)
                await trio.sleep(0.25)
        await store.es.flush()
        after = os.path.getsize(path)
    return after - before, ticks


def snapshot_design_bytes(ticks: int) -> int:
    """What rewriting the whole message JSON each interval writes."""
    total = 0
    for k in range(1, ticks + 1):
        content = "x" * (REPLY * k // ticks)
        total += len(json.dumps({"id": "m", "status": "running", "content": content, "started_at": 0.0,
                                 "last_update_at": 0.0, "metadata": {"partial_tokens_used": {"input": 0,
                                                                                             "output": k}}}))
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench bytes")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None, help="how long the reply streams")
    a = ap.parse_args(argv)
    seconds = a.seconds or (10.0 if a.quick else 20.0)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        ours, ticks = trio.run(stream, os.path.join(d, "s"), seconds)
    snap = snapshot_design_bytes(ticks)
    rows = [{"design": "sessionlog log records", "bytes": ours, "x content": ours / REPLY},
            {"design": "snapshot rewrite per interval (spec)", "bytes": snap, "x content": snap / REPLY}]
    print(table(f"one {REPLY // 1024} KB reply streamed over {seconds:.0f} s ({ticks} intervals of 250 ms)", rows))
    print(verdict("bytes written / content", ours / REPLY, 1.5, higher_is_better=False))
    print("saved", save("bytes", {"rows": rows, "seconds": seconds}))
    return 0
