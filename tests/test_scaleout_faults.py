"""Faults under load with two `sessionlog serve --backend nats://…` workers
serving WebSocket clients on a real 3-node cluster: the stream's leader is
killed with SIGKILL while replies stream on both workers, then one worker
is. Nothing any client was told is lost or stored twice, every reply of the
dead worker is aborted "worker restart" exactly once, the live worker's
replies go on (and end as they are told), and what each client followed is
exactly what is durable."""
from __future__ import annotations

import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized
from sessionlog_store.server.edge.client import ServerError, open_client

from .nats_cluster import NatsCluster, _free_ports
from .test_scaleout import TOKEN, Worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[NatsCluster, list[Worker]]]:
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    workers = [Worker(cluster, tmp_path / f"w{i}", port, "FAULTS", "--agent-speed", "8")
               for i, port in enumerate(_free_ports(2))]
    try:
        for w in workers:
            w.start()
        yield cluster, workers
    finally:
        for w in workers:
            w.stop()
        cluster.stop()


async def _until(pred, within: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within):
        while not pred():
            await trio.sleep(0.05)


@pytest.mark.slow
async def test_a_leader_then_a_worker_killed_under_load(setup):
    cluster, (one, two) = setup
    told: list[tuple[str, str]] = []          # (session, user message) acknowledged to a client
    replies: dict[str, tuple[str, Worker]] = {}  # reply -> (session, the worker streaming it)
    async with open_client("127.0.0.1", two.port, TOKEN) as watcher:
        async with open_client("127.0.0.1", one.port, TOKEN) as a, open_client("127.0.0.1", two.port, TOKEN) as b:
            for client, worker in ((a, one), (b, two)):
                for i in range(3):
                    ack = await client.request("chat", content=f"a long story {i}, please")
                    told.append((ack["session_id"], ack["msg_id"]))
                    replies[ack["reply_id"]] = (ack["session_id"], worker)
            for sid in {s for s, _ in replies.values()}:  # a's sessions reach the watcher on two by the tail
                await _until(lambda: sid in {f["data"]["session"]["id"] for f in watcher.pushes
                                             if f["type"] == "session_created"})
                await watcher.follow(sid)
            await _until(lambda: all(len(watcher.content.get((s, r), "")) > 20 for r, (s, _) in replies.items()))
            # the stream's leader dies while six replies stream on two workers
            with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_ports[0]}/jsz?streams=true",
                                        timeout=5) as r:
                jsz = json.loads(r.read())
            leader = next(s["cluster"]["leader"] for a_ in jsz["account_details"] for s in a_["stream_detail"]
                          if s["name"] == "FAULTS")
            cluster.kill(int(leader.removeprefix("n")))
            more = await b.request("chat", content="written while the leader is gone")  # acked after the election
            told.append((more["session_id"], more["msg_id"]))
            replies[more["reply_id"]] = (more["session_id"], two)
            await watcher.follow(more["session_id"])
            await trio.sleep(1.0)
            one.kill()  # and a worker, mid-reply
        with trio.fail_after(60):
            for r, (s, w) in replies.items():
                if w is one:  # aborted by two's sweeper (or ended before the kill)
                    await watcher.wait_done(s, r)
            for r, (s, w) in replies.items():
                if w is two and watcher.status[(s, r)] == "running":
                    # the live worker's go on; stop them rather than wait for their end
                    try:
                        await watcher.request("stop", session_id=s, msg_id=r)
                    except ServerError as e:  # it ended meanwhile (its end not yet told here)
                        assert e.code == "not_running", e.data
                    await watcher.wait_done(s, r)
        assert not watcher.duplicated_or_missing
        # A live worker whose renewals went unanswered for a lease's time to
        # live (the election, on a busy machine) stops its replies and leaves
        # them to a sweeper: counted in its metrics, and only then accepted.
        from .test_ops import get, metrics
        from .test_ws import raw_http
        lapsed = metrics(await raw_http(two.port, get("/metrics", host=f"127.0.0.1:{two.port}")))[
            "sessionlog_leases_lost_total"]
        restarted = 0
        for r, (s, w) in replies.items():
            msgs = (await watcher.request("load_session", session_id=s))["messages"]
            [m] = [m for m in msgs if m["msg_id"] == r]
            assert m["content"] == watcher.content[(s, r)], "followed exactly what is durable"
            end = (m["status"], m["metadata"].get("aborted_reason"))
            assert watcher.status[(s, r)] == m["status"]
            # the dead worker's: aborted "worker restart" unless it ended before the kill;
            # the live worker's: its own end
            assert end in ((("aborted", "worker restart"), ("done", None)) if w is one else
                           (("done", None), ("aborted", "stopped by user"))
                           + ((("aborted", "worker restart"),) if lapsed else ())), (r, end, lapsed)
            restarted += w is one and end == ("aborted", "worker restart")
        assert restarted > 0, "no reply of the dead worker was running when it died: the test proves nothing"
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    async with open_jetstream_log(cluster.urls, stream="FAULTS", prefix="sl.FAULTS", replay=True) as log:
        for sid in {s for s, _ in told}:
            records = await log.read(sid)
            made = Counter(r.event.msg_id for r in records if isinstance(r.event, MessageCreated))
            finals = Counter(r.event.msg_id for r in records if isinstance(r.event, MessageFinalized))
            assert all(n == 1 for n in made.values()), "no message stored twice"
            assert all(n == 1 for n in finals.values()), "every reply finalized exactly once"
            assert [r.seq for r in records] == list(range(1, len(records) + 1))
            for s, mid in told:
                if s == sid:
                    assert made[mid] == 1, "an acknowledged message is on the stream"
