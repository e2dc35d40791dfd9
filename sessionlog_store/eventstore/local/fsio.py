"""The seam under every file operation of the store.

The real code always goes through a `FileOps`; `OS_FILES` is the real one.
Tests put a recording or failing implementation here (fault injection,
simulated power loss) without touching the store's logic.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
import sys
from typing import Final

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)
HAVE_SYNCFS: Final = _syncfs is not None


def _linux_at_least(major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", os.uname().release) if sys.platform == "linux" else None
    return m is not None and (int(m[1]), int(m[2])) >= (major, minor)


# syncfs(2) reports a writeback error of its filesystem (one that happened
# after the descriptor it is called on was opened) since Linux 5.8; before,
# it returns 0 whatever writeback lost. Where it does not, the store syncs
# each log it wrote through a descriptor of that log instead.
SYNCFS_REPORTS_ERRORS: Final = HAVE_SYNCFS and _linux_at_least(5, 8)


class FileOps:
    """Real file operations. Every method may raise OSError."""

    def open_append(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def create_exclusive(self, path: str) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def open_dir(self, path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def write(self, fd: int, data: bytes) -> None:
        """One os.write; a short write is an error (ENOSPC and friends)."""
        n = os.write(fd, data)
        if n != len(data):
            raise OSError(errno.EIO, f"short write: {n} of {len(data)} bytes")

    def open_write(self, path: str) -> int:
        """An existing file, for writes in place (`pwrite`)."""
        return os.open(path, os.O_WRONLY | os.O_CLOEXEC)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        """One os.pwrite at `offset`; a short write is an error."""
        n = os.pwrite(fd, data, offset)
        if n != len(data):
            raise OSError(errno.EIO, f"short write: {n} of {len(data)} bytes")

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def syncfs(self, fd: int) -> None:
        """Linux syncfs(2): one flush for every dirty file of the filesystem."""
        if _syncfs is None:
            raise OSError(errno.ENOSYS, "syncfs is not available")
        if _syncfs(fd) != 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def close(self, fd: int) -> None:
        os.close(fd)

    def device(self, fd: int) -> int:
        """The st_dev of an open file: which filesystem a sync must cover."""
        return os.fstat(fd).st_dev

    def read_bytes(self, path: str, offset: int = 0, size: int = -1) -> bytes:
        with open(path, "rb") as f:
            if offset:
                f.seek(offset)
            return f.read(size)

    def kept_folder(self, path: str) -> str | None:
        """Why a folder is never removed as an orphan: it is a symlink (its
        target may be a disk not mounted yet) or a mount point; else None."""
        if os.path.islink(path):
            return f"a symlink to {os.readlink(path)}" + ("" if os.path.exists(path) else ", which is not there")
        if os.path.ismount(path):
            return "a mount point"
        return None

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def mkdir(self, path: str) -> None:
        os.mkdir(path, 0o755)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, 0o755, exist_ok=True)

    def truncate(self, path: str, size: int) -> None:
        os.truncate(path, size)

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmtree(self, path: str) -> None:
        """Remove a folder and what is in it; a folder that is a symlink (to
        another filesystem) loses its target's contents, then the link."""
        if os.path.islink(path):
            shutil.rmtree(os.path.realpath(path), ignore_errors=False)
            os.unlink(path)
        else:
            shutil.rmtree(path, ignore_errors=False)

    def fsync_dir(self, path: str) -> None:
        fd = self.open_dir(path)
        try:
            self.fsync(fd)
        finally:
            self.close(fd)

    def write_file(self, path: str, data: bytes) -> None:
        """Create or replace `path` with `data` and fsync it (not atomic; see atomic_write)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            self.close(fd)


OS_FILES: Final = FileOps()


def atomic_write(fs: FileOps, path: str, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new
    file, never a mix: temp file, fsync, rename, fsync the directory."""
    tmp = f"{path}.tmp"
    fs.write_file(tmp, data)
    fs.rename(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")


class StoreLocked(OSError):
    """Another process (a running server, a rebuild) holds the data root."""


def lock_root(root: str) -> int:
    """Take the data root's lock (`<root>/.lock`, flock) for this process, so two
    processes never write one store. The kernel drops it when the process dies,
    SIGKILL included. Returns the descriptor to keep open."""
    import fcntl
    os.makedirs(root, 0o755, exist_ok=True)
    fd = os.open(os.path.join(root, ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLocked(errno.EBUSY, f"the store at {root} is in use by another process "
                                       "(a running `sessionlog serve`?)") from None
    return fd
