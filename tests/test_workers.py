"""Session stores as workers on one JetStream stream (server/scaleout/worker.py),
two or three in one trio process on a real 3-node cluster: a session made
on one is listed, loaded and pushed on the other; a reply streamed by one
is followed and stopped from the other; two workers writing one session
end with one history; a dead worker's reply is aborted exactly once."""
from __future__ import annotations

import os
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, MessageProgress
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store


pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


@asynccontextmanager
async def worker(cluster, tmp_path, name: str, stream: str, **kw: Any):  # type: ignore[no-untyped-def]
    root = str(tmp_path / name)
    os.makedirs(root, exist_ok=True)
    config = StoreConfig(backend=tuple(cluster.urls), stream=stream, subject_prefix=f"w.{stream}", **kw)
    async with open_session_store(root, config=config) as store:
        yield store


async def until(pred, within: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within):
        while not pred():
            await trio.sleep(0.02)


def gate_crossings(store: Any) -> dict[str, Any]:
    """Hold a worker's NATS crossings (its publishes among them) while
    gate["held"]; gate["opened"].set() lets them go: a window widened on
    purpose, the stream never told of what waits."""
    crossing = store.es.bridge.run
    gate: dict[str, Any] = {"held": False, "opened": trio.Event()}

    async def gated(fn):  # type: ignore[no-untyped-def]
        if gate["held"]:
            await gate["opened"].wait()
        return await crossing(fn)
    store.es.bridge.run = gated
    return gate


async def test_a_session_made_on_one_worker_is_everyones(nats_cluster, tmp_path):
    async with worker(nats_cluster, tmp_path, "a", "W1") as a, worker(nats_cluster, tmp_path, "b", "W1") as b:
        pushed: list[tuple[str, dict[str, Any]]] = []
        b.watchers.append(lambda kind, data: pushed.append((kind, data)))
        meta, _ = await a.create_session(title="made on a", first_message="hello")
        await until(lambda: meta.id in b.registry)
        assert [k for k, _ in pushed] == ["session_created"]
        assert pushed[0][1]["session"]["title"] == "made on a"
        assert [m.content for m in await b.get_messages(meta.id)] == ["hello"]
        await b.rename_session(meta.id, "renamed on b")
        await until(lambda: a.get_meta(meta.id).title == "renamed on b")
        rows, total = a.list_sessions()
        assert total == 1 and rows[0]["title"] == "renamed on b"
        await b.delete_session(meta.id)
        await until(lambda: meta.id not in a.registry)
    # a new worker's start: the registry from the stream
    async with worker(nats_cluster, tmp_path, "c", "W1") as c:
        assert len(c.registry) == 0


async def test_a_reply_streamed_on_one_worker_is_followed_and_stopped_from_another(nats_cluster, tmp_path):
    async with worker(nats_cluster, tmp_path, "a", "W2") as a, worker(nats_cluster, tmp_path, "b", "W2") as b:
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        started = trio.Event()
        got: dict[str, Any] = {}

        async def produce() -> None:
            async with a.inflight(sid) as msg:
                got["msg_id"] = msg.msg_id
                started.set()
                for i in range(10_000):
                    msg.write(f"{i} ")
                    await trio.sleep(0.01)
        async with trio.open_nursery() as n:
            n.start_soon(produce)
            await started.wait()
            mid = got["msg_id"]
            await until(lambda: sid in b.registry and mid in b.registry.get(sid).open_msgs)
            assert [(r["session_id"], r["msg_id"]) for r in b.list_running()] == [(sid, mid)], \
                "a reply another worker streams is listed running here too"
            sub = await b.subscribe(sid, mid, offset=0)
            text = ""
            with trio.fail_after(15):
                async for u in sub:
                    text += u.content_delta
                    if len(text) >= 40:
                        break
            assert text.startswith("0 1 2 3 ")
            assert (sid, mid) not in b.saver.active
            assert await b.stop_anywhere(sid, mid)
        # a's producer ended (cancelled by the finalize it got from b), wrote no finalize of its own
        records = await a.es.read(sid)
        fins = [r.event for r in records if isinstance(r.event, MessageFinalized) and r.event.msg_id == mid]
        assert [(f.status, f.aborted_reason) for f in fins] == [("aborted", "stopped by user")]
        assert (sid, mid) not in a.saver.active
        await until(lambda: a.get_meta(sid).open_msgs == () and b.get_meta(sid).open_msgs == ())
        assert await a.worker.leases.keys() == []  # released


async def test_two_workers_writing_one_session_end_with_one_history(nats_cluster, tmp_path):
    async with worker(nats_cluster, tmp_path, "a", "W3") as a, worker(nats_cluster, tmp_path, "b", "W3") as b:
        meta, _ = await a.create_session(first_message="start")
        sid = meta.id
        await until(lambda: sid in b.registry)

        async def write(store, name: str) -> None:  # type: ignore[no-untyped-def]
            for i in range(15):
                await store.append_message(sid, f"{name}{i}")
        async with trio.open_nursery() as n:
            n.start_soon(write, a, "a")
            n.start_soon(write, b, "b")
        await until(lambda: a.get_meta(sid).message_count == b.get_meta(sid).message_count == 31)
        assert a.worker.es.conflicts + b.worker.es.conflicts > 0, "no race: the test proves nothing"
        for store in (a, b):
            store.states.drop(sid)
        ha = [m.content for m in (await a.load_session(sid)).messages.values()]
        hb = [m.content for m in (await b.load_session(sid)).messages.values()]
        assert ha == hb and sorted(ha) == sorted(["start"] + [f"{w}{i}" for w in "ab" for i in range(15)])
        assert a.get_row(sid) == b.get_row(sid)


async def test_a_dead_workers_reply_is_aborted_once_by_a_live_one(nats_cluster, tmp_path):
    """Worker a leaves what a killed worker leaves on the stream (a lease
    never renewed or released, a running reply); b and c sweep."""
    got: dict[str, str] = {}
    swept: dict[str, list[tuple[str, str]]] = {}

    async def doomed() -> None:
        async with worker(nats_cluster, tmp_path, "a", "W4", lease_ttl=1.0) as a:
            meta, _ = await a.create_session(first_message="go")
            got["sid"] = meta.id
            # what a worker streaming a reply leaves on the stream when it is killed:
            # its lease, its placeholder and progress, no finalize
            mid = got["mid"] = "m1"
            head = (await a.load_session(meta.id)).head
            await a.worker.reply_starting(meta.id, mid)
            await a.append_events(meta.id, MessageCreated(msg_id=mid, role="assistant", kind="llm_reply",
                                                          status="running", parent_id=head),
                                  MessageProgress(msg_id=mid, content_delta="partial"))
            a.worker.leases._revisions.clear()  # it "died": its lease is never released
            swept["a"] = a.worker.swept  # (on a slow machine its own sweeper may outlive the lease)
    await doomed()
    sid, mid = got["sid"], got["mid"]
    async with worker(nats_cluster, tmp_path, "b", "W4", lease_ttl=1.0) as b, \
            worker(nats_cluster, tmp_path, "c", "W4", lease_ttl=1.0) as c:
        await until(lambda: b.get_meta(sid).open_msgs == () and c.get_meta(sid).open_msgs == ())
        records = await b.es.read(sid)
        fins = [r.event for r in records if isinstance(r.event, MessageFinalized) and r.event.msg_id == mid]
        assert [(f.status, f.aborted_reason) for f in fins] == [("aborted", "worker restart")]
        # (the sweeper counts it once its append is acknowledged: a moment after the others see it)
        await until(lambda: len(swept["a"] + b.worker.swept + c.worker.swept) > 0)
        await trio.sleep(1.0)  # two more sweeps
        assert sorted(swept["a"] + b.worker.swept + c.worker.swept) == [(sid, mid)], "finalized once"
        [m] = [m for m in (await c.load_session(sid)).messages.values() if m.msg_id == mid]
        assert m.content == "partial" and m.status == "aborted"
