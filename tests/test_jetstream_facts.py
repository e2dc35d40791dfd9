"""What a JetStream backend (issue 17) will rest on, checked against a real
3-node cluster (tests/nats_cluster.py): every node fsyncs before it acks;
`Nats-Expected-Last-Subject-Sequence` lets one of two writers of a session
win and tells the other; a repeated `Nats-Msg-Id` is stored once; killing
the stream leader loses no acknowledged record and a retry with the same id
is not stored twice. nats-py is asyncio-only: these tests run it with
asyncio.run (the backend will give it a thread and a loop of its own)."""
from __future__ import annotations

import asyncio
import time

import pytest

from sessionlog_store.eventstore.jetstream.natsio import until_led

from .nats_cluster import NatsCluster

nats = pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")

# JetStream's error codes for a failed expected-last-*-sequence check
# (JSStreamWrongLastSequenceErrF, and JSStreamWrongLastSequenceConstantErrF that 2.11+ answers)
WRONG_LAST_SEQUENCE = (10071, 10164)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """One cluster for the module (the leader-kill test, which leaves it two
    nodes, comes last); each test makes its stream afresh."""
    with NatsCluster(tmp_path_factory.mktemp("facts")) as c:
        yield c


async def _stream(cluster: NatsCluster, **config: object):  # type: ignore[no-untyped-def]
    nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    # (a generous answer time: these tests state what the server does, not
    # how fast; a first publish beside CPU hogs took over 5 s once)
    js = nc.jetstream(timeout=30)
    try:
        # (a short answer time here: before the meta leader is elected this
        # waits for none, and the first test paid the whole 30 s)
        await nc.jetstream(timeout=5).delete_stream("SL")  # (the module's previous test's)
    except Exception:  # noqa: BLE001 - none yet, or the meta leader not elected: made below
        pass
    await until_led(js, "SL", lambda: js.add_stream(name="SL", subjects=["sl.>"], num_replicas=3, **config))
    return nc, js


def test_every_node_syncs_before_it_acks(cluster):
    assert all(cluster.sync_always(i) for i in range(3))


def test_one_of_two_writers_of_a_session_wins_and_the_other_is_told(cluster):
    async def main() -> None:
        nc, js = await _stream(cluster)
        first = await js.publish("sl.s1", b"1", headers={"Nats-Expected-Last-Subject-Sequence": "0"})
        await js.publish("sl.s2", b"other session")  # another subject: s1's check is its own
        results = await asyncio.gather(*(js.publish("sl.s1", f"2-{w}".encode(),
                                                    headers={"Nats-Expected-Last-Subject-Sequence": str(first.seq)})
                                          for w in ("a", "b")), return_exceptions=True)
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1 and len(lost) == 1, results
        assert getattr(lost[0], "err_code", None) in WRONG_LAST_SEQUENCE, (lost[0], getattr(lost[0], "description", ""))
        last = await js.get_last_msg("SL", "sl.s1")
        assert last.seq == won[0].seq
        print(f"the loser was told: {getattr(lost[0], 'description', lost[0])}")
        await nc.close()
    asyncio.run(main())


def test_a_repeated_msg_id_is_stored_once(cluster):
    async def main() -> None:
        nc, js = await _stream(cluster)
        a = await js.publish("sl.s1", b"x", headers={"Nats-Msg-Id": "s1:1"})
        b = await js.publish("sl.s1", b"x", headers={"Nats-Msg-Id": "s1:1"})
        assert not a.duplicate and b.duplicate and a.seq == b.seq
        assert (await js.stream_info("SL")).state.messages == 1
        # the id is checked before the fence: a retry whose first try was stored
        # (its ack lost) is a duplicate ack, not a refusal for a stale fence
        fenced = {"Nats-Msg-Id": "s1:2", "Nats-Expected-Last-Subject-Sequence": str(a.seq)}
        c = await js.publish("sl.s1", b"y", headers=fenced)
        d = await js.publish("sl.s1", b"y", headers=fenced)
        assert not c.duplicate and d.duplicate and c.seq == d.seq
        assert (await js.stream_info("SL")).state.messages == 2
        await nc.close()
    asyncio.run(main())


def test_the_lean_publisher_answers_each_message_as_js_publish_would(cluster):
    """natsio.Publisher (issue 29 item 4: the worker's publishes, answered on
    one reply subscription) gives each message of a batch its own answer:
    the ack with its stream sequence, a duplicate's, a refused fence as the
    APIError the committer reads `err_code` from, and a subject no stream
    takes as NoStreamResponseError, which the log retries."""
    from sessionlog_store.eventstore.jetstream.natsio import publisher_of, unanswered

    async def main() -> None:
        nc, js = await _stream(cluster)
        pub = publisher_of(js)
        assert publisher_of(js) is pub
        first = await pub.publish_all([("sl.p1", b"1", {"Nats-Msg-Id": "p1:1"}),
                                       ("sl.p2", b"1", {"Nats-Expected-Last-Subject-Sequence": "0"})])
        assert [a.seq for a in first] == [1, 2] and not first[0].duplicate, first
        answers = await pub.publish_all([
            ("sl.p1", b"1", {"Nats-Msg-Id": "p1:1"}),                        # a retry of a stored one
            ("sl.p2", b"2", {"Nats-Expected-Last-Subject-Sequence": "1"}),    # a stale fence (its last is 2)
            ("other.subject", b"3", {}),                                       # no stream takes it
            ("sl.p2", b"4", {"Nats-Expected-Last-Subject-Sequence": "2"})])   # in order after the refused one
        dup, refused, nobody, ok = answers
        assert dup.duplicate and dup.seq == 1
        assert getattr(refused, "err_code", None) in WRONG_LAST_SEQUENCE, refused
        assert isinstance(nobody, nats.js.errors.NoStreamResponseError) and unanswered(nobody)
        assert ok.seq == 3 and not ok.duplicate
        assert (await js.stream_info("SL")).state.messages == 3
        await nc.close()
    asyncio.run(main())


def test_an_answer_without_a_stream_sequence_is_not_taken_for_a_stored_message():
    """Only a server's answer with a stream and a sequence acknowledges a
    message (a stray `{}` on the reply subject would otherwise mark a batch
    durable that nothing stored)."""
    from types import SimpleNamespace

    from sessionlog_store.eventstore.errors import StoreBroken
    from sessionlog_store.eventstore.jetstream.natsio import Publisher

    async def main() -> None:
        pub = Publisher(None, 1.0)
        pub._prefix = "_INBOX.x."
        loop = asyncio.get_running_loop()
        answers = [b"{}", b'{"stream":"SL"}', b'{"stream":"SL","seq":7,"duplicate":true}']
        futures = [loop.create_future() for _ in answers]
        for i, (data, fut) in enumerate(zip(answers, futures)):
            pub._waiting[str(i)] = fut
            await pub._on_answer(SimpleNamespace(subject=f"_INBOX.x.{i}", data=data, headers=None))
        assert all(isinstance(f.exception(), StoreBroken) for f in futures[:2])
        assert futures[2].result().seq == 7 and futures[2].result().duplicate
        assert not pub._waiting
    asyncio.run(main())


def test_atomic_batches_answer_each_message_as_one_by_one_publishes_would(cluster, monkeypatch):
    """Publisher.publish_batched (issue 29 item 4: a committer's messages in
    JetStream atomic batches, one answer a batch) gives each message the
    answer `publish_all` would: its own stream sequence, counted back from
    the batch's last; a retry of batches stored (their answers lost) a
    duplicate's ack at the same sequence, nothing stored twice; a stale
    fence in a batch refuses that message only, the rest stored (the batch
    refused whole, then published one by one); and on a stream that takes
    no atomic batches, each message stored as one by one."""
    from sessionlog_store.eventstore.jetstream import natsio
    monkeypatch.setattr(natsio, "ATOMIC_MAX", 3)  # (7 messages: batches of 3, 3 and 1)

    def messages(tag: str, fences: dict[int, int]) -> list[tuple[str, bytes, dict[str, str]]]:
        return [(f"sl.b{i}", f"{tag}{i}".encode(), {"Nats-Msg-Id": f"{tag}{i}",
                                                    "Nats-Expected-Last-Subject-Sequence": str(fences.get(i, 0))})
                for i in range(7)]

    async def main() -> None:
        nc, js = await _stream(cluster, allow_atomic=True)
        pub = natsio.publisher_of(js)
        first = await pub.publish_batched(messages("a", {}))
        assert [a.seq for a in first] == [1, 2, 3, 4, 5, 6, 7], first
        for i, ack in enumerate(first):
            assert (await js.get_msg("SL", ack.seq)).data == f"a{i}".encode()
        again = await pub.publish_batched(messages("a", {}))  # (a retry: the same ids and fences)
        assert [(a.seq, a.duplicate) for a in again] == [(i, True) for i in range(1, 8)], again
        fences = {i: i + 1 for i in range(7)}
        fences[4] = 1  # (b4's last is 5)
        answers = await pub.publish_batched(messages("b", fences))
        assert getattr(answers[4], "err_code", None) in WRONG_LAST_SEQUENCE, answers[4]
        stored = [a for i, a in enumerate(answers) if i != 4]
        assert all(not isinstance(a, BaseException) and not a.duplicate for a in stored), answers
        assert (await js.stream_info("SL")).state.messages == 13
        batch_marks = [(await js.get_msg("SL", seq)).headers["Nats-Batch-Sequence"] for seq in range(1, 8)]
        assert batch_marks == ["1", "2", "3", "1", "2", "3", "1"], batch_marks
        await nc.close()

        # A batch also ends at ATOMIC_MAX_BYTES (one is answered only once all of it is stored).
        monkeypatch.setattr(natsio, "ATOMIC_MAX_BYTES", 5)  # (2 bytes a message: 2 a batch)
        nc, js = await _stream(cluster, allow_atomic=True)
        assert [a.seq for a in await natsio.publisher_of(js).publish_batched(messages("d", {}))] == list(range(1, 8))
        batch_marks = [(await js.get_msg("SL", seq)).headers["Nats-Batch-Sequence"] for seq in range(1, 8)]
        assert batch_marks == ["1", "2", "1", "2", "1", "2", "1"], batch_marks
        await nc.close()
        monkeypatch.setattr(natsio, "ATOMIC_MAX_BYTES", 8 << 20)

        nc, js = await _stream(cluster)  # (no allow_atomic: refused as a batch, stored one by one)
        pub = natsio.publisher_of(js)
        answers = await pub.publish_batched(messages("c", {}))
        assert [a.seq for a in answers] == [1, 2, 3, 4, 5, 6, 7], answers
        assert (await js.stream_info("SL")).state.messages == 7
        assert pub.refused_batches == 3 and not pub.batching, "told once: no more batches tried on this stream"
        answers = await pub.publish_batched(messages("e", {i: i + 1 for i in range(7)}))
        assert [a.seq for a in answers] == list(range(8, 15)) and pub.refused_batches == 3
        await nc.close()
    asyncio.run(main())


def test_a_batch_over_the_servers_cap_is_refused_then_batches_are_halved(cluster, monkeypatch):
    """The servers cap an atomic batch (1,000 messages by default, 10199 over
    it): a larger one is published again one by one, and the publisher's
    next batches are half as large, then taken."""
    from sessionlog_store.eventstore.jetstream import natsio
    monkeypatch.setattr(natsio, "ATOMIC_MAX", 1500)

    async def main() -> None:
        nc, js = await _stream(cluster, allow_atomic=True)
        pub = natsio.publisher_of(js)
        first = [(f"sl.c{i}", b"x", {"Nats-Msg-Id": f"c{i}:1"}) for i in range(1200)]
        answers = await pub.publish_batched(first)
        assert [a.seq for a in answers] == list(range(1, 1201))
        assert pub.refused_batches == 1 and pub.chunk_max == 750 and pub.batching
        again = [(f"sl.c{i}", b"y", {"Nats-Msg-Id": f"c{i}:2"}) for i in range(1200)]
        answers = await pub.publish_batched(again)
        assert [a.seq for a in answers] == list(range(1201, 2401)) and pub.refused_batches == 1
        assert (await js.get_msg("SL", 1950)).headers["Nats-Batch-Sequence"] == "750"
        await nc.close()
    asyncio.run(main())


def test_a_worker_makes_its_stream_taking_atomic_batches_and_uses_an_older_one_as_it_is(cluster):
    """natsio.ensure_stream: a stream it makes takes atomic batches; one of
    a worker's made before they were (same subjects, copies and duplicate
    window, no allow_atomic) is used as it is, its messages one by one; a
    stream of that name with another config is refused, saying so."""
    from sessionlog_store.eventstore.errors import StoreBroken
    from sessionlog_store.eventstore.jetstream.natsio import DUPLICATE_WINDOW, ensure_stream

    async def main() -> None:
        nc, js = await _stream(cluster, duplicate_window=DUPLICATE_WINDOW)  # (as an older worker made it)
        assert await ensure_stream(js, "SL", "sl", 3, create=True) is False
        assert await ensure_stream(js, "SL", "sl", 3, create=False) is False
        with pytest.raises(StoreBroken, match=r"another config .*: copies 3 \(a worker's: 1\)"):
            await ensure_stream(js, "SL", "sl", 1, create=True)  # (one copy: not the stream there)
        await js.delete_stream("SL")
        assert await ensure_stream(js, "SL", "sl", 3, create=True) is True
        assert (await js.stream_info("SL")).config.allow_atomic
        assert await ensure_stream(js, "SL", "sl", 3, create=True) is True  # (made again: the same)
        await nc.close()
    asyncio.run(main())


def test_the_tail_reads_a_stream_sequence_as_nats_py_does(cluster):
    """tail.stream_seq reads a delivered message's stream sequence from its
    ack subject (nats-py's `metadata` decodes all of it: issue 29 item 4):
    on real deliveries it agrees with nats-py, and on the newer subject form
    (a domain and an account hash after $JS.ACK) too."""
    from nats.aio.msg import Msg

    from sessionlog_store.eventstore.jetstream.tail import stream_seq

    async def main() -> None:
        nc, js = await _stream(cluster)
        for i in range(5):
            await js.publish(f"sl.t{i % 2}", b"x")
        sub = await js.subscribe("sl.>", stream="SL", ordered_consumer=True)
        got = [await sub.next_msg(30) for _ in range(5)]
        assert [stream_seq(m) for m in got] == [m.metadata.sequence.stream for m in got] == [1, 2, 3, 4, 5]
        await nc.close()
    asyncio.run(main())
    for reply in ("$JS.ACK.SL.cons.1.42.7.1700000000000000000.0",
                  "$JS.ACK.dom.ACCHASH.SL.cons.1.42.7.1700000000000000000.0.tok"):
        msg = Msg(_client=None, subject="sl.t", reply=reply)  # type: ignore[arg-type]
        assert stream_seq(msg) == msg.metadata.sequence.stream == 42


@pytest.mark.slow
def test_killing_the_stream_leader_loses_no_acked_record(cluster):
    async def main() -> tuple[int, float]:
        nc, js = await _stream(cluster)
        leader = (await js.stream_info("SL")).cluster.leader
        acked: set[str] = set()
        stalls: list[float] = []

        async def writer(w: int) -> None:
            for i in range(40):
                mid = f"w{w}:{i}"
                t0 = time.monotonic()
                while True:  # retried with the same id until acked: stored once whatever happened
                    try:
                        await js.publish(f"sl.w{w}", mid.encode(), headers={"Nats-Msg-Id": mid}, timeout=2)
                        break
                    except Exception:
                        if time.monotonic() - t0 > 60:
                            raise
                        await asyncio.sleep(0.1)
                stalls.append(time.monotonic() - t0)
                acked.add(mid)

        async def killer() -> None:
            while len(acked) < 100:
                await asyncio.sleep(0.01)
            cluster.kill(int(str(leader).removeprefix("n")))
        await asyncio.gather(*(writer(w) for w in range(10)), killer())
        info = await js.stream_info("SL")
        assert info.state.messages == len(acked) == 400, (info.state.messages, len(acked))
        assert info.cluster.leader != leader
        await nc.close()
        return len(acked), max(stalls)
    n, stall = asyncio.run(main())
    print(f"{n} records acked across a leader kill; the longest write waited {stall:.1f} s")


@pytest.mark.slow
def test_a_publish_the_dead_leader_owed_an_answer_is_sent_again_at_the_election(tmp_path):
    """A record whose publish reached the stream's leader just before it died
    waits for an answer that will never come. The log sends it again (same
    id: stored once) as soon as the servers announce the new leader
    (`$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED`), not after the answer's
    whole timeout: the write stall of a leader's loss is the election's
    (issue 29 item 4; bench scaleout's fault run measured 10 s and more).
    The leader is paused first, so that the publish surely waits on it; the
    log is connected to the two other nodes only."""
    import os
    import signal

    import trio

    from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
    from sessionlog_store.eventstore.jetstream.natsio import publisher_of
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log

    with NatsCluster(tmp_path) as cl:
        async def leader_of(log) -> int:  # type: ignore[no-untyped-def]
            info = await log.bridge.run(lambda: log.js.stream_info("EL"))
            return int(str(info.cluster.leader).removeprefix("n"))

        async def main() -> None:
            kw = {"stream": "EL", "prefix": "sl.el", "timeout": 3.0}
            async with open_jetstream_log(cl.urls, **kw) as first:  # (makes the stream, finds its leader)
                await first.create("s1", [SessionCreated(session_id="s1", created_at=1.0)])
                leader = await leader_of(first)
            others = [url for i, url in enumerate(cl.urls) if i != leader]
            # An answer's timeout far longer than any election: only the advisory can end the wait in time.
            async with open_jetstream_log(others, **{**kw, "timeout": 600.0}, retry_for=600.0, replay=True) as log:
                assert "s1" in log
                pub = publisher_of(log.js)
                os.kill(cl.procs[leader].pid, signal.SIGSTOP)  # type: ignore[union-attr]
                try:
                    async with trio.open_nursery() as nursery:
                        done = trio.Event()

                        async def write() -> None:
                            await log.append_many("s1", [SessionRenamed(title="after the election")])
                            done.set()
                        nursery.start_soon(write)
                        with trio.fail_after(60):  # (the publish is out, waiting on the paused leader)
                            while not await log.bridge.run(lambda: asyncio.sleep(0, len(pub._waiting))):
                                await trio.sleep(0.01)
                        cl.kill(leader)  # (SIGKILL a paused process: it dies)
                        with trio.fail_after(90):
                            await done.wait()
                finally:
                    if cl.procs[leader] is not None:
                        os.kill(cl.procs[leader].pid, signal.SIGCONT)  # type: ignore[union-attr]
                assert log.retries >= 1, "sent again"
                records = await log.read("s1")
                assert [r.event for r in records[1:]] == [SessionRenamed(title="after the election")]
        trio.run(main)
