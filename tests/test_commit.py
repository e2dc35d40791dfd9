"""Group commit: batching, acknowledgement only after the sync, failure is fatal."""
from __future__ import annotations

import errno
import threading

import pytest
import trio

from sessionlog_store.eventstore import FileOps, StoreBroken, StoreClosed, open_event_store
from sessionlog_store.eventstore.errors import SessionExists, UnknownSession
from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.eventstore.record import scan


class GateFS(FileOps):
    """Real file operations whose batch syncs wait for a gate (and can fail)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail: OSError | None = None
        self.syncs = 0

    def _sync(self, real, fd):  # type: ignore[no-untyped-def]
        self.syncs += 1
        self.entered.set()
        self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        real(fd)

    def fdatasync(self, fd: int) -> None:
        self._sync(super().fdatasync, fd)

    def syncfs(self, fd: int) -> None:
        self._sync(super().syncfs, fd)


async def _make(es, n: int) -> list[str]:
    ids = [f"s{i}" for i in range(n)]
    for sid in ids:
        await es.create(sid, [SessionCreated(session_id=sid)])
    return ids


@pytest.mark.parametrize("mode", ["auto", "syncfs", "fdatasync"])
async def test_many_concurrent_appenders_share_batches(root, mode):
    with trio.fail_after(30):
        async with open_event_store(root, sync_mode=mode) as es:
            ids = await _make(es, 50)
            async with trio.open_nursery() as n:
                for i in range(1000):
                    n.start_soon(es.append, ids[i % 50], SessionRenamed(title=str(i)))
            st = es.statistics()
            assert st.records == 1000
            assert st.batches < st.records / 10
            assert st.largest_batch > 1
        for sid in ids:
            with open(log_path(root, sid), "rb") as f:
                s = scan(sid, f.read(), expect_seq=1)
            assert [r.seq for r in s.records] == list(range(1, 22)) and not s.torn_bytes


async def test_durable_append_never_returns_before_its_sync(root):
    fs = GateFS()
    with trio.fail_after(10):
        async with open_event_store(root, fs=fs) as es:
            await es.create("a", [SessionCreated(session_id="a")])
            fs.gate.clear()
            fs.entered.clear()
            returned = trio.Event()

            async def appender() -> None:
                await es.append("a", SessionRenamed(title="x"))
                returned.set()

            async with trio.open_nursery() as n:
                n.start_soon(appender)
                await trio.to_thread.run_sync(fs.entered.wait)  # the batch is syncing now
                await trio.sleep(0.05)
                assert not returned.is_set()
                assert es.durable_seq("a") == 1 and es.last_seq("a") == 2
                fs.gate.set()
            assert returned.is_set() and es.durable_seq("a") == 2


async def test_nowait_append_returns_at_once_and_becomes_durable(root):
    fs = GateFS()
    with trio.fail_after(10):
        async with open_event_store(root, fs=fs) as es:
            await es.create("a", [SessionCreated(session_id="a")])
            fs.gate.clear()
            a = es.append_nowait("a", SessionRenamed(title="x"))  # never awaits
            assert a.record.seq == 2 and es.durable_seq("a") == 1
            fs.gate.set()
            await es.wait_durable("a", 2)
            assert es.durable_seq("a") == 2


async def test_failed_sync_fails_every_waiter_and_the_store_refuses_more(root):
    fs = GateFS()
    errors: list[BaseException] = []
    with trio.fail_after(10):
        async with open_event_store(root, fs=fs) as es:
            ids = await _make(es, 5)
            fs.gate.clear()
            fs.entered.clear()
            fs.fail = OSError(errno.EIO, "injected EIO")
            syncs_before = fs.syncs

            async def appender(sid: str) -> None:
                try:
                    await es.append(sid, SessionRenamed(title="doomed"))
                except StoreBroken as e:
                    errors.append(e)

            async with trio.open_nursery() as n:
                for sid in ids:
                    n.start_soon(appender, sid)
                await trio.to_thread.run_sync(fs.entered.wait)
                fs.gate.set()
            assert len(errors) == 5
            assert all(isinstance(e.__cause__, OSError) for e in errors)
            assert fs.syncs == syncs_before + 1, "a failed sync must never be retried"
            with pytest.raises(StoreBroken):
                await es.append(ids[0], SessionRenamed(title="later"))
            with pytest.raises(StoreBroken):
                es.append_nowait(ids[0], SessionRenamed(title="later"))
            assert es.statistics().records == 0


async def test_closed_store_refuses_appends(root):
    async with open_event_store(root) as es:
        await es.create("a", [SessionCreated(session_id="a")])
    with pytest.raises(StoreClosed):
        await es.append("a", SessionRenamed(title="x"))


async def test_everything_appended_is_committed_when_the_block_exits(root):
    async with open_event_store(root) as es:
        await es.create("a", [SessionCreated(session_id="a")])
        for i in range(10):
            es.append_nowait("a", SessionRenamed(title=str(i)))
    with open(log_path(root, "a"), "rb") as f:
        assert len(scan("a", f.read()).records) == 11


async def test_duplicate_and_unknown_sessions(root):
    async with open_event_store(root) as es:
        await es.create("a", [SessionCreated(session_id="a")])
        with pytest.raises(SessionExists):
            await es.create("a", [SessionCreated(session_id="a")])
        with pytest.raises(UnknownSession):
            await es.append("nope", SessionRenamed(title="x"))


async def test_open_descriptors_are_bounded(root):
    import os
    with trio.fail_after(30):
        async with open_event_store(root, max_open=16) as es:
            ids = await _make(es, 200)
            for rnd in range(3):
                async with trio.open_nursery() as n:
                    for sid in ids:
                        n.start_soon(es.append, sid, SessionRenamed(title=str(rnd)))
                await es.flush()  # the log writer is done with this round's lines
                assert len(es.files) <= 16
            fds = len(os.listdir("/proc/self/fd"))
            assert fds < 200


async def test_second_process_cannot_open_the_same_root(root):
    from sessionlog_store.eventstore.local.fsio import StoreLocked
    async with open_event_store(root):
        with pytest.raises(StoreLocked):
            async with open_event_store(root):
                pass


async def test_waiting_for_a_record_in_the_batch_being_synced_returns_when_it_is_durable(root):
    fs = GateFS()
    with trio.fail_after(10):
        async with open_event_store(root, fs=fs) as es:
            await es.create("a", [SessionCreated(session_id="a")])
            fs.gate.clear()
            fs.entered.clear()
            a = es.append_nowait("a", SessionRenamed(title="x"))
            await trio.to_thread.run_sync(fs.entered.wait)  # its batch is syncing; the next one is empty
            async with trio.open_nursery() as n:
                n.start_soon(es.wait_durable, "a", a.record.seq)
                n.start_soon(es.flush)
                await trio.sleep(0.05)
                fs.gate.set()
            assert es.durable_seq("a") == a.record.seq
