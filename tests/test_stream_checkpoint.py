"""The registry checkpoint on a shared stream (issue 17, item 2): a worker's
fold of every message in stream order, written to the stream's object
bucket, lets the next worker's start replay only what came after it, and
that start ends with the registry a full replay gives, on a real 3-node
cluster: sessions renamed, deleted (and purged), made again under a deleted
id and made after the checkpoint; a reply running across it; an unusable
checkpoint falls back to the full replay."""
from __future__ import annotations

import logging
from typing import Any

import msgspec
import pytest
import trio

from sessionlog_store.server.scaleout.worker import CHECKPOINT_NAME, snapshot_name
from sessionlog_store.server.domain.store import SessionStore

from . import test_workers
from .test_workers import until

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def worker(cluster, tmp_path, name: str, stream: str, **kw: Any):  # type: ignore[no-untyped-def]
    kw.setdefault("stream_checkpoint_interval", 3600.0)  # written when the test says
    return test_workers.worker(cluster, tmp_path, name, stream, **kw)


def view(store: SessionStore) -> tuple[Any, Any, Any]:
    """What a client sees of the stream through this worker: every row,
    every running reply, each session's seq and fence."""
    rows = {sid: msgspec.to_builtins(m) for sid, m in store.registry.rows.items()}
    running = sorted((r["session_id"], r["msg_id"], r["length"]) for r in store.list_running())
    es = store.es
    positions = {sid: (es.last_seq(sid), es.durable_end(sid), es.stream_seq(sid))  # type: ignore[attr-defined]
                 for sid in es.session_ids()}
    return rows, running, positions


async def test_a_start_from_the_checkpoint_ends_where_a_full_replay_does(nats_cluster, tmp_path):
    stream = "CK1"
    async with worker(nats_cluster, tmp_path, "a", stream) as a:
        sids = [(await a.create_session(first_message=f"hello {i}"))[0].id for i in range(12)]
        for sid in sids[:4]:
            await a.rename_session(sid, f"renamed {sid}")
        await a.delete_session(sids[4])
        reply_done = trio.Event()
        proceed = trio.Event()
        written = [trio.Event(), trio.Event()]  # each producer's text is in the log, and it writes no more for now

        async def produce() -> None:
            async with a.inflight(sids[5]) as msg:
                for i in range(40):
                    msg.write(f"{i} ")
                    await trio.sleep(0.005)
                a.saver.flush(msg)  # (its last text now, not at the saver's next tick: the checkpoint below has it)
                written[0].set()
                await proceed.wait()
                msg.write("end")
            reply_done.set()
        async def doomed() -> None:  # running in the id made again: its deletion ends it
            async with a.inflight(sids[2]) as msg:
                msg.write("cut short")
                a.saver.flush(msg)
                written[1].set()
                await trio.sleep_forever()
        async with trio.open_nursery() as n:
            n.start_soon(produce)
            n.start_soon(doomed)
            for w in written:  # (nothing is written between the two checkpoints below)
                await w.wait()
            await a.es.flush()
            fold = a.worker.checkpoints.fold
            await until(lambda: fold.position >= a.es.written_position)
            assert await a.worker.write_checkpoint()
            position = fold.position
            assert not await a.worker.write_checkpoint(), "written again with nothing new"
            # after the checkpoint: renamed, deleted (purged), an id made again, a new one, the reply ends
            await a.rename_session(sids[0], "after the checkpoint")
            await a.delete_session(sids[1])
            await a.delete_session(sids[2])
            await a.create_session(sids[2], first_message="the same id, made again")
            fresh = (await a.create_session(first_message="new"))[0].id
            await a.append_message(sids[6], "one more")
            proceed.set()
            await reply_done.wait()
        await a.es.flush()
        # (b and c start while a runs: a's stop would write a newer checkpoint)

        async with worker(nats_cluster, tmp_path, "b", stream) as b, \
                worker(nats_cluster, tmp_path, "c", stream, stream_checkpoint_interval=0) as c:
            start = b.worker.checkpoints.start
            # (sids[4], deleted before: its tombstone purged before a's tail brought it, or not, it is
            # not in the checkpoint: the writer prunes the fold with the stream's subjects)
            assert start is not None and start.pruned == 1, "the session deleted after the checkpoint is dropped"
            assert sids[4] not in b.worker.checkpoints.fold.registry
            assert start.position == position
            assert b.es.replayed < c.es.replayed, (b.es.replayed, c.es.replayed)
            assert c.worker.checkpoints.start is None
            assert view(b) == view(c)
            assert sids[1] not in b.registry and sids[4] not in b.registry and fresh in b.registry
            assert [m.content for m in await b.get_messages(sids[2])] == ["the same id, made again"]
            assert b.get_meta(sids[0]).title == "after the checkpoint"
            # the fence came from the checkpoint: an append there is not a conflict
            await b.append_message(sids[7], "from b")
            await b.rename_session(sids[8], "b renamed it")
            assert b.es.conflicts == 0
            await until(lambda: c.get_meta(sids[8]).title == "b renamed it")
            assert [m.content for m in await c.get_messages(sids[7])] == ["hello 7", "from b"]


async def test_the_stop_writes_the_checkpoint_and_the_next_start_takes_it(nats_cluster, tmp_path):
    stream = "CK2"
    async with worker(nats_cluster, tmp_path, "a", stream) as a:
        for i in range(5):
            await a.create_session(first_message=f"m{i}")
        written = a.es.written_position
    async with worker(nats_cluster, tmp_path, "b", stream) as b:
        start = b.worker.checkpoints.start
        assert start is not None and start.position >= written and start.sessions == 5
        assert b.es.replayed == 0, "nothing after the checkpoint to replay"
        meta, _ = await b.create_session(first_message="after")
        # b's own messages reach its fold (the tail brings them), so its checkpoint has them
        await until(lambda: b.worker.checkpoints.fold.position >= b.es.written_position)
        assert meta.id in b.worker.checkpoints.fold.registry
    async with worker(nats_cluster, tmp_path, "c", stream) as c, \
            worker(nats_cluster, tmp_path, "d", stream, stream_checkpoint_interval=0) as d:
        assert c.worker.checkpoints.start.sessions == 6
        assert view(c) == view(d)


async def test_an_unusable_checkpoint_is_a_full_replay(nats_cluster, tmp_path, caplog):
    stream = "CK3"
    async with worker(nats_cluster, tmp_path, "a", stream) as a:
        for i in range(3):
            await a.create_session(first_message=f"m{i}")
        await a.worker.checkpoints.objects.put(CHECKPOINT_NAME, b"{not a checkpoint", 10**9)
    caplog.set_level(logging.WARNING, "sessionlog.worker")
    async with worker(nats_cluster, tmp_path, "b", stream) as b, \
            worker(nats_cluster, tmp_path, "c", stream, stream_checkpoint_interval=0) as c:
        assert b.worker.checkpoints.start is None
        assert "unusable" in caplog.text and "replaying the whole stream" in caplog.text
        assert view(b) == view(c) and len(b.registry) == 3
        # the stored one claims a later position, but was unusable: b's replaces it
        assert await b.worker.write_checkpoint()
    async with worker(nats_cluster, tmp_path, "d", stream) as d:
        assert d.worker.checkpoints.start is not None and d.worker.checkpoints.start.sessions == 3


def state_view(state: Any) -> Any:
    return msgspec.to_builtins({"seq": state.seq, "end": state.end, "meta": state.meta, "head": state.head,
                                "messages": list(state.messages.values()), "children": state.children,
                                "active": state.active})


async def test_a_long_session_loads_from_its_snapshot_of_its_own_incarnation(nats_cluster, tmp_path):
    stream = "CK4"
    async with worker(nats_cluster, tmp_path, "a", stream) as a:
        sid = (await a.create_session(first_message="write a lot"))[0].id
        objects = a.worker.checkpoints.objects
        async with a.inflight(sid) as msg:
            for i in range(800):
                msg.write(f"{i:05d} " * 20)  # 96 KiB in all
        with trio.fail_after(15):
            while (stored := await objects.get(snapshot_name(sid))) is None:
                await trio.sleep(0.05)
        assert 0 < stored[1] <= a.es.stream_seq(sid), "as of a message of the session"
        await a.append_message(sid, "after the snapshot")
        async with worker(nats_cluster, tmp_path, "b", stream) as b, \
                worker(nats_cluster, tmp_path, "c", stream, stream_checkpoint_interval=0) as c:
            got, full = await b.load_session(sid), await c.load_session(sid)
            assert b.worker.snapshot_loads == 1 and c.worker.snapshot_loads == 0
            assert state_view(got) == state_view(full)
            assert [m.content for m in await b.get_messages(sid)][-1] == "after the snapshot"
        # the id deleted and made again: the old snapshot (left behind, as if
        # its deletion had failed) is not the new session's
        await a.delete_session(sid)
        await a.create_session(sid, first_message="x" * (70 * 1024))
        await objects.put(snapshot_name(sid), stored[0], 10**9, replace=True)
        async with worker(nats_cluster, tmp_path, "d", stream) as d:
            state = await d.load_session(sid)
            assert d.worker.snapshot_loads == 0
            assert [m.content[:3] for m in state.messages.values()] == ["xxx"]


def test_the_fold_forgets_only_sessions_purged_before_what_the_stream_listed():
    """Pure: a session with no subject when the stream ended at `upto` is
    gone, unless the fold has a message of it after `upto` (made since)."""
    from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
    from sessionlog_store.eventstore.record import encode_record
    from sessionlog_store.projections.stream_fold import StreamFold, decode_checkpoint

    def take(fold, sid, seq, stream_seq, ev):  # type: ignore[no-untyped-def]
        data = encode_record(seq, 1.0, ev)
        from sessionlog_store.eventstore.record import scan
        fold.take(sid, data, scan(sid, data).records, stream_seq)
    fold = StreamFold("S")
    take(fold, "kept", 1, 1, SessionCreated(session_id="kept"))
    take(fold, "purged", 1, 2, SessionCreated(session_id="purged"))
    take(fold, "late", 1, 3, SessionCreated(session_id="late"))
    take(fold, "kept", 2, 4, SessionRenamed(title="t"))
    assert fold.prune({"kept"}, upto=2) == 1  # "late" came after the listing
    assert sorted(fold.positions) == ["kept", "late"] == sorted(fold.registry.rows)
    ckpt = decode_checkpoint(fold.checkpoint(5.0), "S", "", 4)
    assert ckpt.position == 4 and ckpt.positions["kept"].seq == 2 and ckpt.sessions["kept"].title == "t"
