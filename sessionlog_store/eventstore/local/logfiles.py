"""The logs' open files: append descriptors in an LRU, the device of each
log, a folder descriptor per device for syncfs, and the writes and syncs
made through them.

Theory of operation
-------------------
Every method runs in a worker thread (trio.to_thread) while its caller holds
the store's descriptor lock (`fd_lock`): the committer's thread in the
direct modes, the log writer's in the journal mode, the round when it
fdatasyncs, `remove()` when it forgets a session. So no two threads ever
use this object at once, and a descriptor is never closed under a write.

At most `max_open` append descriptors are open (an LRU): enough for every
streaming session of a busy server, bounded so that more sessions never
exhaust the process's descriptors. A descriptor evicted while it holds
unsynced writes is fdatasynced first when the caller tracks them (`dirty`).

A log's device (`st_dev`) is found when its descriptor is first opened; one
folder descriptor per device, opened on that device before the logs' first
write there, is what syncfs(2) is called on: a session folder may be a
symlink or a mount on another device than the root, and a descriptor opened
after a writeback error hears nothing of it (Linux >= 5.8 reports it to
descriptors opened before).

Where syncfs reports no writeback error (an older kernel), the round
fdatasyncs each log written since the last round through the descriptor
that wrote it (`unsynced`), for the same reason.
"""
from __future__ import annotations

import resource
from collections import OrderedDict
from typing import Final

from .fsio import SYNCFS_REPORTS_ERRORS, FileOps
from .log import log_path, session_dir

# Open log descriptors kept for appends: enough for every streaming session of
# a busy server (bench/: 10,000 streams), bounded so that more sessions never
# exhaust the process's descriptors; at open, the soft RLIMIT_NOFILE is raised
# toward the hard one and a quarter of what is allowed (at least 256) is left
# for everything else (sockets, snapshots). Sessions written in turn (every
# stream each tick) beyond the cap miss the LRU on every write (an open and a
# close per batch): bench/ measured 10,000 streams under a cap of 9,872
# spending 40 % of the committer's thread on that. Raise `ulimit -n` for more.
MAX_OPEN_LOGS: Final = 16384


def descriptor_budget(wanted: int) -> int:
    """How many log descriptors to keep open, the soft limit raised first."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, 2 * wanted + 256)) if hard != resource.RLIM_INFINITY else 2 * wanted + 256
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(16, min(wanted, soft - max(256, soft // 4)))


class LogFiles:
    """The open files of a data root's logs (see the module's header)."""

    def __init__(self, fs: FileOps, root: str, max_open: int) -> None:
        self.fs, self.root, self.max_open = fs, root, max_open
        self.fds: OrderedDict[str, int] = OrderedDict()  # session -> append descriptor (LRU order)
        self.devs: dict[str, int] = {}       # session -> st_dev of its log
        self.dev_fds: dict[int, int] = {}    # st_dev -> a folder descriptor on it (for syncfs)
        self.unsynced: set[int] = set()      # written since the round (no syncfs that reports errors)

    def __len__(self) -> int:
        return len(self.fds)

    def fd(self, sid: str, dirty: set[int] | None = None) -> int:
        """The append descriptor of a session's log; an evicted descriptor in
        `dirty` is synced before it is closed."""
        fds = self.fds
        fd = fds.get(sid)
        if fd is not None:
            fds.move_to_end(sid)
            return fd
        fs = self.fs
        fd = fs.open_append(log_path(self.root, sid))
        if len(fds) >= self.max_open:  # evict first: never more than max_open, even for a moment
            _, old_fd = fds.popitem(last=False)
            if dirty is not None and old_fd in dirty:
                fs.fdatasync(old_fd)
                dirty.discard(old_fd)
            fs.close(old_fd)
        fds[sid] = fd
        if sid not in self.devs:
            self.devs[sid] = self._device_of(sid, fd)
        return fd

    def _device_of(self, sid: str, fd: int) -> int:
        dev = self.fs.device(fd)
        if dev not in self.dev_fds:
            self.dev_fds[dev] = self.fs.open_dir(session_dir(self.root, sid))
        return dev

    def write(self, lines: dict[str, list[bytes]]) -> set[int]:
        """The journal mode's log writes: each session's lines with one write,
        no sync (the round syncs); returns the devices written."""
        fs, devs = self.fs, self.devs
        devices: set[int] = set()
        unsynced = None if SYNCFS_REPORTS_ERRORS else self.unsynced
        for sid, new in lines.items():
            fd = self.fd(sid, unsynced)
            fs.write(fd, new[0] if len(new) == 1 else b"".join(new))
            if unsynced is not None:
                unsynced.add(fd)
            devices.add(devs[sid])
        return devices

    def write_durably(self, lines: dict[str, list[bytes]], per_file: bool) -> None:
        """The direct modes: one write per log, then one durability step:
        fdatasync of each (`per_file`), or one syncfs per device holding one."""
        fs = self.fs
        dirty: set[int] = set()
        devices: set[int] = set()
        for sid, new in lines.items():
            fd = self.fd(sid, dirty if per_file else None)
            fs.write(fd, new[0] if len(new) == 1 else b"".join(new))
            dirty.add(fd)
            devices.add(self.devs[sid])
        if per_file:
            for fd in dirty:
                fs.fdatasync(fd)
        else:
            for dev in devices:
                fs.syncfs(self.dev_fds[dev])

    def syncfs(self, devs: set[int]) -> None:
        """The round: one syncfs per device, on descriptors opened before the
        logs' first write there (every writeback error since is reported)."""
        for dev in devs:
            self.fs.syncfs(self.dev_fds[dev])

    def sync_unsynced(self) -> None:
        """The round where syncfs reports no errors: each log written since,
        through the descriptor that wrote it."""
        fds, self.unsynced = self.unsynced, set()
        for fd in fds:
            self.fs.fdatasync(fd)

    def forget(self, sid: str) -> int | None:
        """A removed session's descriptor, out of the LRU (the caller closes it)."""
        self.devs.pop(sid, None)
        fd = self.fds.pop(sid, None)
        if fd is not None:
            self.unsynced.discard(fd)  # (closed by the caller: never synced by a round)
        return fd

    def close_all(self) -> None:
        for fd in [*self.fds.values(), *self.dev_fds.values()]:
            try:
                self.fs.close(fd)
            except OSError:
                pass
        self.fds.clear()
        self.dev_fds.clear()
