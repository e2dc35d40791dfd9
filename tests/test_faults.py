"""Fault injection at every write, sync, rename and directory-sync call site,
with EIO and ENOSPC, once and permanently. A failure in the log is fatal: no
acknowledgement for the failed batch, no sync retried, no later write
accepted, a clear error, and a clean recovery on restart. A failure writing a
checkpoint (a cache) is logged and the store goes on."""
from __future__ import annotations

import errno
import threading

import pytest
import trio

from sessionlog_store.eventstore import FileOps, StoreBroken
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import read_logs

CONFIG = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600)


class FaultyFS(FileOps):
    """Real operations; the `site` call fails with `err` once armed (once, or
    from then on)."""

    def __init__(self, site: str, err: int, permanent: bool) -> None:
        self.site, self.err, self.permanent = site, err, permanent
        self.armed = False
        self.failed = 0
        self.calls: dict[str, int] = {}
        self.calls_after_failure = 0
        self._lock = threading.Lock()

    def _hit(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.failed and name == self.site:
                self.calls_after_failure += 1
            if self.armed and name == self.site and (self.permanent or not self.failed):
                self.failed += 1
                raise OSError(self.err, f"injected {errno.errorcode[self.err]} in {name}")

    def write(self, fd, data):  # type: ignore[no-untyped-def]
        self._hit("write")
        super().write(fd, data)

    def fdatasync(self, fd):  # type: ignore[no-untyped-def]
        self._hit("sync")
        super().fdatasync(fd)

    def syncfs(self, fd):  # type: ignore[no-untyped-def]
        self._hit("sync")
        super().syncfs(fd)

    def fsync(self, fd):  # type: ignore[no-untyped-def]
        self._hit("fsync")
        super().fsync(fd)

    def rename(self, src, dst):  # type: ignore[no-untyped-def]
        self._hit("rename")
        super().rename(src, dst)

    def fsync_dir(self, path):  # type: ignore[no-untyped-def]
        self._hit("fsync_dir")
        super().fsync_dir(path)

    def write_file(self, path, data):  # type: ignore[no-untyped-def]
        self._hit("write_file")
        super().write_file(path, data)


ERRS = [errno.EIO, errno.ENOSPC]


@pytest.mark.parametrize("permanent", [False, True], ids=["once", "permanent"])
@pytest.mark.parametrize("err", ERRS, ids=["EIO", "ENOSPC"])
@pytest.mark.parametrize("site,during", [
    ("write", "append"), ("sync", "append"), ("sync", "progress"),
    ("fsync", "create"), ("fsync_dir", "create"), ("fsync_dir", "delete"),
])
async def test_a_failure_in_the_log_is_fatal_and_recovers_cleanly(root, site, during, err, permanent):
    fs = FaultyFS("fsync" if site == "fsync" else site, err, permanent)
    acked: dict[str, int] = {}
    with trio.fail_after(20):
        async with open_session_store(root, fs=fs, config=CONFIG) as store:
            sids = []
            for i in range(3):
                meta, _ = await store.create_session(first_message=f"m{i}")
                sids.append(meta.id)
                await store.append_message(meta.id, "acked")
            for sid in sids:
                acked[sid] = store.es.durable_seq(sid)
            seen: list[tuple[str, dict]] = []
            store.watchers.append(lambda kind, data: seen.append((kind, data)))
            await store.es.flush()  # no log write of the acked records still queued (journal mode)
            fs.armed = True
            with pytest.raises(StoreBroken) as caught:
                if during == "append":
                    await store.append_message(sids[0], "doomed")
                elif during == "progress":
                    async with store.inflight(sids[1]) as msg:
                        msg.write("x")
                elif during == "create":
                    await store.create_session(first_message="doomed")
                else:
                    await store.delete_session(sids[2])
            assert isinstance(caught.value.__cause__, OSError)
            if during == "delete":  # the tombstone is durable: every client is told it is gone
                assert ("session_deleted", sids[2]) in [(k, d.get("session_id")) for k, d in seen]
            assert fs.failed == 1
            retried = fs.calls_after_failure
            with pytest.raises(StoreBroken):
                await store.append_message(sids[1], "refused")
            with pytest.raises(StoreBroken):
                await store.create_session()
            assert fs.calls_after_failure == retried, "nothing is retried after a failure"
    before = read_logs(root)
    async with open_session_store(root, config=CONFIG) as store:  # the real disk again
        for sid, seq in acked.items():
            if during == "delete" and sid == sids[2]:
                assert sid not in store.registry  # its tombstone was durable: the deletion finished
                continue
            assert store.es.last_seq(sid) >= seq, "every acknowledged record is there"
            assert [m.content for m in await store.get_messages(sid)][:2] == [f"m{sids.index(sid)}", "acked"]
        for meta in store.registry.rows.values():
            assert not meta.open_msgs
    assert set(read_logs(root)) <= set(before)


@pytest.mark.parametrize("site", ["write_file", "rename", "fsync_dir"])
@pytest.mark.parametrize("err", ERRS, ids=["EIO", "ENOSPC"])
async def test_a_failed_checkpoint_is_logged_and_the_store_goes_on(root, site, err, caplog):
    fs = FaultyFS(site, err, permanent=True)
    async with open_session_store(root, fs=fs, config=CONFIG) as store:
        meta, _ = await store.create_session(first_message="hi")
        fs.armed = True
        await store.keeper.caches.write(store.write_checkpoint)  # type: ignore[attr-defined]
        assert fs.failed >= 1 and "writing a checkpoint failed" in caplog.text
        fs.armed = False
        await store.append_message(meta.id, "the log still works")
        fs.armed = True
    async with open_session_store(root, config=CONFIG) as store:
        assert [m.content for m in await store.get_messages(meta.id)] == ["hi", "the log still works"]


async def test_clients_get_a_clear_error_when_the_disk_fails(root, nursery):
    from sessionlog_store.server.agents.demo import DemoAgent
    from sessionlog_store.server.edge.client import ServerError, open_client
    from sessionlog_store.server.edge.ws import Server, ServerConfig
    from sessionlog_store.server.run import serve_store
    fs = FaultyFS("sync", errno.EIO, permanent=True)
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()

    async def run() -> None:
        await serve_store(root, ServerConfig(port=0, token="t"), agent=DemoAgent(speed=0), store_config=CONFIG,
                          on_ready=on_ready, fs=fs)
    nursery.start_soon(run)
    await ready.wait()
    async with open_client("127.0.0.1", holder["s"].port, "t") as c:
        created = await c.request("create_session")
        fs.armed = True
        with pytest.raises(ServerError) as e:
            await c.request("rename_session", session_id=created["session"]["id"], title="x")
        assert e.value.code == "store_broken"
        with pytest.raises(ServerError) as e:
            await c.request("chat", content="hello")
        assert e.value.code == "store_broken"
        rows = await c.request("list_sessions")  # reads still work
        assert rows["total"] == 1


@pytest.mark.parametrize("site", ["write", "fsync"])
async def test_a_failure_in_the_project_log_changes_nothing(root, tmp_path, site):
    folder = tmp_path / "proj"
    folder.mkdir()
    fs = FaultyFS(site, errno.EIO, permanent=False)
    async with open_session_store(root, fs=fs, config=CONFIG) as store:
        before = [p.id for p in store.list_projects()]
        fs.armed = True
        with pytest.raises(StoreBroken):
            await store.create_project("p", str(folder))
        assert [p.id for p in store.list_projects()] == before, "a project is listed only once durable"
        fs.armed = False
        with pytest.raises(StoreBroken):  # never retried: the failed line may be in the file already
            await store.create_project("q", str(folder))
        assert fs.calls_after_failure == 0
    async with open_session_store(root, config=CONFIG) as store:  # opens cleanly, whatever reached the disk
        assert "default" in [p.id for p in store.list_projects()]
        other = tmp_path / "other"
        other.mkdir()
        await store.create_project("r", str(other))  # (p may have reached the disk and hold `folder`)
