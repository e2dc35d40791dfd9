"""Group commit: durable records/s with 1, 100 and 1000 concurrent appenders
spread over 1000 session files, for each sync mode, next to fsync-per-record
(one write + fdatasync per record, no batching) in the same run.

    python -m bench commit [--quick]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import trio

from sessionlog_store.eventstore import open_event_store
from sessionlog_store.eventstore.events import MessageProgress, SessionCreated
from sessionlog_store.eventstore.record import encode_record

from .report import median, pct, save, table, verdict

FILES = 1000
DELTA = "x" * 120  # a ~240-byte record, like PERF-NOTES' mean line


async def grouped(root: str, appenders: int, seconds: float, mode: str) -> dict[str, float]:
    async with open_event_store(root, sync_mode=mode) as es:  # type: ignore[arg-type]
        ids = [f"s{i}" for i in range(FILES)]
        for sid in ids:
            await es.create(sid, [SessionCreated(session_id=sid)])
        lat: list[float] = []
        done = 0
        deadline = trio.current_time() + seconds

        async def appender(k: int) -> None:
            nonlocal done
            i = 0
            while trio.current_time() < deadline:
                sid = ids[(k + i * appenders) % FILES]
                t0 = time.perf_counter()
                await es.append(sid, MessageProgress(msg_id="m", content_delta=DELTA, offset=i))
                lat.append(time.perf_counter() - t0)
                done += 1
                i += 1
        before = es.statistics()
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for k in range(appenders):
                n.start_soon(appender, k)
        elapsed = time.perf_counter() - t0
        st = es.statistics()
    return {"records_s": done / elapsed, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "records_per_batch": (st.records - before.records) / max(1, st.batches - before.batches)}


async def durability_point(root: str, n: int, mode: str, rounds: int) -> float:
    """Seconds from the committer taking a batch of n records, one per
    session, to the batch being durable (acknowledged): the median of `rounds`."""
    async with open_event_store(root, sync_mode=mode) as es:  # type: ignore[arg-type]
        ids = [f"s{i}" for i in range(n)]
        limiter = trio.CapacityLimiter(64)

        async def make(sid: str) -> None:
            async with limiter:
                await es.create(sid, [SessionCreated(session_id=sid)])
        async with trio.open_nursery() as nursery:
            for sid in ids:
                nursery.start_soon(make, sid)
        out = []
        for r in range(rounds):
            await es.flush()
            if mode == "journal":
                await es.sync_round()  # start each round with synced logs, as the design does each second
            for i, sid in enumerate(ids):
                es.append_nowait(sid, MessageProgress(msg_id="m", content_delta=DELTA, offset=r * 120))
            t0 = time.perf_counter()
            await es.wait_durable(ids[-1], r + 2)
            out.append(time.perf_counter() - t0)
    return median(out)


def fsync_per_record(root: str, seconds: float) -> dict[str, float]:
    os.makedirs(root, exist_ok=True)
    fds = [os.open(os.path.join(root, f"f{i}.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
           for i in range(min(FILES, 256))]
    lat = []
    n = 0
    t_end = time.perf_counter() + seconds
    t0 = time.perf_counter()
    while time.perf_counter() < t_end:
        line = encode_record(n + 1, time.time(), MessageProgress(msg_id="m", content_delta=DELTA, offset=n))
        s = time.perf_counter()
        fd = fds[n % len(fds)]
        os.write(fd, line)
        os.fdatasync(fd)
        lat.append(time.perf_counter() - s)
        n += 1
    elapsed = time.perf_counter() - t0
    for fd in fds:
        os.close(fd)
    return {"records_s": n / elapsed, "p50_ms": pct(lat, 50) * 1e3, "p99_ms": pct(lat, 99) * 1e3,
            "records_per_batch": 1.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench commit")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    a = ap.parse_args(argv)
    runs = a.runs or (1 if a.quick else 3)
    seconds = 1.5 if a.quick else 4.0
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        base = [fsync_per_record(os.path.join(d, "plain"), seconds) for _ in range(runs)]
        baseline = median([b["records_s"] for b in base])
        rows.append({"how": "fsync per record (baseline)", "appenders": 1, "records/s": baseline,
                     "p50 ms": median([b["p50_ms"] for b in base]), "p99 ms": median([b["p99_ms"] for b in base]),
                     "recs/batch": 1.0, "x baseline": 1.0})
        for mode in ("journal", "auto", "syncfs", "fdatasync"):
            for appenders in (1, 100, 1000):
                rs = [trio.run(grouped, os.path.join(d, f"g-{mode}-{appenders}-{r}"), appenders, seconds, mode)
                      for r in range(runs)]
                r = median([x["records_s"] for x in rs])
                rows.append({"how": f"group commit, {mode}", "appenders": appenders, "records/s": r,
                             "p50 ms": median([x["p50_ms"] for x in rs]), "p99 ms": median([x["p99_ms"] for x in rs]),
                             "recs/batch": median([x["records_per_batch"] for x in rs]), "x baseline": r / baseline})
    print(table(f"durable appends over {FILES} session files, median of {runs} run(s), {seconds}s each", rows))
    best = max(r["x baseline"] for r in rows if r["appenders"] == 1000 and "journal" in r["how"])
    print(verdict("group commit (journal) at 1000 appenders vs fsync per record", best, 20.0))
    points = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
        for n in (1000, 10000):
            rounds = 3 if a.quick else 5
            direct = trio.run(durability_point, os.path.join(d, f"p-auto-{n}"), n, "auto", rounds)
            journal = trio.run(durability_point, os.path.join(d, f"p-journal-{n}"), n, "journal", rounds)
            points.append({"records (one per session)": n, "direct (auto: write each log + syncfs) ms": direct * 1e3,
                           "journal (one write + fdatasync) ms": journal * 1e3, "journal / direct": journal / direct})
    print(table(f"one durability point for N records, one per session (median of {rounds})", points))
    print(verdict("journal durability point at 10,000 records / direct design", points[-1]["journal / direct"],
                  1 / 20, higher_is_better=False))
    print("saved", save("commit", {"rows": rows, "points": points, "runs": runs, "seconds": seconds}))
    return 0
