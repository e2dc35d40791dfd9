"""The event log's contract (eventstore/backend.py) as one abstract suite:
a backend passes it by subclassing `EventLogContract` with an `open_log`
that opens a fresh, empty log of that backend. Today the local JSONL store
runs it in each sync mode; a second backend (issue 17) adds its subclass."""
from __future__ import annotations

import errno
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from sessionlog_store.eventstore import FileOps, StoreBroken, open_event_store
from sessionlog_store.eventstore.backend import EventLog
from sessionlog_store.eventstore.errors import SessionExists, UnknownSession
from sessionlog_store.eventstore.events import MessageProgress, SessionCreated, SessionDeleted, SessionRenamed


async def race(a, b, writer) -> None:  # type: ignore[no-untyped-def]
    """writer(a, "a") and writer(b, "b") at once: two workers' logs racing on
    one stream; neither breaks."""
    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            n.start_soon(writer, a, "a")
            n.start_soon(writer, b, "b")
    assert a.broken is None and b.broken is None


def born(sid: str) -> SessionCreated:
    return SessionCreated(session_id=sid, title="t")


class EventLogContract:
    """What every backend must do. Subclasses give `open_log(path, fs)`."""

    def open_log(self, path: str, fs: FileOps | None = None):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    async def test_create_gives_seqs_from_one_and_refuses_an_id_twice(self, tmp_path):
        async with self.open_log(str(tmp_path / "log")) as log:
            out = await log.create("s1", [born("s1"), SessionRenamed(title="a")])
            assert [a.record.seq for a in out] == [1, 2]
            assert "s1" in log and log.session_ids() == ["s1"]
            assert log.durable_seq("s1") == log.last_seq("s1") == 2
            with pytest.raises(SessionExists):
                await log.create("s1", [born("s1")])

    async def test_log_bytes_are_the_sessions_lines_as_its_log_file_holds_them(self, tmp_path):
        """What an export copies (a session's, a generic stream's): every
        record acknowledged, one checksummed line each, in seq order."""
        from sessionlog_store.eventstore.record import scan
        async with self.open_log(str(tmp_path / "log")) as log:
            await log.create("s1", [born("s1")])
            log.append_nowait("s1", SessionRenamed(title="a"))
            await log.append_many("s1", [SessionRenamed(title="b")])
            await log.flush("s1")
            data = await log.log_bytes("s1")
            got = scan("s1", data)
            assert got.corrupt is None and data.endswith(b"\n")
            assert [(r.seq, r.event) for r in got.records] == [
                (1, born("s1")), (2, SessionRenamed(title="a")), (3, SessionRenamed(title="b"))]

    async def test_appends_continue_the_seq_in_call_order_and_are_durable_on_return(self, tmp_path):
        async with self.open_log(str(tmp_path / "log")) as log:
            await log.create("s1", [born("s1")])
            await log.create("s2", [born("s2")])
            seen: list[tuple[str, int]] = []
            log.listeners.append(lambda sid, rec, end: seen.append((sid, rec.seq)))
            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(log.append_many, "s1" if i % 2 else "s2", [SessionRenamed(title=f"{i}")])
            assert log.durable_seq("s1") == log.durable_seq("s2") == 11
            for sid in ("s1", "s2"):
                assert [s for who, s in seen if who == sid] == list(range(2, 12)), "listeners see seq order"
                assert [r.seq for r in await log.read(sid)] == list(range(1, 12))
            assert [r.seq for r in await log.read("s1", after_seq=9)] == [10, 11]

    async def test_append_nowait_returns_at_once_and_becomes_durable(self, tmp_path):
        async with self.open_log(str(tmp_path / "log")) as log:
            await log.create("s1", [born("s1")])
            a = log.append_nowait("s1", MessageProgress(msg_id="m", content_delta="x"))
            assert a.record.seq == 2 and log.last_seq("s1") == 2
            await log.wait_durable("s1", 2)
            assert log.durable_seq("s1") >= 2
            got = await log.read("s1", after_seq=1)
            assert [type(r.event) for r in got] == [MessageProgress]

    async def test_a_removed_session_is_unknown(self, tmp_path):
        async with self.open_log(str(tmp_path / "log")) as log:
            await log.create("s1", [born("s1")])
            await log.append_many("s1", [SessionDeleted()])
            await log.remove("s1")
            assert "s1" not in log
            for call in (lambda: log.append_many("s1", [SessionRenamed(title="x")]), lambda: log.read("s1")):
                with pytest.raises(UnknownSession):
                    await call()
            with pytest.raises(UnknownSession):
                log.append_nowait("s1", SessionRenamed(title="x"))
            await log.create("s1", [born("s1")])  # the id is free again, from seq 1
            assert [r.seq for r in await log.read("s1")] == [1]

    async def test_a_failed_sync_is_fatal_and_told_once(self, tmp_path):
        class Failing(FileOps):
            armed = False

            def _maybe(self) -> None:
                if self.armed:
                    raise OSError(errno.EIO, "injected EIO")

            def fdatasync(self, fd: int) -> None:
                self._maybe()
                super().fdatasync(fd)

            def syncfs(self, fd: int) -> None:
                self._maybe()
                super().syncfs(fd)
        fs = Failing()
        with pytest.raises(BaseException):  # the store's block ends with the failure
            async with self.open_log(str(tmp_path / "log"), fs) as log:
                await self.writes_after_breaking_fail(log, lambda: setattr(fs, "armed", True))
                raise RuntimeError("done")  # leave the block (the committer's error joins it)

    async def writes_after_breaking_fail(self, log: EventLog, break_it) -> None:  # type: ignore[no-untyped-def]
        """After `break_it()` a write fails, every later one too, and the
        failure listeners are told once."""
        told: list[BaseException] = []
        log.failure_listeners.append(told.append)
        await log.create("s1", [born("s1")])
        break_it()
        with trio.fail_after(30):
            with pytest.raises(StoreBroken):
                await log.append_many("s1", [SessionRenamed(title="lost")])
        assert log.broken is not None
        with pytest.raises(StoreBroken):
            await log.append_many("s1", [SessionRenamed(title="after")])
        assert len(told) == 1


@pytest.mark.parametrize("mode", ["journal", "fdatasync", "syncfs"])
class TestLocalLog(EventLogContract):
    """The reference: per-session JSONL logs, in each sync mode."""

    @pytest.fixture(autouse=True)
    def _mode(self, mode: str) -> None:
        self.mode = mode

    @asynccontextmanager
    async def open_log(self, path: str, fs: FileOps | None = None) -> AsyncIterator[EventLog]:
        extra = {} if fs is None else {"fs": fs}
        async with open_event_store(path, sync_mode=self.mode, **extra) as store:  # type: ignore[arg-type]
            yield store


class TestJetStreamLog(EventLogContract):
    """The same contract on a real 3-node JetStream cluster (R3 streams): each
    test gets a stream of its own."""

    @pytest.fixture(autouse=True)
    def _cluster(self, request: pytest.FixtureRequest) -> None:
        if request.node.name.startswith("test_a_failed_sync"):
            return  # makes and breaks a cluster of its own
        self.cluster = request.getfixturevalue("nats_cluster")
        name = request.node.name.replace("test_", "")[:40].replace("_", "-")
        self.stream, self.prefix = "T" + name, "t." + name

    @asynccontextmanager
    async def open_log(self, path: str, fs: FileOps | None = None) -> AsyncIterator[EventLog]:
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        async with open_jetstream_log(self.cluster.urls, stream=self.stream, prefix=self.prefix, replicas=3,
                                      timeout=3) as log:
            yield log

    async def test_a_failed_sync_is_fatal_and_told_once(self, tmp_path):
        """Here a write fails when no node answers (every node killed) for
        longer than the log retries an unanswered publish."""
        pytest.importorskip("nats")
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log

        from .nats_cluster import NatsCluster
        cluster = NatsCluster(tmp_path)
        cluster.start()
        try:
            async with open_jetstream_log(cluster.urls, stream="BROKEN", timeout=2, retry_for=3) as log:
                await self.writes_after_breaking_fail(log, cluster.stop)
        finally:
            cluster.stop()

    def mirror(self, log):  # type: ignore[no-untyped-def]
        """What a projection of `log` holds: each session's records as the
        listeners and the reset listeners told them."""
        seen: dict[str, list[tuple[int, object]]] = {}
        log.listeners.append(lambda sid, rec, end: seen.setdefault(sid, []).append((rec.seq, rec.event)))

        def reset(sid, records, end):  # type: ignore[no-untyped-def]
            seen[sid] = [(r.seq, r.event) for r in records]
        log.reset_listeners.append(reset)
        return seen

    async def test_a_session_whose_appends_are_refused_fails_only_its_own_reads(self, tmp_path):
        """A session whose rebase failed refuses its appends (`_refuse`, forced
        here: provoking it takes a delete racing a conflict). A read of another
        session, and a store-wide flush (a stop's checkpoint), go on; a read
        of it says why."""
        async with self.open_log(str(tmp_path)) as log:
            for sid in ("a", "b"):
                await log.create(sid, [born(sid)])
            await log.append_many("a", [SessionRenamed(title="readable")])
            log.append_nowait("b", SessionRenamed(title="never durable"))
            log._refuse("b", UnknownSession("b"))  # type: ignore[attr-defined]
            with trio.fail_after(30):
                assert [r.event for r in await log.read("a")][1:] == [SessionRenamed(title="readable")]
                await log.flush()
                with pytest.raises(UnknownSession):
                    await log.read("b")


    async def test_two_writers_of_one_session_both_land_in_one_order(self, tmp_path):
        """Two workers (two logs on one stream) append to one session at
        once: the fence refuses one publish at a time, its writer reads the
        session again and puts its records after the other's. Every append
        returns durable; the stream holds all of them once, seqs 1..N; both
        projections end equal to it."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a, open_jetstream_log(self.cluster.urls, **kw) as b:
            seen = {"a": self.mirror(a), "b": self.mirror(b)}
            await a.create("s1", [born("s1")])
            with trio.fail_after(10):
                while "s1" not in b:
                    await trio.sleep(0.01)

            async def writer(log, name: str) -> None:  # type: ignore[no-untyped-def]
                for i in range(25):
                    if i % 3:
                        log.append_nowait("s1", MessageProgress(msg_id=name, content_delta=f"{i}"))
                    else:
                        await log.append_many("s1", [SessionRenamed(title=f"{name}{i}")])
                await log.flush()
            await race(a, b, writer)
            assert a.conflicts + b.conflicts > 0, "the writers never raced: the test proves nothing"
            stored = await a.read("s1")
            assert [r.seq for r in stored] == list(range(1, 52))
            for name in ("a", "b"):
                mine = [e for e in (r.event for r in stored) if getattr(e, "msg_id", None) == name
                        or getattr(e, "title", "").startswith(name)]
                assert len(mine) == 25, "each writer's records once, none lost"
            with trio.fail_after(10):
                while len(seen["a"]["s1"]) < 51 or len(seen["b"]["s1"]) < 51:
                    await trio.sleep(0.01)
            want = [(r.seq, r.event) for r in stored]
            assert seen["a"]["s1"] == want == seen["b"]["s1"]
            print(f"conflicts rebased: a {a.conflicts}, b {b.conflicts}")

    async def test_a_conflict_in_an_atomic_batch_rebases_that_session_only(self, tmp_path):
        """Two workers append to one shared session while each streams a
        session of its own: their batches are atomic batches of several
        sessions' messages (issue 29 item 4), which the fence on the shared
        one refuses whole. The refused batch's messages go out again one by
        one: the shared session is rebased as before, each own session's
        records are durable once, in order."""
        from sessionlog_store.eventstore.jetstream.natsio import publisher_of
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a, open_jetstream_log(self.cluster.urls, **kw) as b:
            assert a.batched and b.batched, "the stream was made taking atomic batches"
            reset: list[str] = []  # (sessions a conflict made a log fold again)
            for log in (a, b):
                log.reset_listeners.append(lambda sid, records, end: reset.append(sid))
            await a.create("s1", [born("s1")])
            for log, own in ((a, "own-a"), (b, "own-b")):
                await log.create(own, [born(own)])
            with trio.fail_after(10):
                while "s1" not in b:
                    await trio.sleep(0.01)

            async def writer(log, name: str) -> None:  # type: ignore[no-untyped-def]
                for i in range(25):
                    log.append_nowait(f"own-{name}", MessageProgress(msg_id=name, content_delta=f"{i}"))
                    await log.append_many("s1", [SessionRenamed(title=f"{name}{i}")])
                await log.flush()
            await race(a, b, writer)
            refused = sum(publisher_of(log.js).refused_batches for log in (a, b))
            assert a.conflicts + b.conflicts > 0 and refused > 0, "no batch met the fence: the test proves nothing"
            assert set(reset) == {"s1"}, "only the shared session was refused and rebased"
            stored = await a.read("s1")
            assert [r.seq for r in stored] == list(range(1, 52))
            for name in ("a", "b"):
                assert len([r for r in stored if r.event.title.startswith(name)]) == 25  # type: ignore[attr-defined]
                own = await a.read(f"own-{name}")
                assert [r.seq for r in own] == list(range(1, 27))
                assert [r.event.content_delta for r in own[1:]] == [f"{i}" for i in range(25)]  # type: ignore[attr-defined]
            print(f"conflicts rebased: a {a.conflicts}, b {b.conflicts}; atomic batches refused whole: {refused}")

    async def test_a_conflicts_rebase_holds_no_other_session_back(self, tmp_path):
        """Worker a appends to s1 before its tail has brought b's append
        (a tail that lags): the fence refuses it and a reads s1 again. That
        read is held here (a long session's, or one whose other write is
        not readable yet): meanwhile a's appends to another session are
        durable, and what a appends to s1 waits. Let go, s1 holds b's record
        and then a's two, in order, after one conflict."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a, open_jetstream_log(self.cluster.urls, **kw) as b:
            seen = self.mirror(a)
            for sid in ("s1", "s2"):
                await a.create(sid, [born(sid)])
            with trio.fail_after(10):
                while "s1" not in b:
                    await trio.sleep(0.01)
            held: list[tuple[str, bytes, int, bool]] = []  # a's tail's messages of s1, held back
            tailed, read = a._tailed, a._messages  # type: ignore[attr-defined]
            a._tailed = lambda subject, data, seq, own: (  # type: ignore[attr-defined]
                held.append((subject, data, seq, own)) if subject.endswith(".s1") else tailed(subject, data, seq, own))
            reading, let_go = trio.Event(), trio.Event()

            async def held_read(sid: str):  # type: ignore[no-untyped-def]
                if sid == "s1":
                    reading.set()
                    await let_go.wait()
                return await read(sid)
            a._messages = held_read  # type: ignore[attr-defined]
            batches: list[tuple[int, float]] = []  # (records, perf_counter() of the batch's first): the metric's
            a.batch_listeners.append(lambda records, opened, durable: batches.append((records, opened)))
            await b.append_many("s1", [SessionRenamed(title="b")])
            waits = []  # (a listener's wait for a record, made as it is told: as the store's publish of a finalize)
            a.listeners.append(lambda sid, rec, end: waits.append(a.wait_durable(sid, rec.seq)) if sid == "s1" else None)
            a.append_nowait("s1", SessionRenamed(title="a1"))  # fenced on s1's first message: refused
            appended_a1 = time.perf_counter()
            with trio.fail_after(30):
                await reading.wait()
                a.append_nowait("s1", SessionRenamed(title="a2"))  # (waits for the rebase)
                appending_s2, before = time.perf_counter(), len(batches)
                await a.append_many("s2", [SessionRenamed(title="meanwhile")])
            assert a.durable_seq("s2") == 2 and a.durable_seq("s1") == 1 and a.conflicts == 1
            assert all(opened >= appending_s2 for _, opened in batches[before:]), \
                "s2's batch was dated from before its record (the held lines')"
            let_go.set()
            before = len(batches)
            with trio.fail_after(30):
                await a.flush()
            assert [opened <= appended_a1 for records, opened in batches[before:] if records == 2] == [True], \
                "the rebased lines' batch was not dated from their first append"
            with trio.fail_after(30):
                assert [await w for w in waits] == [3, 4], "a wait made before the rebase gave the old seq"
            a._tailed = tailed  # type: ignore[attr-defined]
            for message in held:
                tailed(*message)
            stored = await b.read("s1")
            assert [(r.seq, r.event) for r in stored[1:]] == [
                (2, SessionRenamed(title="b")), (3, SessionRenamed(title="a1")), (4, SessionRenamed(title="a2"))]
            assert a.conflicts == 1, "a's lines appended during the rebase were published on a stale fence"
            assert seen["s1"] == [(r.seq, r.event) for r in stored]

    async def test_a_session_made_by_two_writers_at_once_is_one_writers(self, tmp_path):
        """Two workers create one id at once: one gets SessionExists and then
        knows the winner's session (and may append to it)."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a, open_jetstream_log(self.cluster.urls, **kw) as b:
            seen_b = self.mirror(b)
            results: dict[str, object] = {}

            async def make(log, name: str) -> None:  # type: ignore[no-untyped-def]
                try:
                    await log.create("s1", [SessionCreated(session_id="s1", title=name)])
                    results[name] = "made"
                except SessionExists as e:
                    results[name] = e
            async with trio.open_nursery() as n:
                n.start_soon(make, a, "a")
                n.start_soon(make, b, "b")
            winner = [k for k, v in results.items() if v == "made"]
            assert len(winner) == 1 and isinstance(results["b" if winner == ["a"] else "a"], SessionExists)
            stored = await a.read("s1")
            assert [(r.seq, r.event.title) for r in stored] == [(1, winner[0])]  # type: ignore[union-attr]
            loser = b if winner == ["a"] else a
            await loser.append_many("s1", [SessionRenamed(title="the loser continues")])
            assert [r.seq for r in await a.read("s1")] == [1, 2]
            if loser is b:
                assert [s for s, _ in seen_b["s1"]] == [1, 2]

    async def test_an_append_to_a_session_another_writer_deleted_is_unknown(self, tmp_path):
        """A deletes the session while B still appends: B's append that lost
        the race is UnknownSession, and B forgets the session."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a, open_jetstream_log(self.cluster.urls, **kw) as b:
            seen_b = self.mirror(b)
            await a.create("s1", [born("s1")])
            with trio.fail_after(10):
                while "s1" not in b:
                    await trio.sleep(0.01)
            await a.append_many("s1", [SessionDeleted()])
            await a.remove("s1")
            with trio.fail_after(10):
                with pytest.raises(UnknownSession):
                    for i in range(1000):  # until B has heard of the deletion or raced into it
                        await b.append_many("s1", [SessionRenamed(title=f"{i}")])
            assert "s1" not in b and b.broken is None
            # the projection ends without the session: reset to nothing, or its tombstone folded
            assert seen_b["s1"] == [] or isinstance(seen_b["s1"][-1][1], SessionDeleted), seen_b["s1"]

    async def test_a_worker_sees_and_continues_what_another_wrote(self, tmp_path):
        """Two workers on one stream: each one's records reach the other's
        listeners through its tail, in order, and either may append next."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        async with open_jetstream_log(self.cluster.urls, stream=self.stream, prefix=self.prefix, timeout=3) as a, \
                open_jetstream_log(self.cluster.urls, stream=self.stream, prefix=self.prefix, timeout=3) as b:
            seen: dict[str, list[tuple[str, int]]] = {"a": [], "b": []}
            a.listeners.append(lambda sid, rec, end: seen["a"].append((sid, rec.seq)))
            b.listeners.append(lambda sid, rec, end: seen["b"].append((sid, rec.seq)))
            await a.create("s1", [born("s1"), SessionRenamed(title="by a")])
            with trio.fail_after(10):
                while ("s1", 2) not in seen["b"]:
                    await trio.sleep(0.01)
            assert "s1" in b and b.last_seq("s1") == 2
            await b.append_many("s1", [SessionRenamed(title="by b")])  # b continues a's session
            with trio.fail_after(10):
                while ("s1", 3) not in seen["a"]:
                    await trio.sleep(0.01)
            await a.append_many("s1", [SessionRenamed(title="a again")])
            assert [r.seq for r in await a.read("s1")] == [1, 2, 3, 4]
            assert [getattr(r.event, "title", None) for r in await b.read("s1")][1:] == ["by a", "by b", "a again"]
            with trio.fail_after(10):
                while ("s1", 4) not in seen["b"]:
                    await trio.sleep(0.01)
            assert seen["a"] == [("s1", 1), ("s1", 2), ("s1", 3), ("s1", 4)] == seen["b"]

    async def test_a_new_log_replays_the_stream_before_it_starts(self, tmp_path):
        """A worker's start: every session on the stream, each record in
        order through the listeners, a removed session gone, and appends
        continue where the stream ends."""
        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
        kw = {"stream": self.stream, "prefix": self.prefix, "timeout": 3}
        async with open_jetstream_log(self.cluster.urls, **kw) as a:
            await a.create("s1", [born("s1"), SessionRenamed(title="one")])
            a.append_nowait("s1", MessageProgress(msg_id="m", content_delta="x"))
            await a.create("s2", [born("s2")])
            await a.append_many("s2", [SessionDeleted()])
            await a.remove("s2")
            await a.create("s3", [born("s3")])
        seen: list[tuple[str, int]] = []
        async with open_jetstream_log(self.cluster.urls, replay=True,
                                      listeners=[lambda sid, rec, end: seen.append((sid, rec.seq))], **kw) as b:
            assert sorted(b.session_ids()) == ["s1", "s3"]
            assert [s for sid, s in seen if sid == "s1"] == [1, 2, 3] and ("s2", 1) not in seen
            await b.append_many("s1", [SessionRenamed(title="after the start")])
            assert [r.seq for r in await b.read("s1")] == [1, 2, 3, 4]

    @pytest.mark.slow
    async def test_appends_continue_across_a_leader_kill_none_lost_or_doubled(self, tmp_path):
        """kill -9 of the stream's leader while 20 sessions append: the log
        is not broken (unanswered publishes are sent again with their ids),
        every acknowledged record is on the stream once, in seq order, and
        the longest wait is printed next to the election timeout."""
        import time

        from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log

        from .nats_cluster import NatsCluster
        cluster = NatsCluster(tmp_path)
        cluster.start()
        try:
            async with open_jetstream_log(cluster.urls, stream="LK", timeout=2) as log:
                sids = [f"s{i}" for i in range(20)]
                for sid in sids:
                    await log.create(sid, [born(sid)])
                acked = {sid: 1 for sid in sids}
                waits: list[float] = []

                async def writer(sid: str) -> None:
                    for i in range(30):
                        t0 = time.monotonic()
                        out = await log.append_many(sid, [SessionRenamed(title=f"{i}")])
                        waits.append(time.monotonic() - t0)
                        acked[sid] = out[-1].record.seq
                        await trio.sleep(0.01)

                async def killer() -> None:
                    while sum(acked.values()) < 200:
                        await trio.sleep(0.01)
                    leader = await log.bridge.run(lambda: log.js.stream_info("LK"))
                    cluster.kill(int(str(leader.cluster.leader).removeprefix("n")))
                with trio.fail_after(120):
                    async with trio.open_nursery() as n:
                        n.start_soon(killer)
                        for sid in sids:
                            n.start_soon(writer, sid)
                assert log.broken is None
                for sid in sids:
                    assert [r.seq for r in await log.read(sid)] == list(range(1, acked[sid] + 1)) == \
                        list(range(1, 32))
                print(f"longest append across the kill {max(waits):.1f} s, {log.retries} publishes sent again")
        finally:
            cluster.stop()
