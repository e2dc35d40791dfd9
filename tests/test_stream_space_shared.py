"""The generic namespace on the JetStream backend (issue 27 item 2): two
workers share every stream (server/scaleout/streamspace.py), on a real
3-node cluster. A stream made on one is served by the other; an append on
one wakes the other's live reader; both writing one stream end with one
history; a producer's retry through the other worker is a duplicate and an
append after the other's close is refused, also when that worker had not
seen the other's record yet (its tail held: the conflict path); two making
one name at once make one stream; a delete on one is seen on the other; a
read on one slides the TTL for the other."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from sessionlog_store.projections.dstream import Refused, stream_log_id
from sessionlog_store.server.config import StoreConfig

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")

OWNER = "u1"


@asynccontextmanager
async def space(cluster, stream: str):  # type: ignore[no-untyped-def]
    from sessionlog_store.server.scaleout.streamspace import open_shared_stream_space
    async with open_shared_stream_space(StoreConfig(backend=tuple(cluster.urls), stream=stream)) as sp:
        yield sp


async def until(pred, within: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within):
        while not pred():
            await trio.sleep(0.01)


async def make(sp: Any, name: str, ctype: str = "text/plain", **kw: Any) -> Any:
    args = {"content_type": ctype, "ttl": None, "expires_at": None, "closed": False, "data": b"", **kw}
    return await sp.create(OWNER, name, **args)


async def append(sp: Any, name: str, body: bytes, *, producer: tuple[str, int, int] | None = None,
                 close: bool = False) -> Any:
    st = sp.find(OWNER, name)
    return await sp.append(st, body, content_type="text/plain" if body else None, close=close,
                           producer=producer, stream_seq=None)


def units(sp: Any, name: str) -> list[bytes]:
    st = sp.streams[(OWNER, name)]
    return st.units[:st.durable]


def hold_tail(sp: Any, *, position: bool = False) -> list[tuple[Any, ...]]:
    """Hold the worker's tail (what other workers append reaches it only
    when the list is handed back): a window widened on purpose. With
    `position`, its place is held too (a catch-up waits for the release)."""
    held: list[tuple[Any, ...]] = []
    attr = "_delivered" if position else "_deliver"
    real = getattr(sp.es.tail, attr)

    def tailed(*args: Any) -> None:
        if sp.held:
            held.append(args)
        else:
            real(*args)
    sp.held = True
    setattr(sp.es.tail, attr, tailed)

    def release() -> None:
        sp.held = False
        for args in held:
            real(*args)
    sp.release = release
    return held


async def test_a_stream_made_on_one_worker_is_served_live_by_the_other(nats_cluster):
    async with space(nats_cluster, "DSS1") as a, space(nats_cluster, "DSS1") as b:
        st_a, made = await make(a, "notes", data=b"one ")
        assert made
        await until(lambda: (OWNER, "notes") in b.streams)
        st_b = b.find(OWNER, "notes")
        assert st_b.log_id == st_a.log_id and units(b, "notes") == [b"one "]
        woken = b.changed(st_b)
        await append(a, "notes", b"two")
        with trio.fail_after(30):
            await woken.wait()  # (a live reader on b)
        assert units(b, "notes") == units(a, "notes") == [b"one ", b"two"]
        assert st_b.visible_tail == st_a.visible_tail


async def test_two_workers_writing_one_stream_end_with_one_history(nats_cluster):
    async with space(nats_cluster, "DSS2") as a, space(nats_cluster, "DSS2") as b:
        await make(a, "log")
        await until(lambda: (OWNER, "log") in b.streams)

        async def write(sp: Any, tag: str) -> None:
            for i in range(30):
                await append(sp, "log", f"{tag}{i};".encode())
        async with trio.open_nursery() as n:
            n.start_soon(write, a, "a")
            n.start_soon(write, b, "b")
        await until(lambda: len(units(a, "log")) == len(units(b, "log")) == 60)
        assert units(a, "log") == units(b, "log")
        got = units(a, "log")
        assert sorted(got) == sorted([f"a{i};".encode() for i in range(30)] + [f"b{i};".encode() for i in range(30)])
        assert [u for u in got if u.startswith(b"a")] == [f"a{i};".encode() for i in range(30)], "each in its order"
        records = await a.es.read(a.streams[(OWNER, "log")].log_id)
        assert len([r for r in records if getattr(r.event, "data", b"")]) == 60, "each append stored once"


async def test_a_producer_retry_through_the_other_worker_is_a_duplicate_even_unseen(nats_cluster):
    async with space(nats_cluster, "DSS3") as a, space(nats_cluster, "DSS3") as b:
        await make(a, "p")
        await until(lambda: (OWNER, "p") in b.streams)
        hold_tail(b)  # b does not see a's append before its own
        first = await append(a, "p", b"once", producer=("w", 0, 0))
        assert first.status == 200
        again = await append(b, "p", b"once", producer=("w", 0, 0))
        assert again.status == 204, "a duplicate"
        assert units(b, "p") == [b"once"] and b.es.conflicts >= 1
        # an append after the other worker's close is refused, not written past it
        await append(a, "p", b"", close=True)
        with pytest.raises(Refused) as refused:
            await append(b, "p", b"late")
        assert refused.value.code == "stream_closed"
        b.release()
        await until(lambda: b.streams[(OWNER, "p")].ended)
        assert units(a, "p") == units(b, "p") == [b"once"]


async def test_two_workers_making_one_name_at_once_make_one_stream(nats_cluster):
    async with space(nats_cluster, "DSS4") as a, space(nats_cluster, "DSS4") as b:
        hold_tail(a)
        hold_tail(b)
        got: dict[str, Any] = {}

        async def create(sp: Any, tag: str, ctype: str) -> None:
            try:
                got[tag] = (await make(sp, "same", ctype))[1]
            except Refused as e:
                got[tag] = e.code
        async with trio.open_nursery() as n:
            n.start_soon(create, a, "a", "text/plain")
            n.start_soon(create, b, "b", "application/json")
        assert sorted(map(str, got.values())) == ["True", "stream_exists"], got
        a.release()
        b.release()
        winner = a if got["a"] is True else b
        loser = b if winner is a else a
        assert loser.streams[(OWNER, "same")].content_type == winner.streams[(OWNER, "same")].content_type
        # and the same configuration made on both is one stream, found
        hold_tail(a)
        hold_tail(b)
        async with trio.open_nursery() as n:
            n.start_soon(create, a, "a", "text/plain")
            n.start_soon(create, b, "b", "text/plain")
        a.release()
        b.release()
        plain = winner.streams[(OWNER, "same")].content_type == "text/plain"
        assert got == ({"a": False, "b": False} if plain else {"a": "stream_exists", "b": "stream_exists"}), got


async def test_a_delete_on_one_worker_is_seen_on_the_other(nats_cluster):
    async with space(nats_cluster, "DSS5") as a, space(nats_cluster, "DSS5") as b:
        await make(a, "gone", data=b"x")
        await until(lambda: (OWNER, "gone") in b.streams)
        st_b = b.find(OWNER, "gone")
        woken = b.changed(st_b)
        await a.delete(OWNER, "gone")
        with trio.fail_after(30):
            await woken.wait()
        with pytest.raises(Refused) as refused:
            b.find(OWNER, "gone")
        assert refused.value.status == 404
        _, made = await make(b, "gone", data=b"again")  # the name is free on every worker
        assert made
        await until(lambda: (OWNER, "gone") in a.streams)
        assert units(a, "gone") == [b"again"]


async def test_a_read_on_one_worker_slides_the_ttl_for_the_other(nats_cluster):
    async with space(nats_cluster, "DSS6") as a, space(nats_cluster, "DSS6") as b:
        st, _ = await make(a, "ttl", ttl=4)
        await until(lambda: (OWNER, "ttl") in b.streams)
        log_id = st.log_id
        seen = a._shared_access[log_id]
        b._shared_access[log_id] -= 2  # (b's last touch as if 2 s ago: a read now is one past a quarter)
        b.find(OWNER, "ttl")  # a read on b
        await until(lambda: a._shared_access.get(log_id, 0.0) > seen)  # its touch reached a
        assert a._access[log_id] >= b._access[log_id] - 1


def test_workers_in_processes_a_sigkill_and_a_pause(nats_cluster, tmp_path):
    """Two `serve` processes on one stream, over HTTP: a producer alternating
    between them reads its own writes through either; after one is
    SIGKILLed, its last acknowledged append is the other's duplicate and
    everything acknowledged reads back whole; a worker paused (SIGSTOP)
    while the other appends and closes answers from the log as it now
    stands once resumed (SIGCONT): the append, the closure, a refusal of
    what follows."""
    import os
    import signal

    from .nats_cluster import _free_ports
    from .test_scaleout import TOKEN, Worker
    from .test_stream_space import call

    def http(port: int, method: str, path: str, body: bytes = b"",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return call(port, method, path, body, headers, token=TOKEN)
    one, two = (Worker(nats_cluster, tmp_path / f"w{i}", port, "DSSP") for i, port in enumerate(_free_ports(2)))
    try:
        one.start()
        two.start()
        text = {"Content-Type": "text/plain"}
        assert http(one.port, "PUT", "/v1/stream/p", b"", text)[0] == 201
        assert http(two.port, "PUT", "/v1/stream/p", b"", text)[0] == 200, "the same stream, found"
        for i in range(10):
            port = (one.port, two.port)[i % 2]
            status, _, _ = http(port, "POST", "/v1/stream/p", f"{i};".encode(),
                                {**text, "Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": str(i)})
            assert status == 200, (i, status)
            status, _, body = http((two.port, one.port)[i % 2], "GET", "/v1/stream/p?offset=-1")
            assert body.endswith(f"{i};".encode()), (i, body)  # read through the other worker
        one.kill()  # (its last acknowledged append: the 9th, through two; the 8th through one)
        status, _, _ = http(two.port, "POST", "/v1/stream/p", b"8;",
                            {**text, "Producer-Id": "w", "Producer-Epoch": "0", "Producer-Seq": "8"})
        assert status == 204, "a retry through the other worker is a duplicate"
        whole = b"".join(f"{i};".encode() for i in range(10))
        assert http(two.port, "GET", "/v1/stream/p?offset=-1")[2] == whole
        one.start()
        assert one.proc is not None
        os.kill(one.proc.pid, signal.SIGSTOP)
        try:
            assert http(two.port, "POST", "/v1/stream/p", b"last", {**text, "Stream-Closed": "true"})[0] == 204
        finally:
            os.kill(one.proc.pid, signal.SIGCONT)
        status, headers, body = http(one.port, "GET", "/v1/stream/p?offset=-1")
        assert body == whole + b"last" and headers.get("stream-closed") == "true", (body, headers)
        assert http(one.port, "POST", "/v1/stream/p", b"more", text)[0] == 409
    finally:
        one.stop()
        two.stop()


async def test_a_delete_racing_the_other_workers_append_removes_the_stream_everywhere(nats_cluster):
    """The deleting worker had not seen the other's append: its tombstone is
    refused for it, and tried again; the stream must not come back there
    (the refusal's refold once made it a stream served from a removed log)."""
    async with space(nats_cluster, "DSS7") as a, space(nats_cluster, "DSS7") as b:
        await make(a, "s", data=b"x")
        await until(lambda: (OWNER, "s") in b.streams)
        hold_tail(a)
        await append(b, "s", b"y")
        await a.delete(OWNER, "s")
        a.release()
        await until(lambda: (OWNER, "s") not in b.streams)
        await until(lambda: not a._doomed)
        assert (OWNER, "s") not in a.streams and a._count.get(OWNER, 0) == 0 and a.es.conflicts >= 1
        _, made = await make(a, "s", data=b"new")
        assert made
        await until(lambda: (OWNER, "s") in b.streams)
        assert units(b, "s") == [b"new"]


async def test_a_name_whose_deleter_died_before_purging_is_free(nats_cluster):
    """A worker that appended a stream's tombstone and died before purging
    its log (SIGKILL between the two) leaves the log ending with the
    tombstone: a creation of the name on any worker purges it and makes
    the stream (it was refused `busy` for good)."""
    from sessionlog_store.eventstore.events import SessionDeleted
    async with space(nats_cluster, "DSS8") as a, space(nats_cluster, "DSS8") as b:
        st, _ = await make(a, "n", data=b"x")
        await until(lambda: (OWNER, "n") in b.streams)
        await a.es.append_many(st.log_id, [SessionDeleted()])  # (the tombstone, and no purge: a died here)
        await until(lambda: (OWNER, "n") not in b.streams)
        _, made = await make(b, "n", data=b"again")
        assert made and units(b, "n") == [b"again"]
        await until(lambda: (OWNER, "n") in a.streams and units(a, "n") == [b"again"])


async def test_a_closed_streams_reads_on_one_worker_keep_it_alive_on_the_other(nats_cluster):
    async with space(nats_cluster, "DSS9") as a, space(nats_cluster, "DSS9") as b:
        st, _ = await make(a, "c", ttl=4, closed=True, data=b"done")
        await until(lambda: (OWNER, "c") in b.streams)
        seen = a._shared_access[st.log_id]
        b._shared_access[st.log_id] -= 2
        b.find(OWNER, "c")
        await until(lambda: a._shared_access.get(st.log_id, 0.0) > seen)  # the touch of a closed stream
        assert a.streams[(OWNER, "c")].closed and units(a, "c") == [b"done"]


async def test_a_soft_delete_racing_the_last_forks_delete_elsewhere_frees_the_name(nats_cluster):
    """A soft-deletes a source a fork reads while B, not knowing, deletes the
    fork: the source must still go (its log was left forever, its name
    refused on every worker)."""
    async with space(nats_cluster, "DSS10") as a, space(nats_cluster, "DSS10") as b:
        await make(a, "S", data=b"abc")
        await make(a, "F", forked_from="S")
        await until(lambda: (OWNER, "F") in b.streams)
        hold_tail(b)
        await a.delete(OWNER, "S")  # soft: F reads it
        await b.delete(OWNER, "F")  # B thinks S is live
        b.release()
        await until(lambda: (OWNER, "S") not in a.streams and (OWNER, "S") not in b.streams)
        await until(lambda: not a._doomed and not b._doomed and not a._unread and not b._unread)
        assert not list(a.es.session_ids()), "every log removed"
        _, made = await make(b, "S", data=b"new")
        assert made


async def test_a_stream_made_again_as_a_fork_elsewhere_is_folded_as_the_new_one(nats_cluster):
    """B appends to a stream that A deleted and made again as a fork (B saw
    neither): B's append is refused, and B folds the new stream, its
    source's data inherited (it was folded into the old one's state)."""
    async with space(nats_cluster, "DSS11") as a, space(nats_cluster, "DSS11") as b:
        await make(a, "src", data=b"from the source")
        await make(a, "x", data=b"old")
        await until(lambda: (OWNER, "x") in b.streams and (OWNER, "src") in b.streams)
        hold_tail(b)
        await a.delete(OWNER, "x")
        await make(a, "x", forked_from="src")
        with pytest.raises(Refused) as refused:
            await append(b, "x", b"stale")
        assert refused.value.status == 404
        assert (OWNER, "x") not in b.streams, "a fork is served once its link is seen"
        b.release()
        await until(lambda: (OWNER, "x") in b.streams)
        assert units(b, "x") == units(a, "x") == [b"from the source"]
        await append(b, "x", b"+new")
        await until(lambda: units(a, "x") == [b"from the source", b"+new"])


async def test_a_fork_made_while_the_other_worker_deletes_its_source_keeps_it(nats_cluster):
    """A makes a fork of a stream that B, not seeing the fork, deletes: the
    fork holds (its link, a fenced touch of the source, came first), B's
    soft delete is refused for it and made again, and B's removal waits
    until it has caught up, so the fork is known and keeps its source,
    soft-deleted, on both. (B once removed the source: the fork was served
    by A only, its log leaked, its name refused elsewhere.)"""
    async with space(nats_cluster, "DSS12") as a, space(nats_cluster, "DSS12") as b:
        await make(a, "src", data=b"abc")
        await until(lambda: (OWNER, "src") in b.streams)
        hold_tail(b, position=True)
        conflicts = b.es.conflicts
        _, made = await make(a, "fork", forked_from="src")
        assert made
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.delete, OWNER, "src")
            await until(lambda: b.es.conflicts > conflicts)  # (its soft delete refused for the link)
            b.release()
        for sp in (a, b):
            await until(lambda: (OWNER, "fork") in sp.streams and sp.streams[(OWNER, "src")].soft_deleted)
            assert sp.streams[(OWNER, "src")].refcount == 1 and units(sp, "fork") == [b"abc"]
            with pytest.raises(Refused) as gone:
                sp.find(OWNER, "src")
            assert gone.value.status == 410
        await b.delete(OWNER, "fork")  # (the last fork: its source goes with it, everywhere)
        for sp in (a, b):
            await until(lambda: (OWNER, "src") not in sp.streams and not sp._unread and not sp._doomed)
        try:  # (every log removed)
            await until(lambda: not list(a.es.session_ids()) and not list(b.es.session_ids()))
        except trio.TooSlowError:  # (once, beside two CPU hogs: say what was left, and where)
            left = {w: (sorted(sp.es.session_ids()), sorted(sp._doomed), sorted(sp._unread), sorted(sp.logs))
                    for w, sp in (("a", a), ("b", b))}
            raise AssertionError(f"logs left (logs, doomed, unread, known): {left}") from None
        _, made = await make(a, "src", data=b"new")
        assert made


async def test_a_fork_whose_source_the_other_worker_deleted_first_is_refused_and_removed(nats_cluster):
    """A, not seeing B's delete, makes a fork of the deleted stream: its
    link is refused (the source's log ends with its removal), so the fork
    is removed and A answers 404; the fork's name is free on both."""
    async with space(nats_cluster, "DSS13") as a, space(nats_cluster, "DSS13") as b:
        await make(a, "src", data=b"abc")
        await until(lambda: (OWNER, "src") in b.streams)
        hold_tail(a)
        await b.delete(OWNER, "src")
        with pytest.raises(Refused) as refused:
            await make(a, "fork", forked_from="src")
        assert refused.value.status == 404, refused.value
        a.release()
        for sp in (a, b):
            await until(lambda: (OWNER, "fork") not in sp.streams and (OWNER, "src") not in sp.streams
                        and not sp._doomed and not sp._unread)
        await until(lambda: not list(a.es.session_ids()) and not list(b.es.session_ids()))
        _, made = await make(b, "fork", data=b"mine")
        assert made
        await until(lambda: (OWNER, "fork") in a.streams and units(a, "fork") == [b"mine"])


async def test_a_refused_fork_of_a_name_made_again_leaves_the_new_streams_forks_counted(nats_cluster):
    """A, behind, forks S after B deleted S and made the name again: the
    fork is refused, and its removal must not count against the new S
    (the same log id): a later fork of the new S keeps it when S is
    deleted, on every worker and on one started afterwards."""
    async with space(nats_cluster, "DSS14") as a, space(nats_cluster, "DSS14") as b:
        await make(a, "S", data=b"old")
        await until(lambda: (OWNER, "S") in b.streams)
        hold_tail(a)
        await b.delete(OWNER, "S")
        await make(b, "S", data=b"new")
        with pytest.raises(Refused) as refused:
            await make(a, "F", forked_from="S")
        assert refused.value.status == 404
        a.release()
        await until(lambda: (OWNER, "S") in a.streams and units(a, "S") == [b"new"])
        assert a.streams[(OWNER, "S")].refcount == 0
        await make(a, "G", forked_from="S")
        await until(lambda: (OWNER, "G") in b.streams)
        await a.delete(OWNER, "S")  # (soft: G reads it)
        for sp in (a, b):
            await until(lambda: sp.streams[(OWNER, "S")].soft_deleted)
            assert sp.streams[(OWNER, "S")].refcount == 1 and units(sp, "G") == [b"new"]
        async with space(nats_cluster, "DSS14") as d:
            assert units(d, "G") == [b"new"] and d.streams[(OWNER, "S")].refcount == 1


async def test_an_orphans_removal_racing_the_names_new_stream_folds_the_new_one(nats_cluster):
    """C sees A's refused fork F (its source gone) and dooms it; B makes the
    name F again before C's tombstone: C's tombstone is refused, and C must
    fold the new F (it once served it nowhere and refused the name)."""
    async with space(nats_cluster, "DSS15") as a, space(nats_cluster, "DSS15") as b, \
            space(nats_cluster, "DSS15") as c:
        await make(a, "S", data=b"abc")
        await until(lambda: (OWNER, "S") in b.streams and (OWNER, "S") in c.streams)
        real = c.es.tail._deliver
        held = hold_tail(c)
        hold_tail(a)
        await b.delete(OWNER, "S")
        with pytest.raises(Refused):
            await make(a, "F", forked_from="S")
        a.release()
        await make(b, "F", data=b"mine")
        f_log = b.streams[(OWNER, "F")].log_id
        k = next(i for i, args in enumerate(held) if args[0].endswith(f_log)) + 1
        for args in held[:k]:  # (up to the refused fork's creation: an orphan there)
            real(*args)
        assert f_log in c._doomed
        await until(lambda: f_log not in c._doomed)  # (its tombstone refused: the new F folded)
        c.held = False
        for args in held[k:]:
            real(*args)
        await until(lambda: (OWNER, "F") in c.streams and units(c, "F") == [b"mine"])
        assert units(a, "F") == [b"mine"]


async def test_a_fork_not_linked_yet_is_served_nowhere_and_goes_whole_when_refused(nats_cluster):
    """A makes fork F of S and pauses before its link. Meanwhile the other
    workers neither serve F (no read, no append, no fork of it: each would
    be lost with F) nor free S: C's delete of S keeps it (soft: F counts).
    A's link is then refused: F is removed everywhere, and S with it. (F
    was served before its link: a fork of it and an append to it, both
    acknowledged, were lost.)"""
    async with space(nats_cluster, "DSS16") as a, space(nats_cluster, "DSS16") as b, \
            space(nats_cluster, "DSS16") as c:
        await make(a, "S", data=b"abc")
        await until(lambda: (OWNER, "S") in b.streams and (OWNER, "S") in c.streams)
        gate = trio.Event()
        made = a._fork_made

        async def paused(fork: Any, source: Any) -> None:
            await gate.wait()  # (a pause between F's creation and its link)
            await made(fork, source)
        a._fork_made = paused

        async def fork_f() -> None:
            with pytest.raises(Refused) as refused:
                await make(a, "F", forked_from="S")
            assert refused.value.status == 409
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fork_f)
            f_log = stream_log_id(OWNER, "F")
            await until(lambda: f_log in b.logs and f_log in c.logs)  # (made, not linked)
            for sp in (b, c):
                with pytest.raises(Refused) as refused:
                    sp.find(OWNER, "F")  # (nor an append to it)
                assert refused.value.status == 404
                with pytest.raises(Refused) as refused:
                    await make(sp, "G", forked_from="F")
                assert refused.value.status == 404
                with pytest.raises(Refused) as refused:
                    await make(sp, "F", forked_from="S")  # (its maker's answer is not given yet)
                assert refused.value.status == 503
            await c.delete(OWNER, "S")
            await until(lambda: b.streams[(OWNER, "S")].soft_deleted)
            assert b.streams[(OWNER, "S")].refcount == c.streams[(OWNER, "S")].refcount == 1
            gate.set()
        for sp in (a, b, c):
            await until(lambda: (OWNER, "S") not in sp.streams and f_log not in sp.logs and not sp._unread)
        await until(lambda: not any(sp.es.session_ids() for sp in (a, b, c)))


async def test_an_expiry_decided_before_another_workers_append_is_decided_again(nats_cluster):
    """A decides a TTL stream expired (its soft delete not written yet: a
    create holds the sweeper back) and then folds B's acknowledged append:
    the expiry is decided again from that access, and the stream stays on
    both (the soft delete was written after the append, fenced past it,
    and the append lost with the stream)."""
    async with space(nats_cluster, "DSS17") as a, space(nats_cluster, "DSS17") as b:
        st, _ = await make(a, "S", ttl=60, data=b"abc")
        await until(lambda: (OWNER, "S") in b.streams)
        async with a._lifecycle:  # (as a create or a delete in flight holds it)
            a._access[st.log_id] -= 200  # (A's view: idle past the TTL and its grace)
            with pytest.raises(Refused):
                a.find(OWNER, "S")
            assert st.log_id in a._soft
            await append(b, "S", b"acknowledged")
            await until(lambda: units(a, "S") == [b"abc", b"acknowledged"])
        a._wake.set()
        await until(lambda: st.log_id not in a._soft)
        await a.settle_removals()
        assert not a.streams[(OWNER, "S")].soft_deleted and a.find(OWNER, "S") is a.streams[(OWNER, "S")]
        assert units(b, "S") == [b"abc", b"acknowledged"] and not b.streams[(OWNER, "S")].soft_deleted


@pytest.mark.parametrize("a_sees_the_drop_first", [False, True])
async def test_a_fork_whose_maker_stalls_past_its_link_time_is_dropped_and_its_late_link_refused(
        nats_cluster, a_sees_the_drop_first):
    """A makes fork F of S and stalls before its link: after LINK_SECONDS B
    drops F (a record in S's log, then F's log removed), S no longer counts
    it, and the name is free; A's link, once it runs, is refused for the
    drop (503: try again), and F does not come back. Also when A folds the
    drop before its link starts (seen beside two CPU hogs: A took the drop
    of its own fork, not pending yet, for one of a served fork, and its
    link, fenced past the drop, was answered as made)."""
    from sessionlog_store.server.scaleout.streamspace import LINK_SECONDS
    stream = "DSS18B" if a_sees_the_drop_first else "DSS18"  # (one cluster for the module: a stream each)
    async with space(nats_cluster, stream) as a, space(nats_cluster, stream) as b:
        await make(a, "S", data=b"abc")
        await until(lambda: (OWNER, "S") in b.streams)
        gate = trio.Event()
        made = a._fork_made

        async def paused(fork: Any, source: Any) -> None:
            await gate.wait()
            await made(fork, source)
        a._fork_made = paused

        async def fork_f() -> None:
            with pytest.raises(Refused) as refused:
                await make(a, "F", forked_from="S")
            assert refused.value.status == 503, refused.value
        f_log = stream_log_id(OWNER, "F")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fork_f)
            await until(lambda: f_log in b._pending and f_log in a.logs)
            assert b.streams[(OWNER, "S")].refcount == 1
            b._pending[f_log] -= LINK_SECONDS + 1  # (its link time past)
            b._wake.set()
            await until(lambda: f_log not in b.logs and b.streams[(OWNER, "S")].refcount == 0)
            if a_sees_the_drop_first:
                await until(lambda: f_log in a._doomed)  # (A folded the drop of its own fork)
            gate.set()
        await until(lambda: f_log not in a.logs and a.streams[(OWNER, "S")].refcount == 0)
        await until(lambda: f_log not in a.es.session_ids() and f_log not in b.es.session_ids())
        _, made_again = await make(b, "F", data=b"mine")
        assert made_again
        await until(lambda: (OWNER, "F") in a.streams and units(a, "F") == [b"mine"])


async def test_a_dropped_forks_log_is_removed_even_when_its_dropper_dies_first(nats_cluster):
    """A makes fork F and dies before its link; B drops F and dies before
    removing its log: C, seeing the drop, removes it (every worker once
    forgot F and left its log, the name refused `503 busy` for good)."""
    from sessionlog_store.server.scaleout.streamspace import LINK_SECONDS
    f_log = stream_log_id(OWNER, "F")
    async with space(nats_cluster, "DSS19") as c:
        async with space(nats_cluster, "DSS19") as b:
            async with space(nats_cluster, "DSS19") as a:
                await make(a, "S", data=b"abc")
                await until(lambda: (OWNER, "S") in b.streams and (OWNER, "S") in c.streams)
                stalled = trio.Event()

                async def never(fork: Any, source: Any) -> None:
                    await stalled.wait()
                a._fork_made = never
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(lambda: make(a, "F", forked_from="S"))
                    await until(lambda: f_log in b._pending and f_log in c._pending)
                    nursery.cancel_scope.cancel()  # (A dies before its link)

            async def dies_first(fork: Any) -> None:
                pass  # (B dies after its drop record, before removing F's log)
            b._discard = dies_first
            b._pending[f_log] -= LINK_SECONDS + 1
            b._wake.set()
            await until(lambda: f_log not in c._pending)
        await until(lambda: f_log not in c.es.session_ids() and not c._doomed)
        assert c.streams[(OWNER, "S")].refcount == 0
        _, made = await make(c, "F", data=b"x")
        assert made


async def test_a_put_on_a_lagging_worker_leaves_a_linked_fork_whole(nats_cluster):
    """C's tail lags (its catch-up waits too); a PUT of a linked fork's name
    through C reads the fork's log ahead of the tail, its source unknown
    there: C refuses (503) rather than taking the fork for an orphan (it
    once removed it, with its acknowledged append, and made its own), and
    serves the fork once it has caught up."""
    async with space(nats_cluster, "DSS20") as a, space(nats_cluster, "DSS20") as c:
        hold_tail(c, position=True)
        await make(a, "S", data=b"abc")
        _, made = await make(a, "F", forked_from="S")
        assert made
        await append(a, "F", b"acked")
        with pytest.raises(Refused) as refused:
            await make(c, "F", data=b"other")
        assert refused.value.status == 503
        c.release()
        await until(lambda: (OWNER, "F") in c.streams and units(c, "F") == [b"abc", b"acked"], within=60)
        assert units(a, "F") == [b"abc", b"acked"]
