"""The sync plan is per device (issue 11, item 6): with `sessions/` or one
session's folder on another filesystem than the data root (a symlink to a
real tmpfs mount), every batch syncs each filesystem that holds a dirty log."""
from __future__ import annotations

import os
import threading

import trio

from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, session_dir
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store


class SyncRecorder(FileOps):
    """Real operations; records the device of every syncfs and fdatasync."""

    def __init__(self) -> None:
        self.synced: list[int] = []
        self._lock = threading.Lock()

    def syncfs(self, fd: int) -> None:
        super().syncfs(fd)
        with self._lock:
            self.synced.append(os.fstat(fd).st_dev)

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        with self._lock:
            self.synced.append(os.fstat(fd).st_dev)


async def write_batches(root: str, fs: SyncRecorder, sids: list[str]) -> None:
    """Appends to several sessions at once, so that one batch holds many files (syncfs)."""
    async with open_session_store(root, fs=fs, config=StoreConfig(sync_mode="syncfs")) as store:
        for _ in range(3):
            fs.synced.clear()
            async with trio.open_nursery() as n:
                for sid in sids:
                    n.start_soon(store.append_message, sid, "hello")
            yield_devs = set(fs.synced)
            for sid in sids:
                dev = os.stat(session_dir(root, sid)).st_dev
                assert dev in yield_devs, f"a batch with {sid} never synced its filesystem"


async def test_sessions_on_another_filesystem_are_synced_on_theirs(tmp_path, second_fs):
    root = str(tmp_path / "store")
    os.makedirs(root)
    os.symlink(second_fs, os.path.join(root, SESSIONS_DIR))
    async with open_session_store(root) as store:
        sids = [(await store.create_session())[0].id for _ in range(4)]
    assert os.stat(session_dir(root, sids[0])).st_dev != os.stat(root).st_dev
    await write_batches(root, SyncRecorder(), sids)


async def test_one_session_folder_on_another_filesystem(tmp_path, second_fs):
    root = str(tmp_path / "store")
    async with open_session_store(root) as store:
        sids = [(await store.create_session())[0].id for _ in range(3)]
    # Move one session's folder to the other filesystem, leaving a symlink.
    moved = session_dir(root, sids[0])
    target = os.path.join(second_fs, sids[0])
    os.makedirs(target)
    for name in os.listdir(moved):
        with open(os.path.join(moved, name), "rb") as src, open(os.path.join(target, name), "wb") as dst:
            dst.write(src.read())
    for name in os.listdir(moved):
        os.unlink(os.path.join(moved, name))
    os.rmdir(moved)
    os.symlink(target, moved)
    devs = {os.stat(session_dir(root, s)).st_dev for s in sids}
    assert len(devs) == 2
    await write_batches(root, SyncRecorder(), sids)
