"""Review of the issue 25 fixes (6506b67..ec0aff1): reproductions of what
still breaks, each on a real 3-node cluster. Each test fails on main at
ec0aff1 if the finding holds. Windows are widened on purpose (a worker's
publishes held at its NATS crossing, as tests/test_pauses.py does), and
faults are real: a node killed, a leader paused with SIGSTOP."""
from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from sessionlog_store.eventstore.errors import EventStoreError
from sessionlog_store.eventstore.events import MessageFinalized, MessageProgress, SessionRenamed
from sessionlog_store.server.edge.client import ServerError, open_client

from .nats_cluster import NatsCluster, _free_ports
from .test_scaleout import TOKEN, Worker
from .test_workers import gate_crossings, until, worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")

TERMINAL = ("done", "error", "aborted")


def _text(updates: list[Any]) -> str:
    text = ""
    for u in updates:
        text = text[:u.offset] + u.content_delta
    return text


def _stored(records: list[Any], mid: str) -> str:
    text = ""
    for r in records:
        if isinstance(r.event, MessageProgress) and r.event.msg_id == mid:
            text = text[:r.event.offset] + r.event.content_delta
    return text


# -- F1: a terminal update after the rebase dropped this worker's own finalize ----

async def test_f1_own_finalize_dropped_by_a_rebase_tells_the_streams_end(nats_cluster, tmp_path):
    """Worker a streams a reply; another writer (b: stop_anywhere's no-answer
    path, or a sweep) finalizes it `aborted`; a ends it `aborted` too at the
    same moment (its own client's stop), flushing its last text. a's batch
    is refused by the fence and the rebase drops a's progress and finalize.
    `Worker.stream_end` only replaces a's terminal update when the statuses
    differ: with both `aborted`, a's subscriber may be told a's own content
    (text the stream never held) and a seq that names b's idle flag. Which
    terminal reaches the subscriber first is trio's choice (two tasks woken
    together), so a few rounds are run."""
    async with worker(nats_cluster, tmp_path, "a", "R25F1") as a, worker(nats_cluster, tmp_path, "b", "R25F1") as b:
        gate = gate_crossings(a)
        bad: list[Any] = []
        async def one_round(rnd: int) -> dict[str, Any] | None:
            meta, _ = await a.create_session(first_message=f"go {rnd}")
            sid = meta.id
            got: list[Any] = []
            box: dict[str, Any] = {}

            async def produce() -> None:
                async with a.inflight(sid) as msg:
                    box["mid"] = msg.msg_id
                    msg.write("said and stored. ")
                    await trio.sleep_forever()

            late: list[Any] = []

            async def follow(into: list[Any]) -> None:
                await until(lambda: "mid" in box)
                async for u in await a.subscribe(sid, box["mid"], offset=0):
                    into.append(u)
                    if u.status in TERMINAL:
                        return
            async with trio.open_nursery() as n:
                n.start_soon(produce)
                n.start_soon(follow, got)
                await until(lambda: any("stored" in u.content_delta for u in got))
                mid = box["mid"]
                await until(lambda: sid in b.registry and mid in b.registry.get(sid).open_msgs)
                gate["held"], gate["opened"] = True, trio.Event()
                a.saver.active[(sid, mid)].write("NEVER ON THE STREAM")
                assert a.stop(sid, mid)  # a's own client's stop: a's finalize, its last text flushed first
                await until(lambda: (sid, mid) not in a.saver.active and a.es.last_seq(sid) > a.es.durable_seq(sid))
                # b writes the reply's end, as stop_anywhere does when a did not answer its stop in 2 s
                await b.append_events(sid, *b.replies._ending(sid, MessageFinalized(
                    msg_id=mid, status="aborted", aborted_reason="stopped by user")))
                # a page that (re)subscribes now: a's finalize is not durable yet, so subscribe
                # waits for it, and then shows the message from the state it loaded before
                n.start_soon(follow, late)
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                gate["opened"].set()
                gate["held"] = False
            records = await b.es.read(sid)
            [fin] = [r for r in records if isinstance(r.event, MessageFinalized) and r.event.msg_id == mid]
            stored = _stored(records, mid)
            wrong = {}
            for name, updates in (("live", got), ("late", late)):
                told = _text(updates)
                if told != stored or updates[-1].seq != fin.seq:
                    wrong[name] = {"told": told, "told_seq": updates[-1].seq, "last": updates[-1]}
            if wrong:
                return {"round": rnd, "stored": stored, "finalize_seq": fin.seq, **wrong}
            return None

        for rnd in range(8):
            with trio.fail_after(60):
                found = await one_round(rnd)
            if found is not None:
                bad.append(found)
                break
        assert not bad, bad


# -- F2: a leader election of the lease bucket ends every running reply ----------

@pytest.mark.slow
# (the leader killed, a rolling restart: in the long mode, `dev.py torture`; the
# pause, the harder case, in every run)
@pytest.mark.parametrize("fault", ["pause", pytest.param("kill", marks=pytest.mark.skipif(
    not os.environ.get("SESSIONLOG_TORTURE_KILLS"), reason="the long mode's (dev.py torture): 56 s"))])
async def test_f2_losing_the_lease_buckets_leader_does_not_end_live_replies(tmp_path, fault):
    """One worker (default --lease-ttl 15, renewals every 5 s) streams a
    reply; the node leading the lease bucket's stream is paused 12 s
    (SIGSTOP: a VM stall) or killed (a rolling restart), 4.5 s after a
    renewal round ended. The cluster keeps its quorum and elects another
    leader within NATS's 4-9 s, and no other worker exists to take the
    lease; but a renewal round is one request per lease with nats-py's 10 s
    timeout and no retry, its fallback read gives back the old deadline, and
    the next round is 5 s later: the lease lapses locally and `may_write`
    ends the reply ("lease expired"); the worker's own sweeper then
    finalizes it `aborted` "worker restart". Every worker's renewals go to
    the same leader: every running reply of the cluster ends."""
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    paused: list[int] = []
    try:
        async with worker(cluster, tmp_path, "a", "R25F2", lease_ttl=15.0) as a:
            assert a.worker is not None
            leases = a.worker.leases
            rounds: list[float] = []
            renew_all = leases.renew_all

            async def spied(keys=None):  # type: ignore[no-untyped-def]
                try:
                    return await renew_all(keys)
                finally:
                    rounds.append(trio.current_time())
            leases.renew_all = spied  # (observed only: when a round ends)
            meta, _ = await a.create_session(first_message="a long one")
            sid = meta.id
            box: dict[str, Any] = {}

            async def produce() -> None:
                async with a.inflight(sid) as msg:
                    box["mid"] = msg.msg_id
                    for i in range(450):  # 45 s of text
                        msg.write(f"{i} ")
                        await trio.sleep(0.1)
            async with trio.open_nursery() as n:
                n.start_soon(produce)
                await until(lambda: "mid" in box)
                n_rounds = len(rounds)
                await until(lambda: len(rounds) > n_rounds, within=30)
                await trio.sleep_until(rounds[-1] + 4.5)
                info = await a.es.bridge.run(lambda: a.es.js.stream_info("KV_R25F2-leases"))
                node = int(info.cluster.leader[1:])
                proc = cluster.procs[node]
                assert proc is not None
                if fault == "kill":
                    cluster.kill(node)
                else:
                    os.kill(proc.pid, signal.SIGSTOP)
                    paused.append(proc.pid)
                    await trio.sleep(12)
                    os.kill(proc.pid, signal.SIGCONT)
                    paused.remove(proc.pid)
            mid = box["mid"]
            m = (await a.load_session(sid)).messages[mid]
            assert (m.status, a.worker.lost) == ("done", []), (m.status, m.metadata, a.worker.lost)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        cluster.stop()


# -- F3: one turn at a time is a check, then awaits, then the write ------------------

@pytest.fixture
def f3_workers(nats_cluster: NatsCluster, tmp_path: Path):  # type: ignore[no-untyped-def]
    made = [Worker(nats_cluster, tmp_path / f"w{i}", port, "R25F3", "--agent-speed", "3")
            for i, port in enumerate(_free_ports(2))]
    try:
        for w in made:
            w.start()
        yield made
    finally:
        for w in made:
            w.stop()


@pytest.mark.slow
async def test_f3_two_chats_sent_at_once_are_not_both_accepted(f3_workers):
    """Item 6: `turn_free` is checked before the lease is taken and the
    user's message and the placeholder are written (each awaited): two
    chats into one idle session sent at the same moment, on one worker from
    two tabs or on two workers, both pass the check and both replies run."""
    one, two = f3_workers
    async with open_client("127.0.0.1", one.port, TOKEN) as a1, open_client("127.0.0.1", one.port, TOKEN) as a2, \
            open_client("127.0.0.1", two.port, TOKEN) as b:
        ack = await a1.request("chat", content="first turn")
        sid = ack["session_id"]
        await a1.follow(sid)
        await a1.request("stop", session_id=sid, msg_id=ack["reply_id"])
        with trio.fail_after(30):
            await a1.wait_done(sid, ack["reply_id"])
        await until(lambda: any(f["type"] == "session_created" and f["data"]["session"]["id"] == sid
                                for f in b.pushes), within=30)
        both: list[dict[str, Any]] = []
        for rnd in range(6):
            results: dict[str, Any] = {}

            async def send(name: str, c: Any) -> None:
                try:
                    results[name] = await c.request("chat", content=f"turn {rnd} from {name}", session_id=sid)
                except ServerError as e:
                    results[name] = e.code
            async with trio.open_nursery() as n:
                for name, c in (("a1", a1), ("a2", a2), ("b", b)):
                    n.start_soon(send, name, c)
            accepted = {k: v for k, v in results.items() if isinstance(v, dict)}
            if len(accepted) > 1:
                both.append({"round": rnd, "results": results})
                break
            # end the accepted turn before the next round
            loaded = await a1.request("load_session", session_id=sid)
            for m in loaded["messages"]:
                if m["status"] in ("pending", "running"):
                    try:
                        await a1.request("stop", session_id=sid, msg_id=m["msg_id"])
                    except ServerError:
                        pass
            with trio.fail_after(30):
                while any(m["status"] in ("pending", "running")
                          for m in (await a1.request("load_session", session_id=sid))["messages"]):
                    await trio.sleep(0.1)
        assert not both, both


# -- F4: nothing follows this worker's own tombstone -----------------------------------

async def test_f4_nothing_follows_a_workers_own_tombstone(nats_cluster, tmp_path):
    """delete_session cancels the session's producer and appends the
    tombstone at once; the producer's finalize path then flushes its pending
    text (`saver.flush` in `_finalize`), and the stream log appends it after
    the tombstone: JetStreamLog marks a session deleted only for another
    writer's tombstone (the local EventStore refuses anything after its
    own). The stream holds a progress after the tombstone until the purge
    (for ever if the worker dies in between: `verify` then reports it), and
    another worker's tail makes the deleted id a live session again."""
    async with worker(nats_cluster, tmp_path, "a", "R25F4") as a, worker(nats_cluster, tmp_path, "b", "R25F4") as b:
        seen: list[tuple[str, list[Any]]] = []
        b.es.stream_listeners.append(lambda sid, data, records, seq: seen.append((sid, list(records))))
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        box: dict[str, Any] = {}

        async def produce() -> None:
            async with a.inflight(sid) as msg:
                box["mid"] = msg.msg_id
                for i in range(1_000_000):
                    msg.write(f"{i} ")
                    await trio.sleep(0.001)
        async with trio.open_nursery() as n:
            n.start_soon(produce)
            await until(lambda: "mid" in box and a.es.durable_seq(sid) > 6)
            assert await a.delete_session(sid)
        await until(lambda: sid not in b.registry)
        with trio.move_on_after(5):  # whatever the tail still brings
            await until(lambda: b.es.tail_position >= a.es.written_position)
        kinds = [type(r.event).__name__ for s, recs in seen if s == sid for r in recs]
        assert "SessionDeleted" in kinds, kinds
        after = kinds[kinds.index("SessionDeleted") + 1:]
        assert after == [], f"records after the tombstone on the stream: {after}"
        assert sid not in b.es, "the deleted id is a live session in b's log again"


# -- F5: a rebase whose read gets no answer fails the whole store -------------------

@pytest.mark.slow
async def test_f5_a_rebase_read_during_a_leader_pause_does_not_fail_the_store(tmp_path):
    """A conflict's rebase reads the session (`_messages`, STREAM.MSG.GET,
    answered by the stream's leader only). If the leader is paused then,
    the read waits out its 10 s timeout and raises nats' TimeoutError; any
    exception that is not an EventStoreError `_fail`s the store (the worker
    exits 5, every reply it streams is swept), although publishes get
    --nats-retry-for (60 s) and a new leader answered within seconds."""
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    paused: list[int] = []
    try:
        async with worker(cluster, tmp_path, "a", "R25F5") as a, worker(cluster, tmp_path, "b", "R25F5") as b:
            meta, _ = await a.create_session(first_message="go")
            sid = meta.id
            await until(lambda: sid in b.registry)
            info = await a.es.bridge.run(lambda: a.es.js.stream_info("R25F5"))
            proc = cluster.procs[int(info.cluster.leader[1:])]
            assert proc is not None
            read = a.es._messages
            armed = [False]

            async def read_in_a_pause(session_id: str):  # type: ignore[no-untyped-def]
                if armed[0] and session_id == sid:  # the rebase's read: the leader pauses now
                    armed[0] = False
                    os.kill(proc.pid, signal.SIGSTOP)
                    paused.append(proc.pid)
                    try:
                        return await read(session_id)
                    finally:
                        os.kill(proc.pid, signal.SIGCONT)
                        paused.remove(proc.pid)
                return await read(session_id)
            a.es._messages = read_in_a_pause
            gate = gate_crossings(a)
            gate["held"] = True
            a.es.append_nowait(sid, SessionRenamed(title="renamed on a"))
            await b.rename_session(sid, "renamed on b")  # stored first: a's publish conflicts
            armed[0] = True
            gate["opened"].set()
            gate["held"] = False
            try:
                with trio.fail_after(90):
                    await a.es.wait_durable(sid, a.es.last_seq(sid))
            except EventStoreError:
                pass
            assert a.es.broken is None, f"the store failed: {a.es.broken!r}"
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        cluster.stop()


# -- F6: a reply ended by its session's deletion keeps its lease, renewed for ever --

async def test_f6_a_reply_ended_by_its_sessions_deletion_gives_its_lease_back(nats_cluster, tmp_path):
    """`Replies._finalize` returns early when the session is gone (deleted
    here: delete_session cancels the producer; or elsewhere: `Worker._gone`
    ends it with `_end_here`) without `reply_ended`: the lease stays in
    `Leases._revisions`, and `renew_loop` renews it every ttl/3 for as long
    as the worker runs (its own sweeper never takes it). Each reply a user
    deletes mid-stream adds one KV write every 5 s per worker, for ever."""
    async with worker(nats_cluster, tmp_path, "a", "R25F6", lease_ttl=1.5) as a, \
            worker(nats_cluster, tmp_path, "b", "R25F6") as b:
        assert a.worker is not None
        sids = []
        for where in (a, b):  # deleted here, and deleted by another worker
            meta, _ = await a.create_session(first_message="go")
            sid = meta.id
            sids.append(sid)
            box: dict[str, Any] = {}

            async def produce() -> None:
                async with a.inflight(sid) as msg:
                    box["mid"] = msg.msg_id
                    for i in range(1_000_000):
                        msg.write(f"{i} ")
                        await trio.sleep(0.01)
            async with trio.open_nursery() as n:
                n.start_soon(produce)
                await until(lambda: "mid" in box and sid in b.registry and box["mid"] in b.registry.get(sid).open_msgs)
                assert await where.delete_session(sid)
        await until(lambda: all(s not in a.registry and s not in b.registry for s in sids))
        await trio.sleep(3 * 1.5 + 2.0)  # past the lease's ttl and skew: a released or swept lease is gone by now
        left = [k for k in await a.worker.leases.keys() if k.split(".", 1)[0] in sids]
        assert left == [] and not a.worker.leases._revisions, (left, a.worker.leases._revisions)


# -- F7: a node that was up at the start and comes back unsynced is not noticed -----

@pytest.mark.slow
async def test_f7_a_node_restarted_without_sync_always_stops_the_worker(tmp_path):
    """Item 7 asks that sync_interval be required 'of every server that
    later answers'. Only the monitors that did not answer at the start are
    checked again while serving: a node up at the start, then restarted
    (a rolling restart) without `sync_interval: always`, acknowledges
    writes it has not fsynced and the worker never notices."""
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    [port] = _free_ports(1)
    w = Worker(cluster, tmp_path / "w", port, "R25F7", "--agent-speed", "0")
    try:
        w.start()  # every node up and synced
        cluster.kill(2)
        cluster.sync = ""
        cluster.start(2)  # back, unsynced
        assert not cluster.sync_always(2)
        assert w.proc is not None
        try:
            code = await trio.to_thread.run_sync(lambda: w.proc.wait(30))  # type: ignore[union-attr]
        except Exception:  # noqa: BLE001 - still serving
            code = None
        assert code == 3, "the worker kept serving with an unsynced node in the cluster"
    finally:
        w.stop()
        cluster.stop()


# -- F9: a paused stream leader: the publish retry meets "duplicate message id is in process" --

@pytest.mark.slow
async def test_f9_a_paused_stream_leader_does_not_break_the_store(tmp_path):
    """The stream's leader is paused (SIGSTOP) 8-15 s while a reply streams,
    then runs again. Publishes that got no answer are sent again with their
    Nats-Msg-Id; when the resumed (or new) leader still has the first copy
    in process it answers JetStream error 10158 "duplicate message id is in
    process", which `publish_answered` does not count as unanswered: the
    batch fails and the store breaks (the worker exits 5, its replies are
    swept). Leases are long here (60 s) so that only the stream is tested."""
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    paused: list[int] = []
    try:
        # Two pauses in the suite; the whole sweep in the long mode (`dev.py torture`)
        pauses = (8, 10, 11, 12, 13, 15) if os.environ.get("SESSIONLOG_TORTURE_KILLS") else (8, 13)
        for rnd, pause in enumerate(pauses):
            stream = f"R25F9{rnd}"
            async with worker(cluster, tmp_path, f"a{rnd}", stream, lease_ttl=60.0) as a:
                meta, _ = await a.create_session(first_message="go")
                sid = meta.id
                box: dict[str, Any] = {}

                async def produce() -> None:
                    async with a.inflight(sid) as msg:
                        box["mid"] = msg.msg_id
                        for i in range(1_000_000):
                            msg.write(f"{i} ")
                            await trio.sleep(0.005)
                            if box.get("enough"):
                                return
                async with trio.open_nursery() as n:
                    n.start_soon(produce)
                    await until(lambda: "mid" in box and a.es.durable_seq(sid) > 5)
                    info = await a.es.bridge.run(lambda: a.es.js.stream_info(stream))
                    proc = cluster.procs[int(info.cluster.leader[1:])]
                    assert proc is not None
                    os.kill(proc.pid, signal.SIGSTOP)
                    paused.append(proc.pid)
                    await trio.sleep(pause)
                    os.kill(proc.pid, signal.SIGCONT)
                    paused.remove(proc.pid)
                    with trio.move_on_after(60):  # until what was written meanwhile is on the stream
                        await until(lambda: a.es.broken is not None or a.es.durable_seq(sid) == a.es.last_seq(sid),
                                    within=60)
                    box["enough"] = True
                assert a.es.broken is None, f"round {rnd}: the store failed: {a.es.broken!r}"
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        cluster.stop()


# -- F10: verify --backend on a live stream: a session deleted during the check ----

async def test_f10_verify_backend_survives_a_session_deleted_while_it_runs(nats_cluster, tmp_path):
    """`verify_stream` lists the sessions once (after its replay) and then
    reads each with `log_bytes`; one deleted meanwhile (its tombstone brought
    by verify's own tail, or its subject purged) raises UnknownSession out
    of the loop: the check of a live stream ends in a traceback instead of
    a report."""
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.stores import open_session_store
    from sessionlog_store.server.migrate import StreamTarget, verify_stream
    config = StoreConfig(backend=tuple(nats_cluster.urls), stream="R25F10")
    os.makedirs(tmp_path / "a", exist_ok=True)
    async with open_session_store(str(tmp_path / "a"), config=config) as a:
        sids = [(await a.create_session(first_message=f"s{i}"))[0].id for i in range(60)]
        seen: list[int] = []

        async def delete_while_verifying() -> None:
            await until(lambda: bool(seen), within=30)  # verify listed the sessions and reads them
            for sid in reversed(sids):
                await a.delete_session(sid)
        async with trio.open_nursery() as n:
            n.start_soon(delete_while_verifying)
            await verify_stream(StreamTarget(tuple(nats_cluster.urls), stream="R25F10"),
                                progress=lambda i, total: seen.append(i))
