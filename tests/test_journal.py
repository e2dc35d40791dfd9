"""The write-ahead journal (eventstore/local/journal.py): what it holds, what a start
gives back from it, and what it refuses to give back. Power cuts over the
whole path are in test_powerloss.py."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import threading
import zlib

import pytest
import trio

from sessionlog_store.eventstore import open_event_store
from sessionlog_store.eventstore.events import SessionCreated, SessionDeleted, SessionRenamed
from sessionlog_store.eventstore.local.fsio import OS_FILES, FileOps
from sessionlog_store.eventstore.local.journal import apply_journal, decode_frames, encode_frame, journal_dir, list_segments
from sessionlog_store.eventstore.local.log import log_path, read_log
from sessionlog_store.eventstore.record import scan

from .conftest import child, read_logs
from .simdisk import RecordingFS, crash_image


def segments(root: str) -> list[str]:
    return [p for _, p in list_segments(OS_FILES, root)[0]]


async def test_a_batch_is_one_frame_and_its_lines_are_in_the_log_when_acknowledged(root):
    async with open_event_store(root, journal_sync_interval=3600) as es:
        await es.create("s1", [SessionCreated(session_id="s1", created_at=1.0)])
        await es.create("s2", [SessionCreated(session_id="s2", created_at=1.0)])
        es.append_nowait("s1", SessionRenamed(title="a"))
        await es.append("s2", SessionRenamed(title="b"))
        # acknowledged: in the journal (synced); then, once the log writer ran
        # (flush waits for it), in both logs (page cache)
        await es.flush()
        (seg,) = segments(root)
        frames, end, why = decode_frames(OS_FILES.read_bytes(seg), 1)
        assert why is None and [no for no, _ in frames] == [1]
        (entries,) = [e for _, e in frames]
        assert {(sid, seq) for sid, seq, _, _, _ in entries} == {("s1", 2), ("s2", 2)}
        for sid, seq, offset, data, born in entries:
            assert born == zlib.crc32(read_log(OS_FILES, root, sid).split(b"\n")[0] + b"\n")
            assert read_log(OS_FILES, root, sid)[offset:] == data
        assert es.statistics().sync_mode == "journal"
    assert segments(root) == [], "a clean stop syncs the logs and removes the journal"
    assert os.listdir(journal_dir(root)) == []


async def test_a_round_syncs_the_logs_and_removes_the_segments_it_covers(root):
    async with open_event_store(root, journal_sync_interval=0, log_write_interval=0) as es:
        await es.create("s1", [SessionCreated(session_id="s1", created_at=1.0)])
        for i in range(5):
            await es.append("s1", SessionRenamed(title=f"t{i}"))
            with trio.fail_after(10):
                while es.statistics().log_syncs < i + 1:
                    await trio.sleep(0.01)
            assert len(segments(root)) <= 1
        assert es.statistics().segments_removed >= 4


def _power_cut_image(tmp_path, work, mode: str) -> tuple[str, RecordingFS]:
    live = str(tmp_path / "live")
    fs = RecordingFS(live)
    trio.run(work, live, fs)
    image = str(tmp_path / f"image-{mode}")
    crash_image(fs.ops, mode, image)
    return image, fs


@pytest.mark.parametrize("mode", ["drop", "torn", "zeros"])
def test_a_start_gives_back_what_only_the_journal_held(tmp_path, mode):
    """A power cut after the journal's sync, before the logs were synced: the
    logs lose, tear or zero their last lines; the start writes them back."""
    want: dict[str, bytes] = {}

    async def work(live: str, fs: RecordingFS) -> None:
        # a round never runs (interval 3600) and the block is never left: the cut
        # comes while the store is open, as a power cut does
        with trio.CancelScope() as cs:
            async with open_event_store(live, fs=fs, journal_sync_interval=3600) as es:
                for sid in ("a", "b"):
                    await es.create(sid, [SessionCreated(session_id=sid, created_at=1.0)])
                for i in range(3):
                    await es.append_many("a", [SessionRenamed(title=f"a{i}"), SessionRenamed(title="x" * 50)])
                    await es.append("b", SessionRenamed(title=f"b{i}"))
                await es.flush()
                for sid in ("a", "b"):
                    want[sid] = read_log(OS_FILES, live, sid)
                cs.cancel()
                fs.ops.append(("cut",))  # marks where the image is taken
                await trio.sleep_forever()

    live = str(tmp_path / "live")
    fs = RecordingFS(live)
    trio.run(work, live, fs)
    cut = fs.ops.index(("cut",))
    image = str(tmp_path / "image")
    crash_image(fs.ops[:cut], mode, image)
    before = {sid: read_log(OS_FILES, image, sid) for sid in want}
    assert any(before[sid] != want[sid] for sid in want), "the cut must lose something the journal holds"
    rep = apply_journal(OS_FILES, image)
    assert rep.records > 0 and set(rep.sessions) <= {"a", "b"}
    for sid, data in want.items():
        assert read_log(OS_FILES, image, sid) == data
        assert scan(sid, data).corrupt is None
    assert segments(image) == []
    again = apply_journal(OS_FILES, image)
    assert again.records == 0 and again.frames == 0, "applied once, then gone"


def test_a_session_created_again_under_the_id_of_a_deleted_one_gets_none_of_its_records(tmp_path):
    """Records of a deleted session still in the journal must not land in a new
    session of the same id: a birth marker separates them."""
    new_log: list[bytes] = []

    async def work(live: str, fs: RecordingFS) -> None:
        with trio.CancelScope() as cs:
            async with open_event_store(live, fs=fs, journal_sync_interval=3600) as es:
                await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
                for i in range(4):
                    await es.append("s", SessionRenamed(title=f"old {i} " + "y" * 40))
                await es.append("s", SessionDeleted())
                await es.remove("s")
                await es.create("s", [SessionCreated(session_id="s", created_at=2.0)])
                await es.append("s", SessionRenamed(title="new"))
                await es.flush()
                new_log.append(read_log(OS_FILES, live, "s"))
                cs.cancel()
                fs.ops.append(("cut",))
                await trio.sleep_forever()

    live = str(tmp_path / "live")
    fs = RecordingFS(live)
    trio.run(work, live, fs)
    for mode in ("drop", "keep", "torn", "zeros"):
        image = str(tmp_path / f"image-{mode}")
        crash_image(fs.ops[: fs.ops.index(("cut",))], mode, image)
        apply_journal(OS_FILES, image)
        assert read_log(OS_FILES, image, "s") == new_log[0], mode


def _copy_while_open(tmp_path, work) -> str:
    """Run `work(es)` on an open store and copy its folder before the clean
    stop (which would sync the logs and remove the journal): what a kill leaves."""
    live, copy = str(tmp_path / "live"), str(tmp_path / "copy")

    async def run() -> None:
        async with open_event_store(live, journal_sync_interval=3600) as es:
            await work(es)
            shutil.copytree(live, copy, ignore=shutil.ignore_patterns(".lock"))
    trio.run(run)
    return copy


def test_damage_in_the_journal_is_reported_and_applies_nothing_wrong(tmp_path):
    async def work(es) -> None:  # type: ignore[no-untyped-def]
        await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
        for i in range(3):
            await es.append("s", SessionRenamed(title=f"t{i}"))
    root = _copy_while_open(tmp_path, work)
    good = read_log(OS_FILES, root, "s")
    (seg,) = segments(root)
    data = bytearray(OS_FILES.read_bytes(seg))
    # lose the log's last two records, as a power cut would, and flip a bit
    # inside the journal's second frame
    lines = good.splitlines(keepends=True)
    with open(log_path(root, "s"), "r+b") as f:
        f.truncate(len(b"".join(lines[:2])))
    frames, _, _ = decode_frames(bytes(data), 1)
    first_len = len(encode_frame(1, frames[0][1]))
    data[first_len + 30] ^= 0x40
    with open(seg, "wb") as f:
        f.write(data)
    rep = apply_journal(OS_FILES, root)
    assert any("bad checksum" in n for n in rep.notes), rep.notes
    s = scan("s", read_log(OS_FILES, root, "s"))
    assert s.corrupt is None and [r.seq for r in s.records] == [1, 2], "nothing past the damage is invented"


def test_a_log_shorter_than_its_synced_part_is_reported_not_patched(tmp_path):
    async def work(es) -> None:  # type: ignore[no-untyped-def]
        await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
        await es.append("s", SessionRenamed(title="one"))
        await es.append("s", SessionRenamed(title="two"))
    root = _copy_while_open(tmp_path, work)
    with open(log_path(root, "s"), "r+b") as f:
        f.truncate(10)  # a disk that lost synced data
    rep = apply_journal(OS_FILES, root)
    assert rep.records == 0 and any("no readable first record" in n for n in rep.notes), rep.notes
    assert len(read_log(OS_FILES, root, "s")) == 10
    assert os.listdir(os.path.join(root, "journal-damaged-1")), "the journal is kept, not removed"


STREAM_AND_WAIT = r"""
import sys, trio
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store
async def main():
    cfg = StoreConfig(journal_sync_interval=3600)
    async with open_session_store(sys.argv[1], config=cfg) as store:
        meta, _ = await store.create_session(first_message="hi")
        async with store.inflight(meta.id) as msg:
            for i in range(50):
                msg.write("word ")
                store.saver.flush(msg)
            await store.es.flush()
            print(meta.id, msg.msg_id, flush=True)
            await trio.sleep_forever()
trio.run(main)
"""


async def streamed_then_killed(code: str, root: str) -> tuple[str, str]:
    """Run `code` (it prints a session id and a message id once it streamed),
    then SIGKILL it; the two ids."""
    p = child(code, root)
    assert p.stdout is not None
    line = await trio.to_thread.run_sync(p.stdout.readline)
    assert line, p.stderr.read() if p.stderr else ""
    os.kill(p.pid, signal.SIGKILL)
    await trio.to_thread.run_sync(p.wait, 30)
    sid, mid = line.split()
    return sid, mid


async def test_sigkill_mid_stream_then_a_start_applies_and_removes_the_journal(root):
    from sessionlog_store.server.stores import open_session_store
    sid, mid = await streamed_then_killed(STREAM_AND_WAIT, root)
    assert segments(root), "the killed server's journal is still there"
    before = read_logs(root)[sid]
    async with open_session_store(root) as store:
        assert store.recovery.journal.frames > 0
        assert store.recovery.journal.records == 0, "a kill keeps the page cache: the logs already held it all"
        m = (await store.load_session(sid)).messages[mid]
        assert m.status == "aborted" and m.content == "word " * 50
    assert read_logs(root)[sid].startswith(before)
    assert segments(root) == []


def test_records_of_a_deleted_session_never_reach_a_new_one_even_without_its_birth_marker(tmp_path):
    """Review finding: a damaged frame can take a birth marker with it; each
    journal entry names its log by the CRC of the log's first line, so the
    deleted session's records (its tombstone too) are not written into the
    new session's log, and the journal is kept for inspection."""
    async def work(es) -> None:  # type: ignore[no-untyped-def]
        await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
        await es.append("s", SessionRenamed(title="old"))
        await es.append("s", SessionDeleted())
        await es.remove("s")
        await es.create("s", [SessionCreated(session_id="s", created_at=2.0)])
        await es.append("s", SessionRenamed(title="new"))
        await es.flush()
    root = _copy_while_open(tmp_path, work)
    want = read_log(OS_FILES, root, "s")
    (seg,) = segments(root)
    data = bytearray(OS_FILES.read_bytes(seg))
    frames, _, _ = decode_frames(bytes(data), 1)
    pos = 0
    for no, entries in frames:
        n = len(encode_frame(no, entries))
        if any(e[2] == -1 for e in entries):
            data[pos + n - 1] ^= 0x01  # the birth marker's frame
        pos += n
    with open(seg, "wb") as f:
        f.write(data)
    with open(log_path(root, "s"), "r+b") as f:  # the new session lost its last line (a power cut)
        f.truncate(len(want.splitlines(keepends=True)[0]))
    rep = apply_journal(OS_FILES, root)
    assert any("damage" in n for n in rep.notes), rep.notes
    log = read_log(OS_FILES, root, "s")
    assert b"session_deleted" not in log and b'"old"' not in log
    assert want.startswith(log)
    assert os.path.isdir(os.path.join(root, "journal-damaged-1"))


async def test_reads_after_a_failed_log_write_still_see_what_was_acknowledged(root):
    """Review finding: a failed write of a log leaves acknowledged records in
    the journal only until a restart; reads (which go on) fold them in."""
    import errno

    from sessionlog_store.eventstore.local.fsio import FileOps
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.stores import open_session_store

    class FailLog(FileOps):
        target = ""

        def open_append(self, path):  # type: ignore[no-untyped-def]
            fd = super().open_append(path)
            if self.target and self.target in path:
                self.bad = fd
            return fd

        def write(self, fd, data):  # type: ignore[no-untyped-def]
            if self.target and fd == getattr(self, "bad", None):
                raise OSError(errno.EIO, "injected EIO")
            super().write(fd, data)
    fs = FailLog()
    cfg = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600, journal_sync_interval=3600)
    async with open_session_store(root, fs=fs, config=cfg) as store:
        meta, _ = await store.create_session(first_message="hi")
        fs.target = os.path.join(meta.id, "log.jsonl")
        mid = await store.append_message(meta.id, "acknowledged")  # in the journal: acknowledged
        with trio.fail_after(10):
            while store.failure() is None:
                await trio.sleep(0.01)
        store.states.clear()  # not in memory: read from the log
        state = await store.load_session(meta.id)
        assert state.messages[mid].content == "acknowledged"
    async with open_session_store(root) as store:  # the restart writes it back
        assert (await store.load_session(meta.id)).messages[mid].content == "acknowledged"


class GatedLogWrite(FileOps):
    """Files whose write of one log (`target`, set by the test) waits, in
    its worker thread, until the test releases it; then it fails (EIO) or
    goes through."""

    def __init__(self, *, fail: bool) -> None:
        self.fail, self.target, self.gated = fail, "", -1
        self.entered, self.release = threading.Event(), threading.Event()

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        if self.target and path.endswith(self.target):
            self.gated = fd
        return fd

    def write(self, fd: int, data: bytes) -> None:
        if self.target and fd == self.gated:
            self.entered.set()
            self.release.wait(60)
            if self.fail:
                raise OSError(errno.EIO, "injected EIO")
        super().write(fd, data)


async def test_a_failed_log_write_puts_its_lines_back_before_those_queued_during_it(root):
    """A log write that fails leaves its lines pending again, before the same
    session's lines queued while it was in flight: reads after the failure
    get every acknowledged record in order, and a restart writes them back.
    The sessions go back in the order their oldest lines came (a reader's
    was taken from the middle): defensive, as the writer ends after a
    failure and the written position is not worked out again today."""
    from sessionlog_store.eventstore.errors import StoreBroken

    async def read_s1(es) -> None:  # type: ignore[no-untyped-def]
        with pytest.raises(StoreBroken):
            await es.flush("s1")

    fs = GatedLogWrite(fail=True)
    with trio.fail_after(60):  # (a hang guard)
        async with open_event_store(root, fs=fs, journal_sync_interval=3600, log_write_interval=3600) as es:
            for sid in ("s0", "s1"):
                await es.create(sid, [SessionCreated(session_id=sid, created_at=1.0)])
            await es.append("s0", SessionRenamed(title="older, lingering"))
            fs.target = os.path.join("s1", "log.jsonl")
            await es.append("s1", SessionRenamed(title="A"))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_s1, es)  # wants s1 written now: taken from behind s0
                try:
                    await trio.to_thread.run_sync(fs.entered.wait, 60)
                    await es.append("s1", SessionRenamed(title="B"))  # acknowledged while A's write is in flight
                    assert list(es.writer.pending) == ["s0", "s1"] and es.writer.writing is not None
                finally:
                    fs.release.set()
            assert list(es.writer.pending) == ["s0", "s1"], "the sessions in the order their oldest lines came"
            assert es.writer.done
            assert [r.event.title for r in scan("s1", await es.log_bytes("s1")).records[1:]] == ["A", "B"]
            assert es.written_seq("s0") == 1 and es.broken is not None
    async with open_event_store(root):  # (its start writes back what the logs lack)
        pass
    assert [r.event.title for r in scan("s1", read_log(OS_FILES, root, "s1")).records[1:]] == ["A", "B"]
    assert [r.event.title for r in scan("s0", read_log(OS_FILES, root, "s0")).records[1:]] == ["older, lingering"]


async def test_loading_a_session_writes_its_log_and_leaves_the_others_lingering(root):
    """A page opening a session not in memory reads its log: the writer
    writes that log at once and nothing else (a store-wide flush wrote every
    running reply's lines in one burst at each such read)."""
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.stores import open_session_store
    cfg = StoreConfig(log_write_interval=3600, checkpoint_interval=3600, snapshot_interval=3600)
    async with open_session_store(root, config=cfg) as store:
        running, _ = await store.create_session(first_message="streams")
        cold, _ = await store.create_session(first_message="opened again")
        mid = await store.append_message(cold.id, "acknowledged, lingering")
        async with store.inflight(running.id) as msg:
            msg.write("word ")
            store.saver.flush(msg)
            await store.es.wait_durable(running.id, store.es.last_seq(running.id))
            store.states.clear()  # (not in memory: read from its log)
            with trio.fail_after(30):  # (a hang guard: the linger is an hour)
                state = await store.load_session(cold.id)
            assert state.messages[mid].content == "acknowledged, lingering"
            assert cold.id not in store.es.writer.pending
            assert running.id in store.es.writer.pending, "the running reply's lines linger on"
            assert store.es.written_seq(running.id) < store.es.durable_seq(running.id)


async def test_a_batch_of_birth_markers_only_does_not_count_off_a_write_in_flight(root):
    """A batch with no lines (a session created again under the id of a
    deleted one whose records the journal holds: only a birth marker) is
    counted off at once, unless a write is in flight: its lines are in no
    log yet, and a round trusting the written position would remove their
    segment."""
    fs = GatedLogWrite(fail=False)
    with trio.fail_after(60):  # (a hang guard)
        async with open_event_store(root, fs=fs, journal_sync_interval=3600, log_write_interval=3600) as es:
            for sid in ("s0", "x"):
                await es.create(sid, [SessionCreated(session_id=sid, created_at=1.0)])
            await es.append("x", SessionDeleted())
            await es.remove("x")  # (its records stay in the journal until a round)
            fs.target = os.path.join("s0", "log.jsonl")
            await es.append("s0", SessionRenamed(title="in flight"))
            s0_batch = es._committed_no
            async with trio.open_nursery() as nursery:
                nursery.start_soon(es.flush, "s0")
                try:
                    await trio.to_thread.run_sync(fs.entered.wait, 60)
                    await es.create("x", [SessionCreated(session_id="x", created_at=2.0)])  # a birth marker only
                    assert es._committed_no > s0_batch and es.writer.writing is not None
                    assert es.writer.written_no < s0_batch, "the line being written is in no log yet"
                finally:
                    fs.release.set()
            assert es.writer.written_no == es._committed_no and es.written_seq("s0") == 2


def test_verify_lists_a_kept_damaged_journal(tmp_path):
    from sessionlog_store.projections.rebuild import verify

    async def work(es) -> None:  # type: ignore[no-untyped-def]
        await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
        await es.append("s", SessionRenamed(title="one"))
    root = _copy_while_open(tmp_path, work)
    with open(log_path(root, "s"), "r+b") as f:
        f.truncate(5)  # the first line unreadable: the journal cannot be applied, so it is kept
    apply_journal(OS_FILES, root)
    _, problems = verify(OS_FILES, root)
    assert [p.session_id for p in problems if "could not fully apply" in p.what] == ["journal-damaged-1"], problems



async def test_the_log_writer_lingers_and_a_reader_never_waits_for_it(root):
    """Issue 29: acknowledged lines wait in the journal for the next
    batches' (one log write a second for a running reply, not four). A
    read of a session says which of its records it needs and the writer
    writes that log at once, whether its last line is queued or still
    filling, and only that log: the others linger on; a clean stop
    writes what lingers and removes the journal."""
    with trio.fail_after(60):  # (a hang guard: a stop that did not end the linger would wait the hour)
        await _linger_then_read(root)
    assert read_log(OS_FILES, root, "s2").count(b"\n") == 3
    assert segments(root) == [], "the stop wrote what lingered, synced the logs and removed the journal"


async def _linger_then_read(root: str) -> None:
    async with open_event_store(root, journal_sync_interval=3600, log_write_interval=3600) as es:
        await es.create("s1", [SessionCreated(session_id="s1", created_at=1.0)])
        await es.create("s2", [SessionCreated(session_id="s2", created_at=1.0)])
        created = read_log(OS_FILES, root, "s1")
        await es.append("s1", SessionRenamed(title="acknowledged"))
        await es.append("s2", SessionRenamed(title="lingers until the stop"))
        assert es.durable_seq("s1") == 2 and es.written_seq("s1") == 1, "acknowledged, not in the log yet"
        assert read_log(OS_FILES, root, "s1") == created
        es.append_nowait("s1", SessionRenamed(title="still filling"))
        with trio.fail_after(30):  # (a hang guard: without `want`, the read waits the hour out)
            records = await es.read("s1")
        assert [r.event.title for r in records[1:]] == ["acknowledged", "still filling"]
        assert read_log(OS_FILES, root, "s1").count(b"\n") == 3 and es.written_seq("s1") == 3
        assert "s2" in es.writer.pending and es.written_seq("s2") == 1, "a read of s1 leaves s2's line lingering"
        assert read_log(OS_FILES, root, "s2").count(b"\n") == 1
        assert not es.writer.wanted, "nothing wanted once the read has its records"
        await es.append("s2", SessionRenamed(title="pending at the stop"))  # (lingers: the stop must write it)


LINGER_AND_WAIT = r"""
import sys, trio
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store
async def main():
    cfg = StoreConfig(log_write_interval=3600)
    async with open_session_store(sys.argv[1], config=cfg) as store:
        meta, _ = await store.create_session(first_message="hi")
        await store.es.flush()
        async with store.inflight(meta.id) as msg:
            for i in range(50):
                msg.write("word ")
                store.saver.flush(msg)
            await store.es.wait_durable(meta.id, store.es.last_seq(meta.id))
            assert store.es.written_seq(meta.id) < store.es.durable_seq(meta.id)
            print(meta.id, msg.msg_id, flush=True)
            await trio.sleep_forever()
trio.run(main)
"""


async def test_sigkill_while_acknowledged_records_linger_then_a_start_gives_them_back(root):
    """The records a lingering log writer had not written yet are in the
    journal only, and the start after a SIGKILL writes them into the log."""
    from sessionlog_store.server.stores import open_session_store
    sid, mid = await streamed_then_killed(LINGER_AND_WAIT, root)
    assert b"word" not in read_logs(root)[sid], "the killed server had not written the reply into the log"
    async with open_session_store(root) as store:
        assert store.recovery.journal.records >= 50
        m = (await store.load_session(sid)).messages[mid]
        assert m.status == "aborted" and m.content == "word " * 50
    assert read_logs(root)[sid].count(b"word") >= 50
    assert segments(root) == []


async def test_each_log_is_written_when_its_own_oldest_line_is_due_not_all_at_once(root, mock_clock):
    """The linger is per session: a log's lines are written once its oldest
    has waited `log_write_interval`, in the order they came, so the writes
    stay spread over the interval as the records are (writing everything
    queued at once held the GIL for a burst of 10,000 writes)."""
    mock_clock.rate = 1  # (real time, plus the jumps below)
    async with open_event_store(root, journal_sync_interval=3600, log_write_interval=3600) as es:
        for sid in ("s1", "s2"):
            await es.create(sid, [SessionCreated(session_id=sid, created_at=1.0)])
        await es.append("s1", SessionRenamed(title="first"))
        queued = trio.current_time()  # (s1's line joins the writer's pending lines when acknowledged)
        mock_clock.jump(100)
        await es.append("s2", SessionRenamed(title="second"))
        s2_batch = es._committed_no
        mock_clock.jump(queued + 3600 + 50 - trio.current_time())  # s1's line due, s2's in 50 s
        with trio.fail_after(30):
            while es.written_seq("s1") < 2:
                await es.writer.written.wait()
        assert es.written_seq("s2") == 1 and read_log(OS_FILES, root, "s2").count(b"\n") == 1, \
            "only the log whose line was due is written"
        assert es.writer.written_no == s2_batch - 1, "the written position stops before s2's batch"
        await es.sync_round()  # (a round removes only segments whose batches are all in the logs)
        left = [e for seg in segments(root) for _, entries in decode_frames(OS_FILES.read_bytes(seg), 1)[0]
                for e in entries]
        assert any(e[0] == "s2" for e in left), "the journal keeps s2's line until its log has it"
        mock_clock.jump(100)
        with trio.fail_after(30):
            while es.written_seq("s2") < 2:
                await es.writer.written.wait()
        assert not es.writer.pending and es.writer.written_no == es._committed_no, "every batch counted off"
