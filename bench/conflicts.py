"""Two JetStream workers appending to the same sessions at once (a rename on
one while the other streams the reply): what a conflict's rebase costs the
refused worker's *other* sessions. Worker a streams appends to 50 sessions
of its own (each `append_many` timed, 20 a second each) on a real 3-node R3
cluster (tests/nats_cluster.py); then b appends to `--sessions` shared
sessions of `--messages` messages each, and a appends to them before its
tail has brought b's (held back: a tail that lags), so that the fence
refuses a on each and a reads those sessions again (its rebases).

    python -m bench conflicts [--quick] [--sessions 5] [--messages 1000] [--runs 3]

Baseline, same run: a's other sessions' append latency in the second
before the conflicts. The figure: their longest append while the
conflicts were rebased, and how long the refused writer took to make its
conflicted records durable.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from .report import median, save, table
from .scaleout import _cluster

OTHERS = 50


async def one_run(cluster: Any, stream: str, shared: int, messages: int) -> dict[str, Any]:
    from sessionlog_store.eventstore.events import MessageProgress, SessionCreated, SessionRenamed
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    kw = {"stream": stream, "prefix": stream.lower(), "timeout": 5}
    async with open_jetstream_log(cluster.urls, **kw) as a, open_jetstream_log(cluster.urls, **kw) as b:
        longs = [f"long{i}" for i in range(shared)]
        others = [f"other{i}" for i in range(OTHERS)]
        for sid in longs + others:
            await a.create(sid, [SessionCreated(session_id=sid, title="t")])
        for _ in range(messages):  # each shared session: `messages` messages of 4 records of 200 characters
            for sid in longs:
                for _ in range(4):
                    a.append_nowait(sid, MessageProgress(msg_id="m", content_delta="x" * 200))
            await a.flush()
        with trio.fail_after(60):
            while not all(sid in b for sid in longs):
                await trio.sleep(0.01)
        took: list[tuple[float, float]] = []  # (when an append began, how long it took)
        stop = trio.Event()

        async def other(sid: str) -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                await a.append_many(sid, [SessionRenamed(title="x")])
                took.append((t0, time.perf_counter() - t0))
                await trio.sleep(0.05)
        async with trio.open_nursery() as nursery:
            for sid in others:
                nursery.start_soon(other, sid)
            await trio.sleep(1.0)
            # a's tail lags on the shared sessions (held back until the end):
            # b's appends are durable before a appends on a fence it has not
            # moved, so that a is the refused one and rebases them all.
            held: list[tuple[str, bytes, int, bool]] = []
            tailed = a._tailed
            a._tailed = lambda subject, data, seq, own: (  # type: ignore[method-assign]
                held.append((subject, data, seq, own)) if subject.rpartition(".")[2] in longs
                else tailed(subject, data, seq, own))
            for sid in longs:
                await b.append_many(sid, [SessionRenamed(title="b")])
            before = a.conflicts
            t_conflict = time.perf_counter()
            for sid in longs:
                a.append_nowait(sid, MessageProgress(msg_id="m", content_delta="y"))
            await a.flush()
            settled = time.perf_counter() - t_conflict
            a._tailed = tailed  # type: ignore[method-assign]
            for message in held:
                tailed(*message)
            await trio.sleep(0.5)
            stop.set()
    quiet = [d for t, d in took if t < t_conflict]
    during = [d for t, d in took if t_conflict - 0.1 <= t <= t_conflict + settled]
    return {"shared sessions": shared, "messages each": messages, "rebased by a": a.conflicts - before,
            "conflicted durable ms": settled * 1e3,
            "others' append max, before ms": max(quiet) * 1e3,
            "others' append max, during ms": max(during, default=0.0) * 1e3}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench conflicts")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sessions", type=int, default=5)
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--runs", type=int, default=None)
    a = ap.parse_args(argv)
    messages = a.messages or (200 if a.quick else 1000)
    runs = a.runs or (1 if a.quick else 3)
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cluster = _cluster(Path(d) / "cluster")
        try:
            for i in range(runs):
                row = trio.run(one_run, cluster, f"CONFLICTS{i}", a.sessions, messages)
                print(f"  run {i + 1}: {row}", flush=True)
                rows.append(row)
        finally:
            cluster.stop()
    keys = [k for k in rows[0] if k.endswith("ms")]
    summary = {**{k: rows[0][k] for k in ("shared sessions", "messages each")},
               **{k: median([r[k] for r in rows]) for k in keys}}
    print(table(f"a conflict's rebase and the refused worker's other sessions (median of {runs} run(s))", [summary]))
    during, quiet = summary["others' append max, during ms"], summary["others' append max, before ms"]
    print(f"  others' longest append while the conflicts were rebased / before them: {during / max(1e-9, quiet):.2f}x")
    print("saved", save("conflicts", {"rows": rows, "summary": summary}))
    return 0
