"""The second review of the shared stream (issue 17): stops across
workers, reserved leases, snapshots and rebases against an id deleted and
made again while a worker's tail lagged. Each test failed on the code
before its fix; the narrow windows are made wide on purpose (a late ack, a
late request, a tail held back), as they happen under load."""
from __future__ import annotations

from typing import Any

import pytest
import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized

from .test_workers import until, worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def finals(records, mid):  # type: ignore[no-untyped-def]
    return [(r.seq, r.event.status, r.event.aborted_reason) for r in records
            if isinstance(r.event, MessageFinalized) and r.event.msg_id == mid]


async def test_a_stop_asked_as_the_reply_ends_stores_one_finalize(nats_cluster, tmp_path):
    """b checks the reply is open, asks a to stop it; a's reply ends (done,
    lease released) before the request reaches it: nobody answers, and 2 s
    later b appends "aborted" after the "done" its tail brought meanwhile
    (its fence is current: no conflict, no rebase to drop it)."""
    async with worker(nats_cluster, tmp_path, "a", "RW1") as a, worker(nats_cluster, tmp_path, "b", "RW1") as b:
        meta, _ = await a.create_session(first_message="go")
        sid, got, ended = meta.id, {}, trio.Event()
        orig = b.worker.stops.request

        async def late(s: str, m: str, timeout: float = 2.0) -> bool:
            await ended.wait()  # the request reaches a just after its reply ended
            return await orig(s, m, timeout)
        b.worker.stops.request = late  # type: ignore[method-assign]
        async with trio.open_nursery() as n:
            async with a.inflight(sid) as msg:
                mid = got["mid"] = msg.msg_id
                msg.write("hello")
                await until(lambda: mid in b.get_meta(sid).open_msgs)
                n.start_soon(b.stop_anywhere, sid, mid)
                await trio.sleep(0.1)
            await until(lambda: not a.worker.leases.holds(sid, mid))
            ended.set()
        await trio.sleep(0.5)
        f = finals(await a.es.read(sid), mid)
        assert len(f) == 1, f"two finalizes of one reply: {f}"


async def test_a_stop_before_the_producer_is_live_stops_it(nats_cluster, tmp_path):
    """a's placeholder is on the stream (b sees it) but a's inflight has not
    registered its producer yet (the ack late: a retried publish, a busy
    trio thread): a answers "stopped" from holds() alone, b reports the stop
    done, and a's reply runs to "done"."""
    async with worker(nats_cluster, tmp_path, "a", "RW2") as a, worker(nats_cluster, tmp_path, "b", "RW2") as b:
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        orig = a.append_events

        async def slow(s: str, *events: Any) -> Any:
            out = await orig(s, *events)
            if any(isinstance(e, MessageCreated) and e.status == "running" for e in events):
                await trio.sleep(1.0)  # the placeholder's ack processed late
            return out
        a.append_events = slow  # type: ignore[method-assign]
        box: dict[str, Any] = {}

        async def stopper() -> None:
            await until(lambda: sid in b.registry and bool(b.get_meta(sid).open_msgs))
            mid = next(iter(b.get_meta(sid).open_msgs))
            box["stopped"] = await b.stop_anywhere(sid, mid)
        async with trio.open_nursery() as n:
            n.start_soon(stopper)
            async with a.inflight(sid) as msg:
                mid = msg.msg_id
                await until(lambda: "stopped" in box)
                for i in range(20):
                    msg.write(f"{i} ")
                    await trio.sleep(0.02)
                box["ran_to_end"] = True
        await trio.sleep(0.3)
        f = finals(await a.es.read(sid), mid)
        assert box["stopped"] is True
        assert not box.get("ran_to_end"), f"b was told 'stopped' but a's reply ran on to its end: {f}"


async def test_a_reserved_lease_goes_when_the_reply_cannot_start(nats_cluster, tmp_path):
    """connection.chat: reserve_reply, the user's message, then start_reply
    -> inflight(leased=True); an inflight that raises before its placeholder
    (shutting down, the session deleted meanwhile) never gives the lease
    back: it is renewed for the worker's life."""
    async with worker(nats_cluster, tmp_path, "a", "RW3") as a:
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        rid = await a.reserve_reply(sid)
        a.shutting_down = True
        try:
            with pytest.raises(Exception):
                async with a.inflight(sid, msg_id=rid, leased=True):
                    pass
        finally:
            a.shutting_down = False
        assert not a.worker.leases.holds(sid, rid), "the reserved lease is still held (and renewed)"


async def test_no_snapshot_of_the_old_incarnation_is_named_for_the_new(nats_cluster, tmp_path):
    """a's tail lags while b deletes S and makes S again: a writes S's
    snapshot with `first` read from the stream now (the new incarnation's)
    but the state and stream_seq of the old one; a load of the new S takes
    it (first matches) and folds the new records after the old state."""
    from sessionlog_store.projections.recovery import fold_until
    from sessionlog_store.eventstore.record import scan
    async with worker(nats_cluster, tmp_path, "a", "RW4") as a, worker(nats_cluster, tmp_path, "b", "RW4") as b:
        meta, _ = await a.create_session(first_message="old " * 20000)
        sid = meta.id
        await a.load_session(sid)
        await until(lambda: sid in b.registry)
        held: list[Any] = []
        orig = a.es._tailed

        def lagging(subject, data, stream_seq, own):  # type: ignore[no-untyped-def]
            if subject.endswith(sid) and not own:
                held.append((subject, data, stream_seq, own))
                return
            orig(subject, data, stream_seq, own)
        a.es._tailed = lagging  # type: ignore[method-assign]
        await b.delete_session(sid)
        await b.create_session(session_id=sid, first_message="new " * 20000)
        for i in range(4):
            await b.append_message(sid, f"new message {i}")
        await a.worker.write_snapshot(sid)  # (refused: the stream's S is another incarnation)
        a.es._tailed = orig  # type: ignore[method-assign]
        for item in held:
            orig(*item)
        b.states.drop(sid)
        state = await b.worker.read_state(sid)
        data = await b.es.log_bytes(sid)
        records = scan(sid, data).records
        truth = fold_until(records, data, records[-1].seq)
        got = [m.content[:12] for m in state.messages.values()]
        want = [m.content[:12] for m in truth.messages.values()]
        assert got == want, f"snapshot_loads={b.worker.snapshot_loads}: loaded {got}, stream holds {want}"


async def test_a_rebase_puts_no_record_of_the_old_incarnation_into_the_new(nats_cluster, tmp_path):
    """a's tail lags while b deletes S and makes S again; a appends to S: the
    fence refuses it, the rebase reads the new S (no tombstone: purged) and
    appends a's record of the old session after the new one's."""
    from sessionlog_store.eventstore.events import SessionRenamed
    async with worker(nats_cluster, tmp_path, "a", "RW5") as a, worker(nats_cluster, tmp_path, "b", "RW5") as b:
        meta, _ = await a.create_session(first_message="old")
        sid = meta.id
        await until(lambda: sid in b.registry)
        orig = a.es._tailed
        a.es._tailed = lambda subject, data, seq, own: None if subject.endswith(sid) else orig(subject, data, seq, own)
        await b.delete_session(sid)
        await b.create_session(session_id=sid, first_message="new")
        from sessionlog_store.eventstore.errors import UnknownSession
        with pytest.raises(UnknownSession):
            await a.es.append_many(sid, [SessionRenamed(title="title of the OLD session")])
        a.es._tailed = orig  # type: ignore[method-assign]
        records = await b.es.read(sid)
        titles = [r.event.title for r in records if isinstance(r.event, SessionRenamed)]
        assert "title of the OLD session" not in titles, f"the new session holds the old one's record: {records}"
