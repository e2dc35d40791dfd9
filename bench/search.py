"""python -m bench search [--quick] [--messages 100000] [--queries 1000]: the
full-text search projection (issue 30 item 7): SQLite FTS5 from the
standard library, as server/local/search.py keeps it.

1. Index: finished messages (60-400 words each, drawn Zipf-like from a
   5,000-word vocabulary, 100 owners) written as the index's writer does, in
   batches (one transaction each), through the same SearchDB; CPU per
   message and the file's size.
2. Query: words drawn from the same vocabulary (one to three, the last a
   prefix, as a person types), through SearchIndex.search (the thread hop
   included), scoped to one owner, and unscoped (an admin's): p50, p99.
3. Cost per append beside the throttle path's: what the search fold adds
   to each progress record (it keeps a running reply's text, indexes
   nothing) next to the store's own fold of the same records (the
   registry's and the session state's), in the same run; and what one
   finished message costs to index next to that.

Decision recorded in bench/README.md: progress records are not indexed until
the message is final."""
from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from typing import Any

import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, MessageProgress, SessionCreated
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.registry import Registry
from sessionlog_store.projections.search import Put, SearchFold
from sessionlog_store.projections.session import SessionState
from sessionlog_store.server.local.search import SearchDB, SearchIndex

from .report import pct, save, table, verdict


def vocabulary(n: int, rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(letters) for _ in range(rng.randint(3, 10))))
    return sorted(words)


def zipf_pick(words: list[str], rng: random.Random) -> str:
    # rank ~ 1/x: a few words are everywhere, most are rare
    return words[min(len(words) - 1, int(len(words) ** rng.random()) - 1)]


def message(words: list[str], rng: random.Random) -> str:
    return " ".join(zipf_pick(words, rng) for _ in range(rng.randint(60, 400))) + "."


def build(path: str, n: int, words: list[str], rng: random.Random, batch: int = 200) -> dict[str, Any]:
    db = SearchDB(path)
    cpu = 0.0
    wall0 = time.perf_counter()
    for start in range(0, n, batch):
        ops = []
        for i in range(start, min(n, start + batch)):
            sid = f"s{i // 20:06d}"  # 20 messages a session
            ops.append(("put", (Put(sid, f"m{i:07d}", "assistant" if i % 2 else "user", "llm_reply" if i % 2 else "chat",
                                    float(i), message(words, rng)), f"owner{(i // 20) % 100}")))
        t0 = time.process_time()
        db.write(ops, {})
        cpu += time.process_time() - t0
    wall = time.perf_counter() - wall0
    db.close()
    return {"messages": n, "cpu_us_per_message": cpu / n * 1e6, "wall_s": wall,
            "file_mb": sum(os.path.getsize(path + s) for s in ("", "-wal") if os.path.exists(path + s)) / 2**20}


def queries(root: str, words: list[str], rng: random.Random, n: int) -> list[dict[str, Any]]:
    async def unused(*_: Any) -> Any:  # (queries only: nothing is read or written here)
        raise AssertionError("not called by a query")
    idx = SearchIndex(root, owner_of=lambda sid: "", at_start={}, content_of=lambda sid, mid: None,
                      read_state=unused, durable=unused)
    idx.catching_up = False
    rows: list[dict[str, Any]] = []

    async def run() -> None:
        for scope, owner in (("one owner (1% of the messages)", "owner7"), ("everyone (an admin)", None)):
            lat: list[float] = []
            hits = 0
            for _ in range(n):
                k = rng.randint(1, 3)
                q = " ".join(zipf_pick(words, rng) for _ in range(k))
                q = q[:-max(0, min(3, len(q.split()[-1]) - 3))] if rng.random() < 0.5 else q  # typing: a prefix
                t0 = time.perf_counter()
                got = await idx.search(q, owner=owner, limit=20)
                lat.append((time.perf_counter() - t0) * 1000)
                hits += len(got["hits"])
            rows.append({"scope": scope, "queries": n, "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99),
                         "max_ms": max(lat), "hits_per_query": hits / n})
    trio.run(run)
    idx.close()
    return rows


def fold_cost(n: int) -> dict[str, Any]:
    """Per progress record: the search fold vs the store's fold (registry + session state)."""
    sid = "bench"
    created = [Record(1, 1.0, SessionCreated(session_id=sid, title="x")),
               Record(2, 2.0, MessageCreated(msg_id="u", content="hello")),
               Record(3, 3.0, MessageCreated(msg_id="r", role="assistant", kind="llm_reply", status="running",
                                             parent_id="u"))]
    progress = []
    text = 0
    for i in range(n):
        delta = "word " * 8
        progress.append(Record(4 + i, 4.0 + i, MessageProgress(msg_id="r", content_delta=delta, offset=text)))
        text += len(delta)
    end = Record(4 + n, 4.0 + n, MessageFinalized(msg_id="r"))

    reg, state = Registry(), SessionState()
    for r in created:
        reg.apply(sid, r, 0)
        state.apply(r, 0)
    t0 = time.process_time()
    for r in progress:
        reg.apply(sid, r, 0)
        state.apply(r, 0)
    store_us = (time.process_time() - t0) / n * 1e6

    fold = SearchFold(lambda s, mid: (m.content if (m := state.messages.get(mid)) is not None else None))
    for r in created:
        fold.apply(sid, r)
    t0 = time.process_time()
    for r in progress:
        fold.apply(sid, r)
    search_us = (time.process_time() - t0) / n * 1e6
    state.apply(end, 0)  # (the store's listener folds a record before the search index sees it)
    t0 = time.process_time()
    ops = fold.apply(sid, end)
    final_us = (time.process_time() - t0) * 1e6
    assert ops and len(ops[0].text) == text  # type: ignore[union-attr]
    return {"records": n, "store_fold_us": store_us, "search_fold_us": search_us,
            "ratio": search_us / store_us if store_us else 0.0, "finalize_fold_us": final_us}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench search")
    ap.add_argument("--quick", action="store_true", help="10,000 messages, 200 queries")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--queries", type=int, default=None)
    a = ap.parse_args(argv)
    n = a.messages or (10_000 if a.quick else 100_000)
    nq = a.queries or (200 if a.quick else 1000)
    rng = random.Random(30)
    words = vocabulary(5000, rng)
    root = tempfile.mkdtemp(prefix="bench-search-", dir=os.environ.get("BENCH_DIR"))
    built = build(os.path.join(root, "search.sqlite"), n, words, rng)
    print(table("Indexing finished messages (batches of 200, one transaction each)", [built]))
    q = queries(root, words, rng, nq)
    print(table(f"Queries over {n:,} messages (1-3 words, half of the last ones cut to a prefix; limit 20)", q))
    f = fold_cost(20_000)
    print(table("Per progress record: the search fold beside the store's own fold (same records, same run)", [f]))
    print(f"  indexing one finished message: {built['cpu_us_per_message']:.0f} us (once per message, in the writer's "
          f"thread), vs {f['store_fold_us']:.1f} us the store's fold spends on each of its progress records")
    print(verdict("query p99, one owner, ms", q[0]["p99_ms"], 20, higher_is_better=False))
    print(verdict("query p99, everyone, ms", q[1]["p99_ms"], 20, higher_is_better=False))
    print("  saved", save("search", {"index": built, "queries": q, "fold": f}))
    return 0
