"""Gray failures on a shared stream (issue 25), on a real 3-node cluster: a
worker paused (SIGSTOP/SIGCONT by pid) past its leases' time to live while
its replies stream. Another worker's sweeper (or its own, when it is alone)
finalizes them; the paused one, once it runs again, must not crash, must not
write anything of a reply after its finalize, must not tell its clients text
the stream does not hold, and the swept sessions end idle. Below them, the
lease and log rules each step relies on, one by one."""
from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, MessageProgress, SessionFlags
from sessionlog_store.server.edge.client import Client, open_client

from .nats_cluster import NatsCluster, _free_ports
from .test_leases import finalizes, opened, start_reply
from .test_scaleout import TOKEN, Worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


# -- the rules, one by one -------------------------------------------------------

async def _past(expires: float) -> None:
    """Until the wall clock is past `expires` (a lease's deadline: waiting
    longer only makes it more expired)."""
    while time.time() <= expires:
        await trio.sleep(0.05)


async def test_releasing_a_lease_another_worker_took_is_quiet(nats_cluster):
    """Item 1: the paused worker's release, after a sweeper took and deleted
    its lease, raised nats-py's BadRequestError 10071 into the store's
    nursery and ended the process."""
    from sessionlog_store.eventstore.jetstream.leases import Leases
    async with opened(nats_cluster, "PAUSE1") as a, opened(nats_cluster, "PAUSE1") as b:
        la, lb = await Leases.open(a, ttl=0.5, skew=0.1), await Leases.open(b, ttl=5, skew=0.1)
        await start_reply(a, "s1", "m1")
        await la.acquire("s1", "m1")
        await _past(time.time() + 0.5 + 0.1)
        assert await lb.sweep() == [("s1", "m1")]
        assert await lb.keys() == [], "the sweeper deleted the lease"
        await la.release("s1", "m1")  # gone: nothing to release, and no error
        assert not la.holds("s1", "m1")


async def test_a_sweeper_never_takes_its_own_live_reply(nats_cluster):
    """Item 2: a worker's own sweeper took its own expired lease and wrote
    the finalize while its producer went on writing. It leaves a lease it
    holds alone; the lease lapsed is given up (`forget`) with the producer
    ended, and only then swept, once."""
    from sessionlog_store.eventstore.jetstream.leases import Leases
    async with opened(nats_cluster, "PAUSE2") as a:
        la = await Leases.open(a, ttl=0.5, skew=0.1)
        await start_reply(a, "s1", "m1")
        await la.acquire("s1", "m1")
        await _past(time.time() + 0.5 + 0.1)
        assert la.lapsed("s1", "m1")
        assert await la.sweep() == [], "its own live reply's lease is not taken"
        assert finalizes(await a.read("s1"), "m1") == []
        la.forget("s1", "m1")
        assert await la.sweep() == [("s1", "m1")]
        assert [f.aborted_reason for f in finalizes(await a.read("s1"), "m1")] == ["worker restart"]


async def test_nothing_is_appended_to_a_message_after_its_finalize(nats_cluster):
    """Item 2: progress records after a finalize from the same writer passed
    the fence. A progress or a second finalize of a finalized message is
    refused, whoever wrote the finalize, and changes nothing."""
    from sessionlog_store.eventstore.errors import MessageFinished
    async with opened(nats_cluster, "PAUSE3") as a, opened(nats_cluster, "PAUSE3") as b:
        await start_reply(a, "s1", "m1")
        await a.append_many("s1", [MessageProgress(msg_id="m1", content_delta="hello", offset=0)])
        await a.append_many("s1", [MessageFinalized(msg_id="m1", status="aborted", aborted_reason="worker restart")])
        for late in (MessageProgress(msg_id="m1", content_delta=" more", offset=5),
                     MessageFinalized(msg_id="m1", status="aborted", aborted_reason="server shutdown")):
            with pytest.raises(MessageFinished):
                a.append_nowait("s1", late)
            with pytest.raises(MessageFinished):
                await a.append_many("s1", [late])
        # another writer's finalize, brought by the tail
        await start_reply(b, "s2", "m2")
        with trio.fail_after(30):
            while "s2" not in a:
                await trio.sleep(0.02)
        await b.append_many("s2", [MessageFinalized(msg_id="m2", status="aborted", aborted_reason="stopped by user")])
        with trio.fail_after(30):
            while a.last_seq("s2") < 3:
                await trio.sleep(0.02)
        with pytest.raises(MessageFinished):
            await a.append_many("s2", [MessageProgress(msg_id="m2", content_delta="late", offset=0)])
        await a.flush()
        for sid, mid in (("s1", "m1"), ("s2", "m2")):
            records = await b.read(sid)
            end = [i for i, r in enumerate(records) if isinstance(r.event, MessageFinalized)]
            assert len(end) == 1 and end[0] == len(records) - 1, [type(r.event).__name__ for r in records]


async def test_a_swept_reply_leaves_its_session_idle(nats_cluster):
    """Item 4: the sweeper's finalize came with no idle flag, so a swept
    session was listed `running` for ever."""
    from sessionlog_store.eventstore.jetstream.leases import Leases
    async with opened(nats_cluster, "PAUSE4") as a, opened(nats_cluster, "PAUSE4") as b:
        la, lb = await Leases.open(a, ttl=0.5, skew=0.1), await Leases.open(b, ttl=5, skew=0.1)
        for sid in ("s1", "s2"):
            await start_reply(a, sid, "m1")
            await a.append_many(sid, [SessionFlags(status="running")])
            await la.acquire(sid, "m1")
        # s2 has a second reply, still live (a lease of a minute: once it was
        # renewed every 0.1 s against a 0.5 s TTL, and lapsed on a busy CI)
        live = await Leases.open(a, ttl=60, skew=0.1)
        await a.append_many("s2", [MessageCreated(msg_id="m2", role="assistant", kind="llm_reply", status="running")])
        await live.acquire("s2", "m2")
        expires = time.time() + 0.5 + 0.1
        while time.time() <= expires:  # (the m1 leases' deadline passed: at least this long)
            await trio.sleep(0.1)
        assert sorted(await lb.sweep()) == [("s1", "m1"), ("s2", "m1")]
        s1, s2 = await b.read("s1"), await b.read("s2")
        assert [type(r.event) for r in s1[-2:]] == [MessageFinalized, SessionFlags]
        assert s1[-1].event.status == "idle"  # type: ignore[union-attr]
        assert isinstance(s2[-1].event, MessageFinalized), "another reply runs: the session stays running"


# -- a paused worker, end to end -----------------------------------------------------

@pytest.fixture
def pair(nats_cluster: NatsCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Worker]]:
    stream = "P" + request.node.name.replace("test_", "")[:30].replace("_", "")
    made = [Worker(nats_cluster, tmp_path / f"w{i}", port, stream, "--agent-speed", "3")
            for i, port in enumerate(_free_ports(2))]
    try:
        yield made
    finally:
        for w in made:
            if w.proc is not None and w.proc.poll() is None:
                os.kill(w.proc.pid, signal.SIGCONT)
            w.stop()


async def _until(pred, within: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within):
        while not pred():
            await trio.sleep(0.05)


async def _follow(c: Client, sid: str) -> None:
    """Subscribe to the session's running messages from their first
    character (so that the frames alone tell everything the client was told);
    one ended already (a sweep that came first) is known as it ended."""
    for m in (await c.request("load_session", session_id=sid))["messages"]:
        if m["status"] in ("pending", "running"):
            await c.request("subscribe_msg", session_id=sid, msg_id=m["msg_id"], offset=0)
        else:
            c.status[(sid, m["msg_id"])] = m["status"]


async def _start_replies(c: Client, n: int) -> dict[str, str]:
    """n chats, each its own session, followed; reply -> session."""
    replies = {}
    for i in range(n):
        ack = await c.request("chat", content=f"a long story number {i}, please")
        replies[ack["reply_id"]] = ack["session_id"]
        await _follow(c, ack["session_id"])
    await _until(lambda: all(len(c.content.get((s, r), "")) > 20 for r, s in replies.items()))
    return replies


def _told(c: Client, sid: str, mid: str) -> list[tuple[str, str]]:
    """Every text the client was told of the message, as it stood after each
    update, with the update's status."""
    assert c.frames is not None
    have, out = "", []
    for text in c.frames:
        f = msgspec.json.decode(text)
        if f.get("type") != "msg_update" or (f["data"]["session_id"], f["data"]["msg_id"]) != (sid, mid):
            continue
        u = f["data"]
        have = have[:u["offset"]] + u["content_delta"]
        out.append((have, u["status"]))
    return out


async def _stream_truth(cluster: NatsCluster, stream: str, sids: set[str]) -> dict[str, list[Any]]:
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    async with open_jetstream_log(cluster.urls, stream=stream, prefix=f"sl.{stream}", replay=True) as log:
        return {sid: await log.read(sid) for sid in sids}


def _check_stream(records: list[Any]) -> dict[str, tuple[str, str | None, str]]:
    """Per message: one finalize, nothing of it after; its (status, reason, content)."""
    seen: dict[str, str] = {}
    ended: dict[str, tuple[str, str | None, str]] = {}
    for r in records:
        ev = r.event
        if isinstance(ev, MessageCreated):
            seen[ev.msg_id] = ev.content or ""
        elif isinstance(ev, MessageProgress):
            assert ev.msg_id not in ended, f"a progress of {ev.msg_id} after its finalize (seq {r.seq})"
            seen[ev.msg_id] = seen[ev.msg_id][:ev.offset] + ev.content_delta
        elif isinstance(ev, MessageFinalized):
            assert ev.msg_id not in ended, f"a second finalize of {ev.msg_id} (seq {r.seq})"
            ended[ev.msg_id] = (ev.status, ev.aborted_reason,
                                ev.content if ev.content is not None else seen[ev.msg_id])
    assert [r.seq for r in records] == list(range(1, len(records) + 1)), "seqs without gaps or repeats"
    return ended


async def _check_clients(c: Client, truth: dict[str, list[Any]], replies: dict[str, str]) -> None:
    for mid, sid in replies.items():
        ended = _check_stream(truth[sid])
        status, reason, content = ended[mid]
        told = _told(c, sid, mid)
        assert told and told[-1] == (content, status), (mid, told[-1:], (content, status))
        for text, st in told:
            assert content.startswith(text), f"told text the stream does not hold ({st}): {text[len(content):]!r}"


@pytest.mark.slow
async def test_a_worker_paused_past_its_leases_loses_them_cleanly(pair, nats_cluster):
    """Items 1-4: one streams four replies and is paused; two's sweeper
    finalizes them `aborted` "worker restart"; one, continued, stays up, tells
    its clients the stream's ends (and never text the stream lacks), writes
    nothing after a finalize; the swept sessions are idle everywhere."""
    one, two = pair
    one.start(), two.start()
    async with open_client("127.0.0.1", one.port, TOKEN, record=True) as a, \
            open_client("127.0.0.1", two.port, TOKEN, record=True) as b:
        replies = await _start_replies(a, 4)
        for sid in set(replies.values()):
            await _until(lambda: sid in {f["data"]["session"]["id"] for f in b.pushes
                                         if f["type"] == "session_created"})
            await _follow(b, sid)
        assert one.proc is not None
        os.kill(one.proc.pid, signal.SIGSTOP)
        with trio.fail_after(90):  # two's sweeper takes the paused worker's replies
            for mid, sid in replies.items():
                assert await b.wait_done(sid, mid) == "aborted"
        os.kill(one.proc.pid, signal.SIGCONT)
        with trio.fail_after(60):
            for mid, sid in replies.items():
                await a.wait_done(sid, mid)
        for c in (a, b):  # the swept sessions end idle, on both workers
            await _until(lambda: all(r["status"] == "idle" for r in c_rows(c) if r["id"] in replies.values()))
            rows = (await c.request("list_sessions"))["rows"]
            assert {r["id"]: r["status"] for r in rows if r["id"] in replies.values()} == \
                {sid: "idle" for sid in replies.values()}
        assert one.proc.poll() is None, "the paused worker is still up"
        truth = await _stream_truth(nats_cluster, one.stream, set(replies.values()))
        for c in (a, b):
            await _check_clients(c, truth, replies)
        ends = Counter(_check_stream(truth[sid])[mid][:2] for mid, sid in replies.items())
        assert ends == {("aborted", "worker restart"): 4}, ends


def c_rows(c: Client) -> list[dict[str, Any]]:
    """The rows a page holds from the list pushes so far (the last of each)."""
    rows: dict[str, dict[str, Any]] = {}
    for f in c.pushes:
        if f["type"] == "session_created":
            rows[f["data"]["session"]["id"]] = dict(f["data"]["session"])
        elif f["type"] == "session_updated" and f["data"]["id"] in rows:
            rows[f["data"]["id"]].update(f["data"])
    return list(rows.values())


@pytest.mark.slow
async def test_a_lone_worker_paused_past_its_leases_sweeps_them_once(pair, nats_cluster):
    """Item 2 end to end: alone on the stream, the paused worker's own
    sweeper is the one that finds the expired leases when it runs again.
    What runs first after SIGCONT decides each reply's end, and both are
    right: the saver, which finds the lease lapsed, ends the producer
    unwritten and the sweeper finalizes it `aborted` "worker restart"; or
    the renewal, whose compare-and-set proves that no one took the lease,
    and the reply goes on to `done`. Either way nothing follows a finalize,
    each reply has one, and its clients are told the stream's ends."""
    one, _ = pair
    one.start()
    async with open_client("127.0.0.1", one.port, TOKEN, record=True) as a:
        replies = await _start_replies(a, 4)
        assert one.proc is not None
        os.kill(one.proc.pid, signal.SIGSTOP)
        await trio.sleep(5.0)  # the pause itself: past --lease-ttl 2 plus the 2 s clock skew
        os.kill(one.proc.pid, signal.SIGCONT)
        with trio.fail_after(120):
            for mid, sid in replies.items():
                await a.wait_done(sid, mid)
        await _until(lambda: all(r["status"] == "idle" for r in c_rows(a) if r["id"] in replies.values()))
        assert one.proc.poll() is None
        truth = await _stream_truth(nats_cluster, one.stream, set(replies.values()))
        await _check_clients(a, truth, replies)
        ends = Counter(_check_stream(truth[sid])[mid][:2] for mid, sid in replies.items())
        assert set(ends) <= {("aborted", "worker restart"), ("done", None)}, ends


async def test_a_client_is_told_only_what_the_stream_holds(nats_cluster, tmp_path):
    """Item 3: a progress was told to subscribers when appended, before the
    stream's fence refused it (another worker finalized the reply first) and
    the rebase dropped it. On a shared stream an update is told once the
    stream holds it, at the seq it holds it. The window is widened on
    purpose: a's publishes wait while b writes the finalize."""
    from .test_workers import gate_crossings, until, worker
    async with worker(nats_cluster, tmp_path, "a", "PAUSE5") as a, worker(nats_cluster, tmp_path, "b", "PAUSE5") as b:
        meta, _ = await a.create_session(first_message="go")
        sid = meta.id
        gate = gate_crossings(a)
        got: list[Any] = []
        box: dict[str, Any] = {}

        async def produce() -> None:
            async with a.inflight(sid) as msg:
                box["mid"] = msg.msg_id
                msg.write("said and stored. ")
                await trio.sleep_forever()

        async def follow() -> None:
            await until(lambda: "mid" in box)
            async for u in await a.subscribe(sid, box["mid"], offset=0):
                got.append(u)
                if u.status in ("done", "error", "aborted"):
                    return
        async with trio.open_nursery() as n:
            n.start_soon(produce)
            n.start_soon(follow)
            await until(lambda: any("stored" in u.content_delta for u in got))
            mid = box["mid"]
            gate["held"] = True
            a.saver.active[(sid, mid)].write("NEVER ON THE STREAM")
            await until(lambda: a.es.last_seq(sid) > a.es.durable_seq(sid))  # appended, its publish waiting
            await until(lambda: sid in b.registry and mid in b.registry.get(sid).open_msgs)
            await b.finalize_message(sid, mid, "aborted", reason="stopped by user")
            gate["opened"].set()
            gate["held"] = False
        records = await b.es.read(sid)
        [fin] = [r for r in records if isinstance(r.event, MessageFinalized)]
        stored = "".join(r.event.content_delta for r in records
                         if isinstance(r.event, MessageProgress) and r.event.msg_id == mid)
        assert "NEVER" not in stored, "the fence refused a's late progress"
        text = ""
        for u in got:
            text = text[:u.offset] + u.content_delta
            assert stored.startswith(text), f"told text the stream does not hold: {u}"
            assert u.seq <= fin.seq and u.durable_seq >= u.seq, u
        assert (got[-1].status, got[-1].aborted_reason, got[-1].seq) == ("aborted", "stopped by user", fin.seq)


async def test_racing_deletes_are_the_sessions_business_only(nats_cluster, tmp_path):
    """Item 5: two workers deleting a session while both stream a reply in
    it, each followed on the other. A conflict about that session (its
    rebase found it deleted) broke a worker's whole store. Now only the
    appends of that session are refused; the stores stay up, their other
    replies go on and end as they are told."""
    from sessionlog_store.server.domain.errors import NotFound
    from .test_workers import until, worker
    async with worker(nats_cluster, tmp_path, "a", "PAUSE6") as a, worker(nats_cluster, tmp_path, "b", "PAUSE6") as b:
        for rnd in range(4):
            doomed, _ = await a.create_session(first_message=f"doomed {rnd}")
            other, _ = await a.create_session(first_message=f"other {rnd}")
            await until(lambda: doomed.id in b.registry)
            ends: dict[tuple[str, str], str] = {}
            mids: dict[str, str] = {}

            async def produce(store: Any, name: str, sid: str, n: int) -> None:
                try:
                    async with store.inflight(sid) as msg:
                        mids[name] = msg.msg_id
                        for i in range(n):
                            msg.write(f"{i} ")
                            await trio.sleep(0.002)
                except NotFound:
                    return  # (deleted before its placeholder)
                ends[(name, sid)] = "done"

            async def follow(store: Any, sid: str, name: str) -> None:
                await until(lambda: name in mids and (sid not in store.registry
                                                      or mids[name] in store.registry.get(sid).open_msgs))
                try:
                    async for _ in await store.subscribe(sid, mids[name], offset=0):
                        pass
                except NotFound:
                    pass

            async def delete_on(store: Any, sid: str) -> None:
                try:
                    await store.delete_session(sid)
                except NotFound:
                    pass  # the other deleter came first: this caller's answer, nothing else's
            async with trio.open_nursery() as n:
                n.cancel_scope.deadline = trio.current_time() + 60  # (a subscription left open: fails below)
                n.start_soon(produce, a, "a", doomed.id, 100_000)
                n.start_soon(produce, b, "b", doomed.id, 100_000)
                n.start_soon(produce, a, "other", other.id, 400)
                n.start_soon(follow, a, doomed.id, "b")
                n.start_soon(follow, b, doomed.id, "a")
                await until(lambda: "a" in mids and "b" in mids)
                await trio.sleep(0.1 * rnd)  # at different points of the replies' batches
                n.start_soon(delete_on, a, doomed.id)
                n.start_soon(delete_on, b, doomed.id)
            assert not n.cancel_scope.cancelled_caught, "every subscription of the deleted session ended"
            assert a.hub.count() == b.hub.count() == 0
            assert a.es.broken is None and b.es.broken is None, "a conflict about one session failed a store"
            assert a.failure() is None and b.failure() is None
            assert ends.get(("other", other.id)) == "done", "the other session's reply went on to its end"
            await until(lambda: doomed.id not in a.registry and doomed.id not in b.registry)
            m = [x for x in (await b.load_session(other.id)).messages.values() if x.role == "assistant"]
            assert [x.status for x in m] == ["done"]


@pytest.mark.slow
async def test_a_worker_that_lost_the_quorum_exits_for_its_supervisor(tmp_path):
    """Item 8: a worker whose publishes went unanswered past its retry time
    stayed up broken, its replies held running on the stream. It now stops
    and exits 5 (the README's code for a failed store); restarted once the
    cluster is back (what systemd's Restart=on-failure does), the stream is
    whole: its reply swept `aborted` "worker restart" once, the session idle."""
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    [port] = _free_ports(1)
    w = Worker(cluster, tmp_path / "w", port, "QUORUM", "--agent-speed", "3", "--nats-retry-for", "2")
    paused: list[int] = []
    try:
        w.start()
        async with open_client("127.0.0.1", w.port, TOKEN, record=True) as a:
            replies = await _start_replies(a, 2)
            for i in (1, 2):  # two of three nodes: no quorum, every publish unanswered
                proc = cluster.procs[i]
                assert proc is not None
                os.kill(proc.pid, signal.SIGSTOP)
                paused.append(proc.pid)
            assert w.proc is not None
            code = await trio.to_thread.run_sync(lambda: w.proc.wait(120))  # type: ignore[union-attr]
        assert code == 5, w.proc.stderr.read() if w.proc.stderr else code
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        paused.clear()
        w.start()  # its supervisor's restart
        async with open_client("127.0.0.1", w.port, TOKEN, record=True) as b:
            for mid, sid in replies.items():
                await _follow(b, sid)
            with trio.fail_after(60):
                for mid, sid in replies.items():
                    await b.wait_done(sid, mid)
            with trio.fail_after(60):  # the sweep's idle flags
                while not all(r["status"] == "idle" for r in (await b.request("list_sessions"))["rows"]
                              if r["id"] in replies.values()):
                    await trio.sleep(0.1)
        truth = await _stream_truth(cluster, "QUORUM", set(replies.values()))
        ends = Counter(_check_stream(truth[sid])[mid][:2] for mid, sid in replies.items())
        assert ends == {("aborted", "worker restart"): 2}, ends
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
        w.stop()
        cluster.stop()


def _leaders_elected(cluster: NatsCluster, node: int, stream: str) -> bool:
    """The JetStream meta group and every stream of the cluster (the
    worker's, its lease and cache buckets) have a leader on a live node, as
    node `node`'s /jsz tells (a start while the meta leader is elected anew
    times out: its stream and account requests go unanswered)."""
    import json
    import urllib.request
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_ports[node]}/jsz?streams=true", timeout=2) as r:
            jsz = json.loads(r.read())
    except OSError:
        return False
    live = {f"n{i}" for i, p in enumerate(cluster.procs) if p is not None}
    streams = [s for a in jsz.get("account_details", []) for s in a.get("stream_detail", [])
               if s["name"].startswith(stream) or stream in s["name"]]
    meta = (jsz.get("meta_cluster") or {}).get("leader")
    return meta in live and bool(streams) and all((s.get("cluster") or {}).get("leader") in live for s in streams)


@pytest.mark.slow
async def test_a_worker_starts_with_one_node_of_three_down_and_waits_for_a_quorum(tmp_path):
    """Item 7: with the three documented --nats-monitor URLs, a start exited
    3 on the one node down, and with two down exited 1 with a traceback. A
    start needs a quorum of the monitors: with one down it serves (and says
    which does not answer); with two down it says it waits for a quorum and
    serves once one more node is up; a server that comes back unsynced
    stops it (exit 3)."""
    import threading
    cluster = NatsCluster(tmp_path / "nats")
    (tmp_path / "nats").mkdir()
    cluster.start()
    ports = _free_ports(2)
    one = Worker(cluster, tmp_path / "w1", ports[0], "MINORITY", "--agent-speed", "0")
    two = Worker(cluster, tmp_path / "w2", ports[1], "MINORITY", "--agent-speed", "0")
    try:
        one.start()  # the stream is made (its three copies placed) with every node up
        one.stop()
        cluster.kill(2)
        await _until(lambda: _leaders_elected(cluster, 0, "MINORITY"))  # (a start mid-election times out, exit 3)
        one.start()  # (returns once it serves)
        async with open_client("127.0.0.1", one.port, TOKEN) as a:
            ack = await a.request("chat", content="with one node down")
            await a.follow(ack["session_id"])
            with trio.fail_after(60):
                assert await a.wait_done(ack["session_id"], ack["reply_id"]) == "done"
        cluster.kill(1)
        starting = threading.Thread(target=two.start)
        starting.start()
        await _until(lambda: two.proc is not None)
        assert two.proc is not None and two.proc.stderr is not None
        line = await trio.to_thread.run_sync(two.proc.stderr.readline)
        assert "waiting for a quorum of the NATS servers: 1 of 3 answer, 2 needed" in line, line
        cluster.start(1)
        await trio.to_thread.run_sync(starting.join, 120)
        assert not starting.is_alive() and two.proc.poll() is None, "it serves once a quorum is up"
        async with open_client("127.0.0.1", two.port, TOKEN) as b:
            rows = (await b.request("list_sessions"))["rows"]
            assert ack["session_id"] in {r["id"] for r in rows}
        cluster.sync = ""  # node 2 comes back without sync_interval: always
        cluster.start(2)
        assert one.proc is not None
        code = await trio.to_thread.run_sync(lambda: one.proc.wait(60))  # type: ignore[union-attr]
        assert code == 3, code
        assert "does not fsync before it acknowledges" in (one.proc.stderr.read() if one.proc.stderr else "")
    finally:
        one.stop()
        two.stop()
        cluster.stop()


@pytest.mark.slow
async def test_a_second_turn_waits_for_the_running_reply_on_any_worker(pair):
    """Item 6: a second chat in a session while a reply ran there was
    accepted, on another worker too, and two replies streamed into one
    session, conflicting. A new turn (chat, retry) while any message of the
    session runs is refused `reply_running`, on the worker that streams it
    and on the others (which know it from the tail); once it ends, a turn
    is accepted anywhere."""
    from sessionlog_store.server.edge.client import ServerError
    one, two = pair
    one.start(), two.start()
    async with open_client("127.0.0.1", one.port, TOKEN) as a, open_client("127.0.0.1", two.port, TOKEN) as b:
        ack = await a.request("chat", content="a long story, please")
        sid, reply = ack["session_id"], ack["reply_id"]
        await _until(lambda: any(f["type"] == "session_created" and f["data"]["session"]["id"] == sid
                                 for f in b.pushes))
        await b.follow(sid)
        assert b.status[(sid, reply)] == "running"
        for c in (a, b):
            with pytest.raises(ServerError) as e:
                await c.request("chat", content="and another thing", session_id=sid)
            assert e.value.code == "reply_running"
        await b.request("stop", session_id=sid, msg_id=reply)
        with trio.fail_after(30):
            assert await b.wait_done(sid, reply) == "aborted"
        nxt = await b.request("chat", content="now a second turn", session_id=sid)
        await b.follow(sid)
        with pytest.raises(ServerError) as e:
            await a.request("retry", session_id=sid, msg_id=reply)
        assert e.value.code == "reply_running"
        await a.request("stop", session_id=sid, msg_id=nxt["reply_id"])
        with trio.fail_after(30):
            assert await b.wait_done(sid, nxt["reply_id"]) == "aborted"
        loaded = await b.request("load_session", session_id=sid)
        assert [m["status"] for m in loaded["messages"] if m["role"] == "assistant"] == ["aborted", "aborted"]
