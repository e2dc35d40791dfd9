"""Damage that used to lose data or stop the server (issue 11, items 5 and 7,
and the smaller items): damage in line 1, a log without `session_created`,
`repair` that would empty a log, a damaged project log, damage behind the
checkpoint, a snapshot newer than its log, left-over temp files."""
from __future__ import annotations

import glob
import os

import pytest
import trio

from sessionlog_store.eventstore.errors import SessionReadOnly
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import log_path, project_log_path
from sessionlog_store.projections.checkpoint import snapshot_path
from sessionlog_store.projections.rebuild import RepairRefused, repair
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli


async def two_sessions(root: str) -> list[str]:
    async with open_session_store(root) as store:
        ids = []
        for i in range(2):
            meta, _ = await store.create_session(first_message=f"first {i}")
            await store.append_message(meta.id, f"second {i}")
            ids.append(meta.id)
    return ids


def flip(path: str, needle: bytes) -> None:
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[data.index(needle)] ^= 0x01
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("checkpoint", [True, False])
async def test_damage_in_line_1_quarantines_the_session_and_never_removes_it(root, checkpoint):
    ids = await two_sessions(root)
    if not checkpoint:
        os.unlink(os.path.join(root, "index.json"))
    flip(log_path(root, ids[0]), b"session_created")
    for _ in range(2):  # a second start changes nothing either
        async with open_session_store(root) as store:
            with trio.fail_after(10):  # with a checkpoint, the check after startup finds line 1
                await store.checked.wait()
            rows = {r["id"]: r for r in store.list_sessions()[0]}
            assert set(rows) == set(ids), "the damaged session is listed"
            assert rows[ids[0]]["damaged"].startswith("line 1:")
            assert "damaged" not in rows[ids[1]]
            state = await store.load_session(ids[0])  # what is known: the good records after the damage
            assert state.meta is not None and state.meta.id == ids[0]
            with pytest.raises(SessionReadOnly):
                await store.append_message(ids[0], "refused")
            await store.append_message(ids[1], "the rest of the store works")
    assert os.path.exists(log_path(root, ids[0]))
    r = run_cli("verify", "--root", root)
    assert r.returncode == 1 and f"{ids[0]} line 1" in r.stdout


async def test_repair_refuses_to_empty_a_log_and_never_destroys_its_copy(root):
    ids = await two_sessions(root)
    path = log_path(root, ids[0])
    with open(path, "rb") as f:
        original = f.read()
    flip(path, b"session_created")
    with open(path, "rb") as f:
        damaged = f.read()
    r = run_cli("repair", "--root", root, ids[0])
    assert r.returncode == 3 and "--allow-empty" in r.stderr and "Traceback" not in r.stderr
    with open(path, "rb") as f:
        assert f.read() == damaged, "a refused repair changes nothing"
    with pytest.raises(RepairRefused):
        repair(OS_FILES, root, ids[0])
    r = run_cli("repair", "--root", root, ids[0], "--allow-empty")
    assert r.returncode == 0, r.stderr
    assert os.path.getsize(path) == 0
    for _ in range(2):
        async with open_session_store(root) as store:
            rows = {r["id"]: r for r in store.list_sessions()[0]}
            assert "damaged" in rows[ids[0]], "an emptied log stays listed as damaged"
    copies = glob.glob(path + ".corrupt-*")
    assert len(copies) == 1
    with open(copies[0], "rb") as f:
        assert f.read() == damaged
    assert len(original) == len(damaged)


async def test_records_without_session_created_are_quarantined_not_removed(root):
    ids = await two_sessions(root)
    path = log_path(root, ids[0])
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    # Valid records, but the first (session_created) is gone: rewrite seqs from 1.
    from sessionlog_store.eventstore.record import decode_record, encode_record
    recs = [decode_record(ln) for ln in lines[1:]]
    with open(path, "wb") as f:
        for i, rec in enumerate(recs, 1):
            f.write(encode_record(i, rec.ts, rec.event))
    os.unlink(os.path.join(root, "index.json"))
    async with open_session_store(root) as store:
        rows = {r["id"]: r for r in store.list_sessions()[0]}
        assert "session_created" in rows[ids[0]]["damaged"]
    assert os.path.exists(path)


async def test_an_interrupted_creation_is_removed_but_a_tombstone_is_needed_for_a_deletion(root):
    ids = await two_sessions(root)
    folder = os.path.dirname(log_path(root, "never-acked"))
    os.makedirs(folder)
    open(os.path.join(folder, "log.jsonl"), "wb").close()  # created, nothing written: never acknowledged
    async with open_session_store(root) as store:
        assert store.recovery is not None and store.recovery.unfinished_creations == ["never-acked"]
        assert sorted(r["id"] for r in store.list_sessions()[0]) == sorted(ids)
    assert not os.path.exists(folder)


async def test_a_damaged_project_log_is_served_read_only_and_verify_and_repair_cover_it(root):
    home = os.path.join(os.path.dirname(root), "work")
    for d in ("a", "b", "c"):
        os.makedirs(os.path.join(home, d))
    async with open_session_store(root) as store:
        pa = await store.create_project("A", os.path.join(home, "a"))
        pb = await store.create_project("B", os.path.join(home, "b"))
        await store.create_project("C", os.path.join(home, "c"))
        meta, _ = await store.create_session(project_id=pa.id, first_message="hi")
    flip(project_log_path(root), b'"B"')
    r = run_cli("verify", "--root", root)
    assert r.returncode == 1 and "projects line 2" in r.stdout, r.stdout
    async with open_session_store(root) as store:  # the server starts with it
        assert store.projects.damage is not None
        assert [p.id for p in store.list_projects()] == ["default", pa.id]
        assert store.get_row(meta.id)["project"]["id"] == pa.id
        with pytest.raises(SessionReadOnly):
            await store.create_project("C", os.path.join(home, "c"))
    r = run_cli("repair", "--root", root, "projects")
    assert r.returncode == 0 and "kept 1 good records" in r.stdout, r.stdout + r.stderr
    assert run_cli("verify", "--root", root).returncode == 0
    async with open_session_store(root) as store:
        assert store.projects.damage is None
        await store.create_project("B again", os.path.join(home, "b"))
    assert pb.id not in [p.id for p in store.list_projects()]


async def test_a_server_starts_with_a_damaged_project_log(root):
    from .test_stop import TOKEN, start_serve
    async with open_session_store(root) as store:
        for d in ("pa", "pb"):
            os.makedirs(os.path.join(root, "..", d), exist_ok=True)
        await store.create_project("A", os.path.abspath(os.path.join(root, "..", "pa")))
        await store.create_project("B", os.path.abspath(os.path.join(root, "..", "pb")))
    flip(project_log_path(root), b'"A"')
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root))
    try:
        from sessionlog_store.server.edge.client import open_client
        async with open_client("127.0.0.1", port, TOKEN) as c:
            assert [x["id"] for x in (await c.request("list_projects"))["projects"]] == ["default"]
            assert (await c.request("list_sessions"))["total"] == 0
    finally:
        p.terminate()
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    assert p.returncode == 0
    assert "project log is read-only" in err


async def test_damage_behind_the_checkpoint_is_found_after_startup(root):
    ids = await two_sessions(root)
    async with open_session_store(root) as store:  # a checkpoint covering everything
        await store.write_checkpoint()
    flip(log_path(root, ids[0]), b"first 0")
    async with open_session_store(root) as store:
        assert store.recovery is not None and store.recovery.full_replays == 0  # startup read tails only
        with trio.fail_after(10):
            await store.checked.wait()
        rows = {r["id"]: r for r in store.list_sessions()[0]}
        assert "damaged" in rows[ids[0]] and "damaged" not in rows[ids[1]]
        with pytest.raises(SessionReadOnly):
            await store.append_message(ids[0], "refused")
        await store.append_message(ids[1], "fine")


async def test_a_snapshot_newer_than_its_log_is_not_trusted(root):
    async with open_session_store(root, config=StoreConfig(snapshot_interval=0)) as store:
        meta, _ = await store.create_session(first_message="one")
        await store.append_message(meta.id, "two")
        await store.append_message(meta.id, "three")
        await store.load_session(meta.id)
        assert await store.write_snapshot(meta.id)
    path = log_path(root, meta.id)
    with open(path, "rb") as f:
        lines = f.read().splitlines(keepends=True)
    with open(path, "wb") as f:  # the log lost its last record (a cut log), the snapshot still has it
        f.writelines(lines[:-1])
    os.unlink(os.path.join(root, "index.json"))
    async with open_session_store(root) as store:
        msgs = await store.get_messages(meta.id)
        assert [m.content for m in msgs] == ["one", "two"]
    r = run_cli("verify", "--root", root)
    assert "snapshot.json is ahead of the log" in r.stdout


async def test_left_over_temp_files_are_removed_at_start(root):
    ids = await two_sessions(root)
    tmps = [snapshot_path(root, ids[0]) + ".tmp", os.path.join(root, "index.json.tmp")]
    for t in tmps:
        open(t, "wb").close()  # a failed checkpoint write leaves a 0-byte temp file
    r = run_cli("verify", "--root", root)
    assert r.returncode == 1 and "left-over temp file" in r.stdout
    async with open_session_store(root) as store:
        assert store.recovery is not None and sorted(store.recovery.temp_files) == sorted(tmps)
    assert not any(os.path.exists(t) for t in tmps)
    assert run_cli("verify", "--root", root).returncode == 0
