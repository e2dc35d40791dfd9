"""Regressions for what a fresh adversarial review of the protocol work
(issue 13) found; each broke on the first version."""
from __future__ import annotations

import os
import signal

import pytest
import trio

from sessionlog_store.eventstore.errors import SessionReadOnly
from sessionlog_store.eventstore.events import MessageCreated
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.projections.maintenance import MaintenanceConfig
from sessionlog_store.server.edge.client import ServerError, open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli
from .test_damage_more import flip, two_sessions
from .test_stop import TOKEN, start_serve
from .test_ws import start_server


async def damaged_behind_checkpoint_with_a_running_reply(root: str) -> str:
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="first 0")
        await store.append_message(meta.id, "second 0")
        # A placeholder left running by a writer that died.
        await store.es.append(meta.id, MessageCreated(msg_id="orphan", role="assistant", kind="llm_reply",
                                                      status="running"))
        await store.write_checkpoint()
    flip(log_path(root, meta.id), b"first 0")
    return meta.id


async def test_a_damaged_session_needing_a_startup_write_does_not_stop_the_start(root):
    sid = await damaged_behind_checkpoint_with_a_running_reply(root)
    for _ in range(2):
        async with open_session_store(root) as store:
            row = store.get_row(sid)
            assert "damaged" in row and row["status"] == "idle"
            assert store.aborted_at_start == []
            sub = await store.subscribe(sid, "orphan")  # ends at once: nothing will finalize it
            updates = [u async for u in sub]
            assert updates[-1].status == "aborted" and updates[-1].aborted_reason == "session quarantined"
            assert store.hub.count() == 0


async def test_an_expired_damaged_archive_is_left_alone_and_the_summary_says_what_was_done(root, caplog):
    import logging
    ids = await two_sessions(root)
    async with open_session_store(root) as store:
        for sid in ids:
            await store.set_archived(sid, True)
        await store.write_checkpoint()
    flip(log_path(root, ids[0]), b"first 0")
    caplog.set_level(logging.INFO, logger="sessionlog")
    await trio.sleep(0.01)
    r = run_cli("maintenance", "--root", root, "--dry-run", "--archive-ttl-days", "0.0000001")
    async with open_session_store(root, config=StoreConfig(maintenance=MaintenanceConfig(archive_ttl=0.001))) as store:
        removed = [s for s, _ in store.removed_at_start]
        assert ids[0] in store.registry and "damaged" in store.get_row(ids[0])
    assert removed == [ids[1]]
    summary = [x.getMessage() for x in caplog.records if x.getMessage().startswith("maintenance:")]
    assert summary and "1 expired archive(s)" in summary[-1]
    assert f"would remove {ids[1]}" in r.stdout


async def test_a_new_subscription_after_a_store_failure_ends(root):
    import errno

    from .test_faults import FaultyFS
    fs = FaultyFS("write", errno.EIO, permanent=True)
    async with open_session_store(root, fs=fs, config=StoreConfig(progress_interval=0.01)) as store:
        meta, _ = await store.create_session(first_message="x")
        await store.es.append(meta.id, MessageCreated(msg_id="left", role="assistant", kind="llm_reply",
                                                      status="running"))
        fs.armed = True
        with pytest.raises(Exception):
            await store.append_message(meta.id, "breaks the store")
        sub = await store.subscribe(meta.id, "left")
        with trio.fail_after(5):
            updates = [u async for u in sub]
        assert updates[-1].aborted_reason == "store failure" and store.hub.count() == 0


@pytest.mark.slow
async def test_a_stopping_server_sends_every_subscriber_its_terminal_update(root):
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--agent-speed", "8"))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as chatter, open_client("127.0.0.1", port, TOKEN) as other:
            ack = await chatter.request("chat", content="a long answer")
            key = (ack["session_id"], ack["reply_id"])
            await other.request("subscribe_msg", session_id=key[0], msg_id=key[1], offset=0)
            with trio.fail_after(20):
                while not other.content.get(key):
                    await trio.sleep(0.02)
            p.send_signal(signal.SIGTERM)
            with trio.fail_after(20):
                status = await other.wait_done(*key)
            last = [f for f in other.pushes if f["type"] == "msg_update"][-1]["data"]
            assert status == "aborted" and last["aborted_reason"] == "server shutdown"
        await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0


async def test_relocation_races_and_refusals_change_nothing(root, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    link = tmp_path / "home-link"
    link.symlink_to(home)
    a, b, target = tmp_path / "a", tmp_path / "b", tmp_path / "t"
    for d in (a, b, target):
        d.mkdir()
    async with open_session_store(root, config=StoreConfig(home=str(link), project_roots=(str(tmp_path),))) as store:
        pa = await store.create_project("a", str(a))
        pb = await store.create_project("b", str(b))
        sa, _ = await store.create_session(project_id=pa.id, first_message="in a")
        sb, _ = await store.create_session(project_id=pb.id, first_message="in b")
        a.rename(tmp_path / "a-gone")
        b.rename(tmp_path / "b-gone")
        with pytest.raises(Exception) as e:
            await store.relocate_project(sa.id, pa.id, str(home))  # the home, through its real path
        assert getattr(e.value, "code", None) == "bad_path", "the home is never a project's folder"
        results = []

        async def move(sid: str, pid: str) -> None:
            try:
                results.append(await store.relocate_project(sid, pid, str(target)))
            except Exception as err:  # noqa: BLE001
                results.append(getattr(err, "code", err))
        async with trio.open_nursery() as n:
            n.start_soon(move, sa.id, pa.id)
            n.start_soon(move, sb.id, pb.id)
        assert sorted(str(r) if isinstance(r, str) else "ok" for r in results) == ["ok", "path_in_use"]
        paths = [p.path for p in store.list_projects() if p.id in (pa.id, pb.id)]
        assert paths.count(str(target)) == 1


async def test_a_refused_relocation_of_a_damaged_session_leaves_the_project_alone(root, tmp_path):
    a, new = tmp_path / "a", tmp_path / "new"
    a.mkdir()
    new.mkdir()
    async with open_session_store(root) as store:
        pa = await store.create_project("a", str(a))
        meta, _ = await store.create_session(project_id=pa.id, first_message="first 0")
        await store.append_message(meta.id, "second")
    flip(log_path(root, meta.id), b"first 0")
    os.unlink(os.path.join(root, "index.json"))
    a.rename(tmp_path / "gone")
    async with open_session_store(root) as store:
        with pytest.raises(SessionReadOnly):
            await store.relocate_project(meta.id, pa.id, str(new))
        assert store.projects.get(pa.id).path == str(a)


async def test_rows_patched_from_pushes_follow_a_relocation(root, nursery, tmp_path):
    from .test_protocol_truth import fresh_rows, patched_rows_settle
    server = await start_server(nursery, root, speed=0.0, tokens=(2, 3))
    a, moved = tmp_path / "a", tmp_path / "moved"
    a.mkdir()
    async with server.client() as c, server.client() as watcher:
        rows = await fresh_rows(watcher)
        pa = (await c.request("create_project", name="a", path=str(a)))["project"]
        acks = [await c.request("chat", content=f"in a {k}", project_id=pa["id"]) for k in range(2)]
        for x in acks:
            await c.request("subscribe_msg", session_id=x["session_id"], msg_id=x["reply_id"], offset=0)
            await c.wait_done(x["session_id"], x["reply_id"])
        a.rename(moved)
        await c.request("relocate_project", session_id=acks[0]["session_id"], project_id=pa["id"], path=str(moved))
        rows = await patched_rows_settle(watcher, rows, watcher)
        assert all(rows[x["session_id"]]["project"]["path"] == str(moved) for x in acks)


async def test_verify_accepts_a_snapshot_of_the_older_format(root):
    import json
    from sessionlog_store.projections.checkpoint import snapshot_path
    async with open_session_store(root, config=StoreConfig(snapshot_interval=0)) as store:
        meta, _ = await store.create_session(first_message="x")
        await store.load_session(meta.id)
        assert await store.write_snapshot(meta.id)
    path = snapshot_path(root, meta.id)
    with open(path) as f:
        snap = json.load(f)
    snap["version"] = 1
    del snap["active"]
    with open(path, "w") as f:
        json.dump(snap, f)
    r = run_cli("verify", "--root", root)
    assert r.returncode == 0, r.stdout


async def test_retrying_a_reply_that_has_no_parent_makes_a_sibling(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session()
        greeting = await store.append_message(meta.id, "hello, I am your agent", role="assistant",
                                              kind="llm_reply")
        await store.append_message(meta.id, "hi")
        async with store.retry(meta.id, greeting) as msg:
            msg.write("hello again")
        state = await store.load_session(meta.id)
        assert state.messages[msg.msg_id].parent_id is None
        assert state.siblings(greeting) == [greeting, msg.msg_id]


async def test_a_blank_title_at_creation_does_not_lock_naming(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(title="   ")
        assert store.get_meta(meta.id).user_titled is False


async def test_a_malformed_since_gets_a_full_list_not_an_internal_error(root, nursery):
    server = await start_server(nursery, root, speed=0.0)
    async with server.client() as c:
        rev = (await c.request("list_sessions"))["rev"]
        epoch = rev.split(":")[0]
        for bad in (f"{epoch}:²", f"{epoch}:", "x:1:2", f"{epoch}:99999", ""):
            out = await c.request("list_sessions", since=bad)
            assert out["relist"] is True, bad
        with pytest.raises(ServerError):
            await c.request("list_sessions", since=5)


async def test_two_projects_never_share_a_folder_and_a_relocation_node_reaches_watchers(root, nursery, tmp_path):
    server = await start_server(nursery, root, speed=0.0, tokens=(2, 3))
    a, moved = tmp_path / "a", tmp_path / "moved"
    a.mkdir()
    async with server.client() as c, server.client() as watcher:
        pa = (await c.request("create_project", name="a", path=str(a)))["project"]
        with pytest.raises(ServerError) as e:
            await c.request("create_project", name="again", path=str(a))
        assert e.value.code == "path_in_use"
        ack = await c.request("chat", content="in a", project_id=pa["id"])
        await watcher.request("load_session", session_id=ack["session_id"])
        server.store.states.clear()  # evicted from the state cache, as with many sessions loaded
        a.rename(moved)
        out = await c.request("relocate_project", session_id=ack["session_id"], project_id=pa["id"],
                              path=str(moved))
        with trio.fail_after(10):
            await watcher.wait_for(lambda f: f["type"] == "message_created"
                                   and f["data"]["message"]["msg_id"] == out["node_id"])
