"""Simulated power loss, in process. `kill -9` keeps the page cache, so it
cannot test fsync ordering; here every file operation of a real store is
recorded (tests/simdisk.py) and the disk is rebuilt as it could be after a
power cut at every point, with unsynced writes dropped, kept, torn or zeroed
and unsynced names lost. Each image is recovered and checked: every
acknowledged byte present and in order, checkpoint + tail replay equal to a
full replay, no `running` left, and every open succeeds."""
from __future__ import annotations

import itertools
import os
import random
import shutil
from dataclasses import dataclass, field

import msgspec
import pytest
import trio

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.projections.recovery import recover_registry
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .simdisk import MODES, RecordingFS, crash_image

ENC = msgspec.json.Encoder()
CONFIG = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600, progress_interval=3600)
# the journal's round (sync the logs, remove segments) after every batch
ROUNDS = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600, progress_interval=3600,
                     journal_sync_interval=0)
IMAGES_PER_RUN = int(os.environ.get("SESSIONLOG_POWERLOSS_IMAGES", "1200"))


@dataclass
class Workload:
    ops: list[tuple] = field(default_factory=list)                 # the recorded file operations
    acked: list[tuple[int, str, bytes]] = field(default_factory=list)  # (op index, sid, durable log prefix)
    deleting: list[tuple[int, int, str]] = field(default_factory=list)  # (started, acked or -1, sid)


async def run_workload(live: str, steps: list[str], seed: int, config: StoreConfig = CONFIG) -> Workload:
    rng = random.Random(seed)
    fs = RecordingFS(live)
    w = Workload()
    async with open_session_store(live, fs=fs, config=config) as store:
        sids: list[str] = []

        async def ack(sid: str) -> None:
            # Acknowledged now (the journal's sync), perhaps not yet in the log
            # file: the bytes are read once the log writer wrote them, but they
            # count from this op on (a cut between the journal's sync and the
            # log write must keep them).
            at = len(fs.ops)
            es = store.es
            whole = es.durable_seq(sid) == es.last_seq(sid)
            end = es._session(sid).end
            await es.flush()
            if not whole:  # something not yet acknowledged came along (a title): count from now
                at, end = len(fs.ops), es.durable_end(sid)
            with open(log_path(live, sid), "rb") as f:
                w.acked.append((at, sid, f.read(end)))

        for step in steps:
            alive = [s for s in sids if s in store.registry]
            if step == "create" or not alive:
                meta, _ = await store.create_session(first_message="hi" if rng.random() < 0.5 else None)
                sids.append(meta.id)
                await ack(meta.id)
                continue
            sid = rng.choice(alive)
            if step == "append":
                await store.append_message(sid, f"message {rng.random():.6f}")
                await ack(sid)
            elif step == "reply":
                async with store.inflight(sid) as msg:
                    for _ in range(rng.randint(1, 3)):
                        msg.write("chunk ")
                        store.saver.flush(msg)
                        await store.es.flush()
                    if rng.random() < 0.3:  # leave it running, as a crash would
                        store.saver.end(msg)
                        msg.finished = True
                await ack(sid)
            elif step == "rename":
                await store.rename_session(sid, f"title {rng.randint(0, 99)}")
                await ack(sid)
            elif step == "checkpoint":
                await store.write_checkpoint()
                await store.load_session(sid)
                await store.write_snapshot(sid)
            elif step == "delete":
                start = len(fs.ops)
                await store.delete_session(sid)
                w.deleting.append((start, len(fs.ops), sid))
        w.ops = list(fs.ops)
    return w


def check_image(image: str, w: Workload, k: int, *, open_store: bool) -> None:
    registry, _, _ = recover_registry(OS_FILES, image, use_checkpoint=True, repair=True)
    full, _, _ = recover_registry(OS_FILES, image, use_checkpoint=False, repair=False)
    assert {s: ENC.encode(m) for s, m in registry.rows.items()} == \
        {s: ENC.encode(m) for s, m in full.rows.items()}, "checkpoint + tail == full replay"
    gone = {sid for start, end, sid in w.deleting if end <= k}
    maybe_gone = {sid for start, end, sid in w.deleting if start <= k < end}
    for at, sid, prefix in w.acked:
        if at > k or sid in gone or sid in maybe_gone:
            continue
        path = log_path(image, sid)
        assert os.path.exists(path), f"acknowledged session {sid} lost at op {k}"
        with open(path, "rb") as f:
            assert f.read().startswith(prefix), f"acknowledged records of {sid} lost at op {k}"
        assert sid in registry
    for sid in gone:
        assert sid not in registry and not os.path.exists(os.path.dirname(log_path(image, sid)))
    if open_store:
        async def reopen() -> None:
            async with open_session_store(image, config=CONFIG) as store:
                for meta in store.registry.rows.values():
                    assert not meta.open_msgs and meta.status == "idle", "nothing running after a restart"
        trio.run(reopen)


def crash_everywhere(w: Workload, points: list[int], scratch: str, open_every: int) -> int:
    n = 0
    for k in points:
        for mode in MODES:
            image = os.path.join(scratch, f"img-{k}-{mode}")
            crash_image(w.ops[:k], mode, image)
            check_image(image, w, k, open_store=n % open_every == 0)
            shutil.rmtree(image)
            n += 1
    return n


STEPS = ["create", "append", "reply", "rename", "checkpoint", "delete"]


@pytest.mark.slow
def test_random_workloads_survive_a_power_cut_at_every_point(tmp_path):
    images = 0
    seed = 0
    while images < IMAGES_PER_RUN:
        rng = random.Random(seed)
        steps = ["create"] + [rng.choice(STEPS) for _ in range(12)]
        live = str(tmp_path / f"live{seed}")
        # odd seeds: journal rounds interleave with the batches (cuts inside a
        # round, between a round's sync and its segment removal)
        w = trio.run(run_workload, live, steps, seed, ROUNDS if seed % 2 else CONFIG)
        want = max(1, (IMAGES_PER_RUN - images) // len(MODES))
        stride = max(1, len(w.ops) // want)
        points = list(range(0, len(w.ops) + 1, stride))
        images += crash_everywhere(w, points, str(tmp_path / "scratch"), open_every=25)
        seed += 1
    print(f"power-loss images checked: {images} (random workloads: {seed})")
    assert images >= IMAGES_PER_RUN


ALPHABET = ["create", "append", "reply", "delete"]
# Every workload of up to three operations after the first create, numbered
# as they were enumerated (the number seeds it and picks its config).
EXHAUSTIVE = [steps for length in (1, 2, 3) for steps in itertools.product(ALPHABET, repeat=length)]


@pytest.mark.slow
@pytest.mark.parametrize("first", ALPHABET)
def test_every_workload_of_up_to_three_operations_at_every_point(tmp_path, first):
    """In four parts by the workload's first step (the suite's two processes
    share them out); together every one of the 4 + 16 + 64 workloads."""
    assert len(EXHAUSTIVE) == 4 + 16 + 64
    images = workloads = 0
    for number, steps in enumerate(EXHAUSTIVE):
        if steps[0] != first:
            continue
        live = str(tmp_path / f"w{number}")
        w = trio.run(run_workload, live, ["create", *steps], number, ROUNDS if number % 2 else CONFIG)
        images += crash_everywhere(w, list(range(len(w.ops) + 1)), str(tmp_path / "scratch"),
                                   open_every=97)
        shutil.rmtree(live)
        workloads += 1
    print(f"exhaustive, first step {first}: {workloads} workloads, {images} power-loss images")
    assert workloads == 1 + 4 + 16


def test_the_model_loses_what_was_not_synced(tmp_path):
    """The simulator itself: unsynced bytes and names vanish, synced ones stay."""
    ops = [("mkdir", "d"), ("create", "d/f"), ("write", "d/f", b"abc"), ("sync", "d/f"),
           ("write", "d/f", b"def")]
    crash_image(ops, "drop", str(tmp_path / "a"))
    assert not os.path.exists(tmp_path / "a" / "d"), "directory never synced into its parent"
    crash_image(ops + [("sync_dir", "."), ("sync_dir", "d")], "drop", str(tmp_path / "b"))
    assert (tmp_path / "b" / "d" / "f").read_bytes() == b"abc"
    crash_image(ops + [("sync_dir", "."), ("sync_dir", "d")], "zeros", str(tmp_path / "c"))
    assert (tmp_path / "c" / "d" / "f").read_bytes() == b"abc\x00\x00\x00"
    crash_image(ops + [("syncfs",)], "drop", str(tmp_path / "e"))
    assert (tmp_path / "e" / "d" / "f").read_bytes() == b"abcdef"


def test_a_folder_removed_and_made_again_starts_empty_in_the_model(tmp_path):
    """Review finding (the simulator): a durable removal of a folder takes its
    durable files along; a folder made again under that name is empty."""
    ops = [("mkdir", "d"), ("sync_dir", "."), ("create", "d/f"), ("write", "d/f", b"x"), ("sync", "d/f"),
           ("sync_dir", "d"), ("rmtree", "d"), ("sync_dir", "."), ("mkdir", "d"), ("sync_dir", ".")]
    crash_image(ops, "drop", str(tmp_path / "a"))
    assert os.listdir(tmp_path / "a" / "d") == []


def _baseline_ops(root: str) -> list[tuple]:
    """Operations that make a model disk hold `root`'s files, all durable."""
    ops: list[tuple] = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel != ".":
            ops.append(("mkdir", rel))
        for name in sorted(files):
            with open(os.path.join(d, name), "rb") as f:
                ops.append(("write_file", os.path.normpath(os.path.join(rel, name)), f.read()))
    dirs_rel = sorted({os.path.dirname(op[1]) or "." for op in ops if op[0] == "write_file"}
                      | {op[1] for op in ops if op[0] == "mkdir"} | {"."})
    ops += [("sync_dir", d) for d in dirs_rel]
    return ops


@pytest.mark.slow
def test_repair_under_a_power_cut_at_every_point(tmp_path):
    """`sessionlog repair` (item 9): at every cut point the removed bytes are
    either still in the log or saved under a durable name, and no cache
    reflects the log past the cut."""
    from sessionlog_store.eventstore.local.log import read_log
    from sessionlog_store.eventstore.record import scan
    from sessionlog_store.projections.rebuild import repair
    from sessionlog_store.projections.recovery import load_session_state
    live = str(tmp_path / "live")

    async def make() -> str:
        async with open_session_store(live, config=StoreConfig(snapshot_interval=0)) as store:
            meta, _ = await store.create_session(first_message="one")
            for text in ("two", "three", "four"):
                await store.append_message(meta.id, text)
            await store.load_session(meta.id)
            await store.write_snapshot(meta.id)
            return meta.id
    sid = trio.run(make)
    path = log_path(live, sid)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[data.index(b'"three"') + 2] ^= 0x01  # damage in the middle: quarantined
    with open(path, "wb") as f:
        f.write(data)
    base = _baseline_ops(live)
    fs = RecordingFS(live)
    repair(fs, live, sid)
    ops = base + fs.ops
    good_end = scan(sid, bytes(data), expect_seq=1).good_end
    images = 0
    for k in range(len(base), len(ops) + 1):
        for mode in MODES:
            image = str(tmp_path / f"img-{k}-{mode}")
            crash_image(ops[:k], mode, image)
            ipath = log_path(image, sid)
            with open(ipath, "rb") as f:
                now = f.read()
            copies = sorted(p for p in os.listdir(os.path.dirname(ipath)) if ".corrupt-" in p)
            if now != bytes(data):
                assert now == bytes(data[:good_end]), f"the log is cut elsewhere at op {k} ({mode})"
                assert copies, f"the removed bytes are lost at op {k} ({mode})"
                with open(os.path.join(os.path.dirname(ipath), copies[0]), "rb") as f:
                    assert f.read() == bytes(data[good_end:])
                assert not os.path.exists(os.path.join(image, "index.json"))
                state, _ = load_session_state(OS_FILES, image, sid)
                full, _ = load_session_state(OS_FILES, image, sid, use_snapshot=False)
                assert ENC.encode([state.meta, list(state.messages.values())]) == \
                    ENC.encode([full.meta, list(full.messages.values())]), f"a stale cache at op {k} ({mode})"
                check_image(image, Workload(), 0, open_store=(k + images) % 7 == 0)
            shutil.rmtree(image)
            images += 1
    assert images >= 4 * len(fs.ops)
    assert read_log(OS_FILES, live, sid) == bytes(data[:good_end])


def test_a_syncfs_covers_only_what_was_written_before_it_began(tmp_path):
    """The simulator's syncfs (issue 12 prepares a journal whose log sync runs
    beside other writers): a write made while a syncfs runs is not durable by
    it, and a cut between its begin and end keeps nothing of it."""
    ops = [("mkdir", "d"), ("sync_dir", "."), ("create", "d/f"), ("sync_dir", "d"), ("write", "d/f", b"abc"),
           ("syncfs_begin", 1), ("write", "d/f", b"def"), ("create", "d/g"), ("syncfs", 1)]
    crash_image(ops, "drop", str(tmp_path / "a"))
    assert (tmp_path / "a" / "d" / "f").read_bytes() == b"abc"
    assert not (tmp_path / "a" / "d" / "g").exists()
    crash_image(ops[:-1], "drop", str(tmp_path / "b"))  # cut during the syncfs
    assert (tmp_path / "b" / "d" / "f").read_bytes() == b""
    crash_image(ops + [("syncfs_begin", 2), ("syncfs", 2)], "drop", str(tmp_path / "c"))
    assert (tmp_path / "c" / "d" / "f").read_bytes() == b"abcdef" and (tmp_path / "c" / "d" / "g").exists()


@pytest.mark.slow
def test_the_start_that_applies_the_journal_survives_a_power_cut_at_every_point(tmp_path):
    """Issue 12: a cut while a start writes the journal's records back into the
    logs (truncate, write, syncfs, segment removal) loses nothing: the next
    start finishes the job."""
    images = 0
    for seed in range(3):
        live = str(tmp_path / f"live{seed}")
        steps = ["create", "append", "reply", "create", "append", "rename", "reply"]
        w = trio.run(run_workload, live, steps, seed)
        # the last point before the clean stop's round: the logs' last lines
        # are in the journal only
        k = max(i for i, op in enumerate(w.ops) if op[0] == "sync" and op[1].startswith("journal"))  + 1
        for mode in ("drop", "torn", "zeros"):
            first = str(tmp_path / f"first-{seed}-{mode}")
            crash_image(w.ops[:k], mode, first)
            base = _baseline_ops(first)
            fs = RecordingFS(first)
            recover_registry(fs, first, repair=True)
            assert any(op[0] == "truncate" or op[0] == "write" for op in fs.ops), "the start wrote records back"
            ops = base + fs.ops
            for cut in range(len(base), len(ops) + 1):
                for mode2 in MODES:
                    image = str(tmp_path / f"img-{cut}-{mode2}")
                    crash_image(ops[:cut], mode2, image)
                    check_image(image, w, k, open_store=images % 11 == 0)
                    shutil.rmtree(image)
                    images += 1
    print(f"power-loss images during the journal's re-apply: {images}")
