"""What an adversarial review of the JetStream workers found, each on a real
3-node cluster: another worker's records that a rebase or an adopt read
reached no subscriber and stopped no producer; a stop racing a reply's own
end stored two finalizes; a renewal whose answer was lost killed a live
reply; a start hung when a session was purged during its replay; a record
over the servers' max_payload broke the whole worker; an interrupted
migration could not be finished; a session removed here came back from the
tail."""
from __future__ import annotations

from typing import Any

import pytest
import trio

from sessionlog_store.eventstore.errors import RecordTooLarge
from sessionlog_store.eventstore.events import MessageFinalized, MessageProgress, SessionCreated, SessionRenamed
from sessionlog_store.projections.registry import Registry

from .test_workers import until, worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def finals(records, mid: str) -> list[tuple[str, str | None]]:  # type: ignore[no-untyped-def]
    return [(r.event.status, r.event.aborted_reason) for r in records
            if isinstance(r.event, MessageFinalized) and r.event.msg_id == mid]


async def stopped_from_b(a, b, *, answered: bool) -> None:  # type: ignore[no-untyped-def]
    """a streams a reply; b stops it; a's producer ends, one finalize
    "stopped by user" is stored and nothing of the reply follows it."""
    meta, _ = await a.create_session(first_message="go")
    sid, got, ended = meta.id, {}, trio.Event()
    appended = b.es.statistics().records

    async def produce() -> None:
        try:
            async with a.inflight(sid) as msg:
                got["mid"] = msg.msg_id
                for i in range(600):
                    msg.write(f"{i} ")
                    await trio.sleep(0.01)
                got["ran_to_end"] = True
        finally:
            ended.set()
    async with trio.open_nursery() as n:
        n.start_soon(produce)
        await until(lambda: "mid" in got and sid in b.registry and got["mid"] in b.get_meta(sid).open_msgs)
        await trio.sleep(0.3)
        assert await b.stop_anywhere(sid, got["mid"])
        assert (b.es.statistics().records > appended) == (not answered), "who wrote the finalize"
        with trio.fail_after(10):
            await ended.wait()
    assert not got.get("ran_to_end"), "a's producer was stopped"
    records = await a.es.read(sid)
    assert finals(records, got["mid"]) == [("aborted", "stopped by user")]
    end = [i for i, r in enumerate(records) if isinstance(r.event, MessageFinalized)][0]
    assert not [r for r in records[end:] if getattr(r.event, "msg_id", None) == got["mid"]
                and not isinstance(r.event, MessageFinalized)], "nothing of the reply follows its finalize"


async def test_a_stop_reaches_a_producer_whose_records_are_in_flight(nats_cluster, tmp_path):
    """a's saver has a record of the session in flight nearly always (a 5 ms
    interval): b's stop reaches a by a request, and a's producer writes the
    finalize, nothing after it (b's own finalize, refused by the fence for
    as long as a wrote back to back, could wait seconds: the next test has
    that path)."""
    async with worker(nats_cluster, tmp_path, "a", "RV1", progress_interval=0.005) as a, \
            worker(nats_cluster, tmp_path, "b", "RV1") as b:
        await stopped_from_b(a, b, answered=True)


async def test_a_stop_no_worker_answers_is_written_by_the_asker(nats_cluster, tmp_path):
    """The streaming worker does not answer the stop request (cut off from
    core NATS): the asking worker writes the finalize; the streaming
    worker's producer ends when its tail (or its rebase) brings it, and
    nothing of the reply follows the finalize."""
    async with worker(nats_cluster, tmp_path, "a", "RV11", progress_interval=0.05) as a, \
            worker(nats_cluster, tmp_path, "b", "RV11") as b:
        await a.worker.stops.close()  # a answers no stop request
        await stopped_from_b(a, b, answered=False)


async def test_a_stop_racing_the_replys_own_end_stores_one_finalize(nats_cluster, tmp_path):
    async with worker(nats_cluster, tmp_path, "a", "RV2") as a, worker(nats_cluster, tmp_path, "b", "RV2") as b:
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        for _ in range(4):
            box: dict[str, Any] = {}

            def on_a_record(s, rec, end):  # type: ignore[no-untyped-def]
                if isinstance(rec.event, MessageFinalized) and s == sid and "stop" not in box:
                    box["stop"] = True  # the moment a queues its "done", the user stops it on b
                    a.spawn(b.stop_anywhere, sid, rec.event.msg_id)
            a.es.listeners.append(on_a_record)
            async with a.inflight(sid) as msg:
                mid = msg.msg_id
                msg.write("hello")
                await until(lambda: mid in b.get_meta(sid).open_msgs)
                subs = {"a": await a.subscribe(sid, mid, offset=0), "b": await b.subscribe(sid, mid, offset=0)}
            a.es.listeners.remove(on_a_record)
            last: dict[str, Any] = {}
            for name, sub in subs.items():
                with trio.move_on_after(5):
                    async for u in sub:
                        last[name] = (u.status, u.aborted_reason)
            await trio.sleep(0.3)
            [end] = finals(await a.es.read(sid), mid)  # exactly one
            assert last == {"a": end, "b": end}, "both workers' followers are told the end the stream holds"


async def test_a_follower_sees_another_workers_reply_while_its_own_worker_writes_the_session(
        nats_cluster, tmp_path):
    async with worker(nats_cluster, tmp_path, "a", "RV3") as a, \
            worker(nats_cluster, tmp_path, "b", "RV3", progress_interval=0.02) as b:
        meta, _ = await b.create_session(first_message="go")
        sid, got = meta.id, {}

        async def produce() -> None:
            async with b.inflight(sid) as msg:
                got["mid"] = msg.msg_id
                for i in range(200):
                    msg.write(f"{i} ")
                    await trio.sleep(0.01)

        async def renames() -> None:  # a writes the session too: a's appends conflict with b's
            for i in range(10_000):
                await a.rename_session(sid, f"t{i}")
                await trio.sleep(0.03)
        text, status = "", None
        async with trio.open_nursery() as n:
            n.start_soon(produce)
            await until(lambda: "mid" in got and sid in a.registry and got["mid"] in a.get_meta(sid).open_msgs)
            sub = await a.subscribe(sid, got["mid"], offset=0)
            n.start_soon(renames)
            with trio.fail_after(30):
                async for u in sub:
                    text += u.content_delta
                    if u.status != "running":
                        status = u.status
                        break
            n.cancel_scope.cancel()
        assert a.worker.es.conflicts + b.worker.es.conflicts > 0, "no race: the test proves nothing"
        b.states.drop(sid)
        final = (await b.load_session(sid)).messages[got["mid"]]
        assert (status, text) == (final.status, final.content) == ("done", final.content)


async def test_a_renewal_whose_answer_was_lost_keeps_the_reply(nats_cluster, tmp_path):
    import nats.errors
    async with worker(nats_cluster, tmp_path, "a", "RV4", lease_ttl=2.0) as a, \
            worker(nats_cluster, tmp_path, "b", "RV4", lease_ttl=2.0) as b:
        meta, _ = await a.create_session(first_message="go")
        sid, kv = meta.id, a.worker.leases.renew_kv
        real, calls = kv.update, [0]

        async def update(key, value, last=None):  # type: ignore[no-untyped-def]
            rev = await real(key, value, last=last)
            calls[0] += 1
            if calls[0] == 1:
                raise nats.errors.TimeoutError  # applied; the answer lost
            return rev
        kv.update = update
        async with a.inflight(sid) as msg:
            mid = msg.msg_id
            for i in range(500):  # 5 s: several renewals, the lease's time to live twice
                msg.write(f"{i} ")
                await trio.sleep(0.01)
        assert calls[0] > 1 and a.worker.lost == [] and b.worker.swept == []
        assert finals(await b.es.read(sid), mid) == [("done", None)]


async def test_a_start_does_not_wait_for_a_session_purged_during_its_replay(nats_cluster):
    import nats.js.client as jsc

    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    kw = {"stream": "RV5", "prefix": "rv5.s", "timeout": 3}
    async with open_jetstream_log(nats_cluster.urls, **kw) as es:
        for s in ("keep", "gone"):
            await es.create(s, [SessionCreated(session_id=s)])
    real = jsc.JetStreamContext.subscribe

    async def subscribe(self, *a, **k):  # type: ignore[no-untyped-def]
        await self.purge_stream("RV5", subject="rv5.s.gone")  # another worker deletes it now
        return await real(self, *a, **k)
    jsc.JetStreamContext.subscribe = subscribe  # type: ignore[method-assign]
    try:
        with trio.fail_after(15):
            async with open_jetstream_log(nats_cluster.urls, replay=True, **kw) as es:
                assert es.session_ids() == ["keep"]
    finally:
        jsc.JetStreamContext.subscribe = real  # type: ignore[method-assign]


async def test_what_an_adopt_reads_reaches_the_listeners(nats_cluster):
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    kw = {"stream": "RV6", "prefix": "rv6.s", "timeout": 3}
    async with open_jetstream_log(nats_cluster.urls, **kw) as a, open_jetstream_log(nats_cluster.urls, **kw) as b:
        reg = Registry()
        b.listeners.append(reg.apply)
        await a.create("s", [SessionCreated(session_id="s", title="t0")])
        await until(lambda: "s" in reg)
        held, real = [], b._take_foreign
        b._take_foreign = lambda *m: held.append(m)  # type: ignore[method-assign]  # the tail a moment behind
        await a.append_many("s", [SessionRenamed(title="renamed on a")])
        b._take_foreign = real  # type: ignore[method-assign]
        await b.adopt("s")  # what a sweeper's finalize_orphan does
        for m in held:
            real(*m)  # the tail catches up
        assert reg.get("s").title == "renamed on a"


async def test_a_record_over_the_servers_max_payload_is_refused_alone_and_big_batches_split(nats_cluster):
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    async with open_jetstream_log(nats_cluster.urls, stream="RV7", prefix="rv7.s", timeout=3) as es:
        await es.create("s", [SessionCreated(session_id="s")])
        with pytest.raises(RecordTooLarge, match="max_payload"):
            await es.append_many("s", [MessageProgress(msg_id="m", content_delta="x" * 1_200_000)])
        assert es.broken is None and es.last_seq("s") == 1, "refused, and nothing changed"
        for i in range(30):  # one batch of 30 x 50 KB: over 1 MiB, in several messages
            es.append_nowait("s", MessageProgress(msg_id="m", content_delta="y" * 50_000, offset=i * 50_000))
        await es.flush()
        assert [r.seq for r in await es.read("s")] == list(range(1, 32))


async def test_a_session_removed_here_is_not_brought_back_by_the_tail(nats_cluster):
    from sessionlog_store.eventstore.events import SessionDeleted
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    async with open_jetstream_log(nats_cluster.urls, stream="RV8", prefix="rv8.s", timeout=3) as es:
        await es.create("s", [SessionCreated(session_id="s")])
        data, last, _ = await es._messages("s")
        await es.append_many("s", [SessionDeleted()])
        await es.remove("s")
        es._take_foreign("rv8.s.s", data, last)  # the tail, late with an old message of it
        assert "s" not in es
        await es.create("s", [SessionCreated(session_id="s")])  # the id is free
        assert [r.seq for r in await es.read("s")] == [1]


def test_an_interrupted_migration_is_finished_by_running_it_again(nats_cluster, tmp_path):
    from sessionlog_store.eventstore.local.fsio import OS_FILES
    from sessionlog_store.server.stores import open_session_store
    from sessionlog_store.server.migrate import StreamTarget, local_to_stream
    root = str(tmp_path / "local")

    async def make() -> str:
        async with open_session_store(root) as store:
            meta, _ = await store.create_session(first_message="x")
            for i in range(8):
                await store.append_message(meta.id, f"{i}" * 100_000)  # 800 KB: two messages
            return meta.id
    sid = trio.run(make)
    target = StreamTarget(tuple(nats_cluster.urls), stream="RV9")
    from sessionlog_store.eventstore.jetstream import imports
    real = imports.import_log

    async def broken(self, session_id, data, *, after=0):  # type: ignore[no-untyped-def]
        import nats.errors

        from sessionlog_store.eventstore.jetstream.natsio import publisher_of
        pub, calls = publisher_of(self.js), [0]
        publish_all = pub.publish_all

        async def second_fails(messages):  # type: ignore[no-untyped-def]
            calls[0] += 1
            if calls[0] == 2:
                return [nats.errors.Error("the connection broke") for _ in messages]
            return await publish_all(messages)
        pub.publish_all = second_fails  # type: ignore[method-assign]
        try:
            return await real(self, session_id, data, after=after)
        finally:
            pub.publish_all = publish_all  # type: ignore[method-assign]
    imports.import_log = broken
    try:
        first = trio.run(local_to_stream, OS_FILES, root, target)
    finally:
        imports.import_log = real
    assert first.copied == 0 and any("run migrate again" in p for p in first.problems), first.problems
    again = trio.run(local_to_stream, OS_FILES, root, target)
    assert again.copied == 1 and again.problems == [], again.problems
    with open(f"{root}/sessions/{sid}/log.jsonl", "rb") as f:
        want = f.read()

    async def stream_bytes() -> bytes:
        async with target.open(create=False) as log:
            return await log.log_bytes(sid)
    assert trio.run(stream_bytes) == want


async def test_a_session_purged_before_the_tail_brought_its_tombstone_is_forgotten_on_read(nats_cluster):
    """b's tail is a moment behind a's deletion and its purge: the tombstone
    never reaches b. b's first read of the session finds its subject empty:
    unknown, and b's projection drops it."""
    from sessionlog_store.eventstore.errors import UnknownSession
    from sessionlog_store.eventstore.events import SessionDeleted
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    kw = {"stream": "RV10", "prefix": "rv10.s", "timeout": 3}
    async with open_jetstream_log(nats_cluster.urls, **kw) as a, open_jetstream_log(nats_cluster.urls, **kw) as b:
        reg = Registry()
        b.listeners.append(reg.apply)
        b.reset_listeners.append(lambda sid, records, end: reg.put(None, sid) if not records else None)
        await a.create("s", [SessionCreated(session_id="s")])
        await until(lambda: "s" in reg)
        real = b._take_foreign
        b._take_foreign = lambda *m: None  # type: ignore[method-assign]  # the tail never brings the tombstone
        await a.append_many("s", [SessionDeleted()])
        await a.remove("s")
        b._take_foreign = real  # type: ignore[method-assign]
        assert "s" in b and "s" in reg
        with pytest.raises(UnknownSession):
            await b.read("s")
        assert "s" not in b and "s" not in reg
