"""A recording FileOps and a model of what a disk holds after a power cut.

`RecordingFS` performs every operation for real (the store runs normally on a
real folder) and logs it. `crash_image(ops[:k], mode)` replays the first k
operations on a model of the page cache and the disk and writes, into a fresh
folder, what could be on disk if the power failed right there:

- file contents: what was synced, plus, depending on `mode`, none of the
  unsynced appended bytes ("drop"), all of them ("keep"), the first half of
  them ("torn") or as many zero bytes ("zeros", as ext4 can leave after a cut);
- names (creations, renames, removals): only those made durable by an fsync of
  their directory (or a syncfs); with mode "keep" the unsynced ones too.
- a syncfs makes durable what was written *before it started*: it is logged
  as a begin and an end, and a cut between them keeps nothing of it; writes
  made while it runs (by another thread) are not covered by it.
A directory that is not durable takes everything below it with it.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

from sessionlog_store.eventstore.local.fsio import FileOps

Op = tuple[Any, ...]
MODES = ("drop", "keep", "torn", "zeros")


class RecordingFS(FileOps):
    """Real file operations, each logged (paths relative to `base`)."""

    def __init__(self, base: str) -> None:
        self.base = os.path.abspath(base)
        self.ops: list[Op] = []
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def _rel(self, path: str) -> str:
        return os.path.relpath(os.path.abspath(path), self.base)

    def _log(self, *op: Any) -> None:
        with self._lock:
            self.ops.append(op)

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        self._paths[fd] = self._rel(path)
        return fd

    def create_exclusive(self, path: str) -> int:
        fd = super().create_exclusive(path)
        self._paths[fd] = self._rel(path)
        self._log("create", self._rel(path))
        return fd

    def open_dir(self, path: str) -> int:
        fd = super().open_dir(path)
        self._paths[fd] = self._rel(path)
        return fd

    def write(self, fd: int, data: bytes) -> None:
        super().write(fd, data)
        self._log("write", self._paths[fd], bytes(data))

    def open_write(self, path: str) -> int:
        fd = super().open_write(path)
        self._paths[fd] = self._rel(path)
        return fd

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        super().pwrite(fd, data, offset)
        self._log("pwrite", self._paths[fd], offset, bytes(data))

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        self._log("sync", self._paths[fd])

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        path = self._paths[fd]
        self._log("sync_dir" if os.path.isdir(os.path.join(self.base, path)) else "sync", path)

    def syncfs(self, fd: int) -> None:
        with self._lock:
            self._syncs = getattr(self, "_syncs", 0) + 1
            token = self._syncs
        self._log("syncfs_begin", token)
        super().syncfs(fd)
        self._log("syncfs", token)

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def mkdir(self, path: str) -> None:
        super().mkdir(path)
        self._log("mkdir", self._rel(path))

    def makedirs(self, path: str) -> None:
        missing = []
        p = os.path.abspath(path)
        while not os.path.exists(p) and p != self.base:
            missing.append(p)
            p = os.path.dirname(p)
        super().makedirs(path)
        for m in reversed(missing):
            self._log("mkdir", self._rel(m))

    def truncate(self, path: str, size: int) -> None:
        super().truncate(path, size)
        self._log("truncate", self._rel(path), size)

    def rename(self, src: str, dst: str) -> None:
        super().rename(src, dst)
        self._log("rename", self._rel(src), self._rel(dst))

    def unlink(self, path: str) -> None:
        super().unlink(path)
        self._log("unlink", self._rel(path))

    def rmtree(self, path: str) -> None:
        super().rmtree(path)
        self._log("rmtree", self._rel(path))

    def write_file(self, path: str, data: bytes) -> None:
        # create or truncate, write, fsync the file (not its name): one logged step
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            FileOps.write(self, fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._log("write_file", self._rel(path), bytes(data))


def _parent(path: str) -> str:
    return os.path.dirname(path) or "."


@dataclass
class _Inode:
    durable: bytes = b""
    cur: bytes = b""


@dataclass
class _Model:
    inodes: list[_Inode] = field(default_factory=list)
    cur: dict[str, int] = field(default_factory=dict)       # file path -> inode
    dur: dict[str, int] = field(default_factory=dict)
    cur_dirs: set[str] = field(default_factory=lambda: {"."})
    dur_dirs: set[str] = field(default_factory=lambda: {"."})
    # syncfs in progress: token -> (op count at begin, inode count, contents, names, dirs)
    syncing: dict[int, tuple[int, int, list[bytes], dict[str, int], set[str]]] = field(default_factory=dict)
    applied: int = 0
    name_synced_at: dict[str, int] = field(default_factory=dict)  # path -> op count when its entry went durable

    def new(self, path: str) -> _Inode:
        self.inodes.append(_Inode())
        self.cur[path] = len(self.inodes) - 1
        return self.inodes[-1]

    def apply(self, op: Op) -> None:
        self.applied += 1
        kind = op[0]
        if kind == "syncfs_begin":
            self.syncing[op[1]] = (self.applied, len(self.inodes), [i.cur for i in self.inodes], dict(self.cur),
                                   set(self.cur_dirs))
            return
        if kind == "syncfs" and len(op) > 1 and op[1] in self.syncing:
            self._end_syncfs(*self.syncing.pop(op[1]))
            return
        if kind == "mkdir":
            self.cur_dirs.add(op[1])
        elif kind == "create":
            self.new(op[1])
        elif kind == "write":
            ino = self.inodes[self.cur[op[1]]]
            ino.cur += op[2]
        elif kind == "pwrite":  # (unsynced, an overwrite is lost whole in a cut: _content)
            ino = self.inodes[self.cur[op[1]]]
            off, data = op[2], op[3]
            ino.cur = ino.cur[:off].ljust(off, b"\x00") + data + ino.cur[off + len(data):]
        elif kind == "write_file":
            ino = self.inodes[self.cur[op[1]]] if op[1] in self.cur else self.new(op[1])
            ino.cur = ino.durable = op[2]
        elif kind == "sync":
            if op[1] in self.cur:
                ino = self.inodes[self.cur[op[1]]]
                ino.durable = ino.cur
        elif kind == "syncfs":
            for ino in self.inodes:
                ino.durable = ino.cur
            self.dur = dict(self.cur)
            self.dur_dirs = set(self.cur_dirs)
        elif kind == "sync_dir":
            d = op[1]
            for p in set(self.dur) | set(self.cur) | self.dur_dirs | self.cur_dirs:
                if _parent(p) == d:
                    self.name_synced_at[p] = self.applied
            self.dur = {p: i for p, i in self.dur.items() if _parent(p) != d}
            self.dur.update({p: i for p, i in self.cur.items() if _parent(p) == d})
            gone = {x for x in self.dur_dirs if _parent(x) == d and x != d and x not in self.cur_dirs}
            self.dur_dirs = {x for x in self.dur_dirs if _parent(x) != d or x == d}
            self.dur_dirs |= {x for x in self.cur_dirs if _parent(x) == d and x != d}
            # a folder whose removal is durable takes its durable names along
            # (a folder made again under that name starts empty)
            for x in gone:
                pre = x + os.sep
                self.dur = {p: i for p, i in self.dur.items() if not p.startswith(pre)}
                self.dur_dirs = {y for y in self.dur_dirs if not y.startswith(pre)}
        elif kind == "truncate":
            ino = self.inodes[self.cur[op[1]]]
            ino.cur = ino.cur[: op[2]]
        elif kind == "rename":
            self.cur[op[2]] = self.cur.pop(op[1])
        elif kind == "unlink":
            self.cur.pop(op[1], None)
        elif kind == "rmtree":
            pre = op[1] + os.sep
            self.cur = {p: i for p, i in self.cur.items() if not p.startswith(pre)}
            self.cur_dirs = {d for d in self.cur_dirs if d != op[1] and not d.startswith(pre)}


    def _end_syncfs(self, began: int, n_inodes: int, contents: list[bytes], names: dict[str, int],
                    dirs: set[str]) -> None:
        """A syncfs returned: what was there when it began is durable, except
        where something made durable after it began is newer."""
        for ino, data in zip(self.inodes[:n_inodes], contents):
            if data.startswith(ino.durable) or not ino.durable.startswith(data):
                ino.durable = data
        newer = {p for p, at in self.name_synced_at.items() if at > began}
        for p in set(names) | {p for p, i in self.dur.items() if i < n_inodes}:
            if p in newer:
                continue
            if p in names:
                self.dur[p] = names[p]
            else:
                self.dur.pop(p, None)
        self.dur_dirs = {x for x in self.dur_dirs if x in dirs or x in newer} | {x for x in dirs if x not in newer}


def _content(ino: _Inode, mode: str) -> bytes:
    if mode == "keep" or not ino.cur.startswith(ino.durable):
        return ino.cur if mode == "keep" else ino.durable
    extra = len(ino.cur) - len(ino.durable)
    if mode == "drop" or extra == 0:
        return ino.durable
    if mode == "torn":
        return ino.cur[: len(ino.durable) + max(1, extra // 2)]
    return ino.durable + b"\x00" * extra  # zeros


def crash_image(ops: list[Op], mode: str, target: str) -> None:
    """Write into `target` what the disk may hold after a cut following `ops`."""
    m = _Model()
    for op in ops:
        m.apply(op)
    names = m.cur if mode == "keep" else m.dur
    dirs = m.cur_dirs if mode == "keep" else m.dur_dirs

    def reachable(path: str) -> bool:
        d = os.path.dirname(path) or "."
        while d not in ("", "."):
            if d not in dirs:
                return False
            d = os.path.dirname(d)
        return True
    os.makedirs(target, exist_ok=True)
    for d in sorted(dirs, key=len):
        if d != "." and reachable(d):
            os.makedirs(os.path.join(target, d), exist_ok=True)
    for path, i in names.items():
        if reachable(path):
            with open(os.path.join(target, path), "wb") as f:
                f.write(_content(m.inodes[i], mode))
