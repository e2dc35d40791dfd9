"""Nothing acknowledged is lost when the disk lies (issue 24, items 1-5).

Items 1 runs on a real kernel: an ext4 image, loop-mounted, whose backing
store (a small tmpfs) is filled from outside, so the filesystem's writeback
fails as a failing disk's does, while every write(2) into the page cache
still succeeds. The image has no ext4 journal (`-O ^has_journal`) and is
mounted `errors=continue`: with one, the first failed metadata write aborts
it and remounts the filesystem read-only, and every later write fails at
once, which hides nothing. After a failed writeback the kernel keeps the page,
marked clean: a read returns bytes that never reached the disk, and a
descriptor opened after the failure hears nothing of it. A "reboot" is an
unmount and a mount of the image, which drops that page cache.

Items 2-5 use the real file system of the test's temp folder and real
processes (`sessionlog serve` for the refusal's one line and exit code).
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator

import pytest
from sessionlog_store.eventstore import JournalUnapplied
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.journal import (apply_journal, encode_frame, journal_dir, list_segments,
                                                 segment_name)
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, log_path, session_dir
from sessionlog_store.eventstore.record import scan

from .conftest import child, run_cli

N = 40  # acknowledged records: a creation and 39 renames of ~2 KB each

WRITER = """
import sys, trio
from sessionlog_store.eventstore import open_event_store
from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
root = sys.argv[1]
async def main():
    async with open_event_store(root, journal_sync_interval=3600) as es:
        await es.create("s1", [SessionCreated(session_id="s1", created_at=1.0)])
        for i in range(2, %d + 1):
            await es.append("s1", SessionRenamed(title=f"t{i}-" + "x" * 2000))
        await es.flush()  # acknowledged, and in the log (page cache)
        print("acked", flush=True)
        sys.stdin.readline()  # the disk fills now; then the stop's round syncs the logs
    print("stopped", es.broken is not None, flush=True)
trio.run(main)
""" % N

START = """
import sys, trio
from sessionlog_store.eventstore import open_event_store
async def main():
    async with open_event_store(sys.argv[1], journal_sync_interval=3600) as es:
        print(es.journal_recovery.summary(), flush=True)
try:
    trio.run(main)
except OSError as e:
    print(f"refused: {e}", flush=True)
    sys.exit(3)
"""


class FailingDisk:
    """An ext4 image on a small tmpfs, loop-mounted at `mnt`; `fill()` makes
    its writeback fail, `free()` lets it succeed, `reboot()` drops its cache."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.backing = os.path.join(work, "backing")
        self.image = os.path.join(self.backing, "fs.img")
        self.mnt = os.path.join(work, "mnt")
        self.filler = os.path.join(self.backing, "filler")
        os.makedirs(self.backing)
        os.makedirs(self.mnt)

    def setup(self) -> str | None:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", self.backing],
                           capture_output=True, text=True)
        if r.returncode != 0:
            return f"cannot mount a tmpfs (needs root): {r.stderr.strip()}"
        with open(self.image, "wb") as f:
            f.truncate(64 << 20)  # sparse: its blocks take tmpfs pages when written
        # no lazy init (it would write into the image in the background) and
        # no discard: what the store writes is what needs new tmpfs pages
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", "-E",
                        "lazy_itable_init=0,lazy_journal_init=0,nodiscard", self.image],
                       check=True, capture_output=True)
        return self.mount()

    def mount(self) -> str | None:
        r = subprocess.run(["mount", "-o", "loop,errors=continue", self.image, self.mnt],
                           capture_output=True, text=True)
        return None if r.returncode == 0 else f"cannot loop-mount an ext4 image here: {r.stderr.strip()}"

    def fill(self) -> None:
        with open(self.filler, "wb", buffering=0) as f:
            for chunk in (1 << 20, 4096):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError as e:
                    assert e.errno == errno.ENOSPC

    def free(self) -> None:
        os.unlink(self.filler)

    def reboot(self) -> None:
        subprocess.run(["umount", self.mnt], check=True, capture_output=True)
        assert self.mount() is None

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.mnt], capture_output=True)
        subprocess.run(["umount", "-l", self.backing], capture_output=True)
        shutil.rmtree(self.work, ignore_errors=True)


@pytest.fixture
def failing_disk() -> Iterator[FailingDisk]:
    if shutil.which("mkfs.ext4") is None or os.geteuid() != 0 or not os.path.exists("/dev/loop-control"):
        pytest.skip("a loop-mounted ext4 needs root, mkfs.ext4 and loop devices")
    disk = FailingDisk(tempfile.mkdtemp(prefix="sessionlog-failing-disk-"))
    why = disk.setup()
    if why is not None:
        disk.close()
        pytest.skip(why)
    try:
        yield disk
    finally:
        disk.close()


def start(root: str) -> tuple[int, str]:
    p = child(START, root)
    out, err = p.communicate(timeout=120)
    assert not err.strip() or p.returncode == 3, err
    return p.returncode, out.strip()


def acknowledged(root: str, *, kill: bool, disk: FailingDisk) -> None:
    """A writer acknowledges N records; the disk's writeback fails; the writer
    stops (its round's sync fails) or is SIGKILLed before any round."""
    w = child(WRITER, root, stdin=True)
    assert w.stdout is not None and w.stdin is not None
    assert w.stdout.readline().strip() == "acked"
    disk.fill()
    if kill:
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=60)
    else:
        out, err = w.communicate("go\n", timeout=120)
        assert out.split() == ["stopped", "True"], (out, err)  # the round's sync failed: broken
    assert list_segments(OS_FILES, root)[0], "the journal is kept after a failed sync"


def records_after_reboot(root: str, disk: FailingDisk) -> list[int]:
    disk.reboot()
    with open(log_path(root, "s1"), "rb") as f:
        return [r.seq for r in scan("s1", f.read()).records]


@pytest.mark.parametrize("kill", [False, True], ids=["stop-round-failed", "sigkill-then-a-start-failed"])
def test_a_start_after_a_writeback_error_removes_the_journal_only_once_its_bytes_are_on_disk(failing_disk, kill):
    root = os.path.join(failing_disk.mnt, "store")
    acknowledged(root, kill=kill, disk=failing_disk)
    if kill:
        # the first start writes the dirty pages back, which fails: refused, journal kept
        code, out = start(root)
        assert code == 3 and "refused" in out, out
    # a start while the disk still fails (systemd's Restart=on-failure): the
    # pages now read back equal and are marked clean; it must not believe them
    code, out = start(root)
    assert code == 3 and "refused" in out, out
    assert list_segments(OS_FILES, root)[0], "the journal is kept while its bytes cannot reach the disk"
    failing_disk.free()
    code, out = start(root)
    assert code == 0, out
    assert "1 logs rewritten" in out, out
    assert list_segments(OS_FILES, root)[0] == []
    assert records_after_reboot(root, failing_disk) == list(range(1, N + 1))


def test_a_start_after_a_writeback_error_with_the_disk_back_rewrites_what_reads_back_equal(failing_disk):
    """The first start after the failure comes with space again: the log reads
    back whole (clean-marked pages), yet the disk holds zeros; the start writes
    the journal's bytes itself and syncs them before removing the journal."""
    root = os.path.join(failing_disk.mnt, "store")
    acknowledged(root, kill=False, disk=failing_disk)
    failing_disk.free()
    code, out = start(root)
    assert code == 0, out
    assert records_after_reboot(root, failing_disk) == list(range(1, N + 1))
    assert "0 records written back into 0 logs (1 logs rewritten and synced)" in out, out


# -- item 2: a disk not mounted ------------------------------------------------

def _store_with_journal(root: str, sids: list[str], *, create: bool = True) -> None:
    """A store whose process died with records only in the journal (and the
    page cache); `create=False`: the sessions exist (a clean stop made them)."""
    p = child("""
import sys, os, trio
from sessionlog_store.eventstore import open_event_store
from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.eventstore.record import scan
async def main():
    async with open_event_store(sys.argv[1], journal_sync_interval=3600) as es:
        for sid in sys.argv[3:]:
            if sys.argv[2] == "create":
                await es.create(sid, [SessionCreated(session_id=sid, created_at=1.0)])
            else:
                data = open(log_path(es.root, sid), "rb").read()
                es.register(sid, scan(sid, data).records[-1].seq, len(data))
            await es.append(sid, SessionRenamed(title="acknowledged"))
        await es.flush()
        os.kill(os.getpid(), 9)
trio.run(main)
""", root, "create" if create else "append", *sids)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    assert list_segments(OS_FILES, root)[0]


def _serve_once(root: str) -> subprocess.CompletedProcess[str]:
    """`sessionlog serve` as a start: refused at once, or stopped once ready."""
    from .test_stop import start_serve
    proc, _ = start_serve(root)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sessions_folder_on_a_disk_not_mounted_refuses_the_start_and_keeps_the_journal(tmp_path):
    root = str(tmp_path / "store")
    disk = tmp_path / "disk"  # stands for the mounted disk
    disk.mkdir()
    os.makedirs(root)
    os.symlink(disk, os.path.join(root, SESSIONS_DIR))
    _store_with_journal(root, ["a1", "b2"])
    # "unmounted": the mount point is there and empty
    os.rename(disk, tmp_path / "disk-away")
    disk.mkdir()
    with pytest.raises(JournalUnapplied, match="2 session"):
        apply_journal(OS_FILES, root)
    r = run_cli("serve", "--root", root, "--port", "0")
    assert r.returncode == 3, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert "whose log is missing" in line and "a1" in line and "mounted" in line, line
    assert list_segments(OS_FILES, root)[0], "the journal is kept"
    # mounted again: the start applies the journal, nothing is lost
    os.rmdir(disk)
    os.rename(tmp_path / "disk-away", disk)
    rep = apply_journal(OS_FILES, root)
    assert sorted(rep.sessions) == ["a1", "b2"] or rep.rewritten == 2
    for sid in ["a1", "b2"]:
        with open(log_path(root, sid), "rb") as f:
            assert [r.seq for r in scan(sid, f.read()).records] == [1, 2]


def test_a_session_folder_that_is_a_dangling_symlink_refuses_and_is_never_removed(tmp_path):
    root = str(tmp_path / "store")
    elsewhere = tmp_path / "other-disk"
    elsewhere.mkdir()
    _store_with_journal(root, ["c3"])
    apply_journal(OS_FILES, root)
    # the session moves to another disk (its folder a symlink there) and is appended to
    os.rename(session_dir(root, "c3"), elsewhere / "c3")
    os.symlink(elsewhere / "c3", session_dir(root, "c3"))
    _store_with_journal(root, ["c3"], create=False)
    os.rename(elsewhere, tmp_path / "other-disk-away")  # that disk is gone: a dangling symlink
    r = run_cli("serve", "--root", root, "--port", "0")
    assert r.returncode == 3 and "c3" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert os.path.islink(session_dir(root, "c3")) and list_segments(OS_FILES, root)[0]
    # the disk back: nothing lost
    os.rename(tmp_path / "other-disk-away", elsewhere)
    apply_journal(OS_FILES, root)
    with open(log_path(root, "c3"), "rb") as f:
        assert [r.seq for r in scan("c3", f.read()).records] == [1, 2, 3]
    # gone again, with no journal: a start keeps the link and reports it,
    # instead of crashing on it or removing it
    os.rename(elsewhere, tmp_path / "other-disk-away")
    r = run_cli("verify", "--root", root)
    assert "symlink" in r.stdout + r.stderr, r
    p = _serve_once(root)
    assert p.returncode == 0, p.stderr
    assert os.path.islink(session_dir(root, "c3"))


def test_a_session_folder_that_is_a_mount_point_is_never_removed_as_an_orphan(tmp_path, second_fs):
    root = str(tmp_path / "store")
    os.makedirs(os.path.join(root, SESSIONS_DIR))
    os.symlink(second_fs, session_dir(root, "d4"))  # a folder on another filesystem, empty for now
    mnt = tmp_path / "store" / SESSIONS_DIR / "e5"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        p = _serve_once(root)
        assert p.returncode == 0, p.stderr
        assert os.path.islink(session_dir(root, "d4")) and os.path.ismount(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_damaged_session_deleted_with_records_in_the_journal_is_no_missing_disk(root):
    """A log removed without a tombstone (a damaged one) while the journal
    holds its records, then a crash: a marker tells the next start it is gone."""
    p = child("""
import sys, os, trio
from sessionlog_store.eventstore import CorruptRecord, open_event_store
from sessionlog_store.eventstore.events import SessionCreated, SessionRenamed
async def main():
    async with open_event_store(sys.argv[1], journal_sync_interval=3600) as es:
        await es.create("f6", [SessionCreated(session_id="f6", created_at=1.0)])
        await es.append("f6", SessionRenamed(title="x"))
        es.quarantine("f6", CorruptRecord("f6", 2, "damage found by the background check"))
        await es.remove("f6")
        os.kill(os.getpid(), 9)
trio.run(main)
""", root)
    _, err = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL, err
    assert list_segments(OS_FILES, root)[0]
    rep = apply_journal(OS_FILES, root)
    assert rep.rewritten == 0 and not os.path.exists(session_dir(root, "f6"))
    assert list_segments(OS_FILES, root)[0] == []


# -- items 3-5: the journal's own damage ---------------------------------------

def test_a_flipped_bit_in_the_last_full_frame_is_damage_kept_aside(root):
    _store_with_journal(root, ["h8"])
    ((_, seg),) = list_segments(OS_FILES, root)[0]
    with open(seg, "rb") as f:
        data = bytearray(f.read())
    data[-3] ^= 0x01  # one bit of the last frame's payload: its stated length is all there
    with open(seg, "wb") as f:
        f.write(bytes(data))
    rep = apply_journal(OS_FILES, root)
    assert any("bad checksum" in n and "damage" in n for n in rep.notes), rep.notes
    assert any("journal-damaged-1" in n for n in rep.notes), rep.notes
    assert os.listdir(os.path.join(root, "journal-damaged-1")) == [os.path.basename(seg)]


def test_a_segment_missing_from_the_middle_of_the_journal_is_damage_kept_aside(root):
    os.makedirs(journal_dir(root))
    for sid in ("i9", "j0"):
        os.makedirs(session_dir(root, sid))
    lines = {sid: f'{{"x":"{sid}"}}\n'.encode() for sid in ("i9", "j0")}
    for sid, line in lines.items():
        with open(log_path(root, sid), "wb") as f:
            f.write(line)
    # three segments of one batch each; the middle one (batch 2) is gone
    from sessionlog_store.eventstore.local.journal import born_of
    frames = {1: [("i9", 2, len(lines["i9"]), b'{"a":1}\n', born_of(lines["i9"]))],
              3: [("j0", 2, len(lines["j0"]), b'{"b":1}\n', born_of(lines["j0"]))]}
    for no, entries in frames.items():
        with open(os.path.join(journal_dir(root), segment_name(no)), "wb") as f:
            f.write(encode_frame(no, entries))
    rep = apply_journal(OS_FILES, root)
    assert any("batches 2 to 2 are missing" in n for n in rep.notes), rep.notes
    assert any("journal-damaged-1" in n for n in rep.notes), rep.notes
    assert sorted(os.listdir(os.path.join(root, "journal-damaged-1"))) == [segment_name(1), segment_name(3)]
    r = run_cli("verify", "--root", root)
    assert r.returncode == 1 and "journal-damaged-1" in r.stdout + r.stderr, r


def test_an_eight_megabyte_torn_frame_is_decided_in_one_pass(root):
    """A torn last frame of 8 MiB whose payload is full of the frame magic (a
    chat message can hold any text): each candidate's batch number and stated
    length are checked before anything is sliced or checksummed. The old code
    sliced the rest of the segment per candidate: about 20 minutes for this
    start. The timeout only tells a hang from a pass (it passes in well
    under a second here); it is no speed target."""
    os.makedirs(journal_dir(root))
    text = b"SLJ1" * (2 << 20)
    frame = encode_frame(1, [("k1", 2, 100, text, 0)])
    with open(os.path.join(journal_dir(root), segment_name(1)), "wb") as f:
        f.write(frame[: len(frame) - 1])  # the power cut took its last byte
    code, out = start_with_timeout(root, 60)
    assert code == 0 and "0 batches in 1 segments" in out, out
    assert list_segments(OS_FILES, root)[0] == []


def start_with_timeout(root: str, seconds: float) -> tuple[int, str]:
    p = child(START, root)
    try:
        out, err = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError(f"the start did not finish within {seconds} s (a hang)") from None
    return p.returncode, out.strip() + err
