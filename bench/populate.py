"""Build a realistic store through the real write path.

    python -m bench.populate --root DIR --sessions N --messages M [--seed S]

Each session gets a first user message, then alternating user messages and
streamed assistant replies (placeholder, progress records through the real
in-flight API and group commit, finalize). About 5 % are archived, about 2 %
are left with a reply `running` and never finalized, as a crash would leave
them (the next start aborts those). Deterministic for a given seed, except ids
and timestamps.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageProgress
from sessionlog_store.eventstore.ids import new_session_id
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore
from sessionlog_store.server.stores import open_session_store

WORDS = ("the store keeps every event durable and replays the log after a crash while the client "
         "streams tokens from an agent that calls tools and writes code for a project with tests "
         "and a page that reloads at any moment without losing a character of the reply").split()


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def populate_session(store: SessionStore, rng: random.Random, messages: int, chunks: int,
                           archived: bool, crashed: bool) -> int:
    meta, _ = await store.create_session(agent_id=rng.choice(["coder", "writer", "default"]),
                                         source=rng.choice(["web", "web", "web", "wechat", "discord"]),
                                         first_message=_text(rng, rng.randint(4, 30)))
    sid = meta.id
    written = 1
    while written < messages:
        if written % 2 == 0:
            await store.append_message(sid, _text(rng, rng.randint(4, 30)))
            written += 1
            continue
        async with store.inflight(sid, kind="llm_reply") as msg:
            for _ in range(chunks):
                msg.write(_text(rng, rng.randint(5, 40)) + " ")
                msg.add_tokens(output=rng.randint(5, 40))
                store.saver.flush(msg)  # one progress record per "interval", without the wait
        written += 1
    if crashed:
        mid = new_session_id()
        await store.es.append(sid, MessageCreated(msg_id=mid, role="assistant", kind="llm_reply",
                                                  status="running", started_at=time.time()))
        offset = 0
        for _ in range(chunks):
            delta = _text(rng, 10) + " "
            store.es.append_nowait(sid, MessageProgress(msg_id=mid, content_delta=delta, offset=offset))
            offset += len(delta)
        await store.es.flush()
    if archived:
        await store.set_archived(sid, True)
    return sid and written


async def populate(root: str, sessions: int, messages: int, seed: int = 0, chunks: int = 8,
                   concurrency: int = 64) -> dict[str, float]:
    rng = random.Random(seed)
    t0 = time.perf_counter()
    plans = [(random.Random(rng.random()), rng.random() < 0.05, rng.random() < 0.02) for _ in range(sessions)]
    limiter = trio.CapacityLimiter(concurrency)
    done = [0]
    config = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600)
    async with open_session_store(root, config=config) as store:
        async def one(plan: tuple[random.Random, bool, bool]) -> None:
            async with limiter:
                await populate_session(store, plan[0], messages, chunks, plan[1], plan[2])
                done[0] += 1
                if sessions >= 100 and done[0] % max(1, sessions // 10) == 0:
                    print(f"  populate: {done[0]}/{sessions} sessions", file=sys.stderr, flush=True)
        async with trio.open_nursery() as nursery:
            for plan in plans:
                nursery.start_soon(one, plan)
        stats = store.es.statistics()
    return {"sessions": sessions, "records": stats.records, "batches": stats.batches,
            "seconds": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.populate", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", required=True)
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--messages", type=int, default=10, help="messages per session (user + assistant)")
    p.add_argument("--chunks", type=int, default=8, help="progress records per streamed reply")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    r = trio.run(populate, a.root, a.sessions, a.messages, a.seed, a.chunks)
    print(f"populated {a.root}: {r['sessions']} sessions, {r['records']} records in {r['batches']} batches, "
          f"{r['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
