"""Regressions for what a fresh adversarial review of the trust fixes found
(issue 11, "more of the same kind"): each broke the store or lost data on the
first version of the fixes."""
from __future__ import annotations

import json
import os
import tempfile
import re
import signal

import pytest
import trio

from sessionlog_store.eventstore.errors import SessionReadOnly
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, log_path
from sessionlog_store.projections.checkpoint import snapshot_path
from sessionlog_store.server.edge.client import ServerError, open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli
from .test_damage_more import flip, two_sessions
from .test_stop import TOKEN, start_serve


@pytest.mark.parametrize("damage", ["flipped", "zeroed"])
async def test_a_session_of_one_damaged_record_is_quarantined_never_removed(root, damage):
    """Damage in the only record is a "torn tail" to the scanner; the log had
    bytes, so the session is kept (quarantined), with its torn copy."""
    async with open_session_store(root) as store:
        meta, _ = await store.create_session()  # a new chat: one record
        await store.load_session(meta.id)
        assert await store.write_snapshot(meta.id)
    path = log_path(root, meta.id)
    if damage == "flipped":
        flip(path, b"session_created")
    else:
        size = os.path.getsize(path)
        with open(path, "wb") as f:
            f.write(b"\0" * size)
    os.unlink(os.path.join(root, "index.json"))
    r = run_cli("rebuild", "--root", root)
    assert "interrupted creation" not in r.stdout, r.stdout
    for _ in range(2):
        async with open_session_store(root) as store:
            row = store.get_row(meta.id)
            assert "damaged" in row
    assert os.path.exists(snapshot_path(root, meta.id))
    assert any(n.startswith("log.jsonl.torn-") for n in os.listdir(os.path.dirname(path)))


async def test_a_damaged_session_can_be_deleted_by_its_user(root):
    ids = await two_sessions(root)
    flip(log_path(root, ids[0]), b"first 0")
    async with open_session_store(root) as store:
        await store.checked.wait()
        assert "damaged" in store.get_row(ids[0])
        assert await store.delete_session(ids[0])
        assert [r["id"] for r in store.list_sessions()[0]] == [ids[1]]
    assert os.listdir(os.path.join(root, SESSIONS_DIR)) == [ids[1]]


async def test_lone_surrogates_from_a_producer_never_stop_the_saver(root):
    async with open_session_store(root, config=StoreConfig(progress_interval=0.01)) as store:
        meta, _ = await store.create_session(first_message="emoji please")
        other, _ = await store.create_session(first_message="other")
        async with store.inflight(other.id) as bystander:
            async with store.inflight(meta.id) as msg:
                msg.write("a ")
                msg.write(json.loads('"\\ud83d"'))  # an emoji's halves, streamed apart
                await trio.sleep(0.05)
                msg.write(json.loads('"\\ude00"'))
                msg.write(" b")
                bystander.write("still streaming")
                await trio.sleep(0.05)
        assert store.saver.failed is None and store.es.broken is None
    async with open_session_store(root) as store:
        m = (await store.load_session(meta.id)).messages[msg.msg_id]
        assert m.status == "done" and m.content == "a \ufffd\ufffd b"
        assert (await store.load_session(other.id)).messages[bystander.msg_id].content == "still streaming"


async def test_deleting_a_session_whose_folder_is_a_symlink_to_another_filesystem(tmp_path, second_fs):
    root = str(tmp_path / "store")
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="hi")
    folder = os.path.join(root, SESSIONS_DIR, meta.id)
    target = os.path.join(second_fs, meta.id)
    os.makedirs(target)
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as src, open(os.path.join(target, name), "wb") as dst:
            dst.write(src.read())
        os.unlink(os.path.join(folder, name))
    os.rmdir(folder)
    os.symlink(target, folder)
    async with open_session_store(root) as store:
        await store.append_message(meta.id, "on the other disk")
        assert await store.delete_session(meta.id)
        assert store.es.broken is None
        await store.create_session(first_message="the store still writes")
    assert not os.path.lexists(folder) and not os.path.exists(target)


async def test_token_counts_must_be_integers(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="count")
        async with store.inflight(meta.id) as msg:
            with pytest.raises(TypeError, match="integers"):
                msg.add_tokens(output=2.5)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                msg.add_tokens(output=float("nan"))  # type: ignore[arg-type]
            msg.add_tokens(output=3)
    async with open_session_store(root) as store:  # nothing unreadable was written
        m = (await store.load_session(meta.id)).messages[msg.msg_id]
        assert m.tokens == {"input": 0, "output": 3} and store.es.corruption(meta.id) is None


async def test_no_write_is_acknowledged_before_the_check_reaches_a_damaged_session(root):
    ids = await two_sessions(root)
    flip(log_path(root, ids[0]), b"first 0")  # behind the checkpoint: startup reads only the tail
    async with open_session_store(root) as store:
        with pytest.raises(SessionReadOnly):  # the write itself checks the skipped prefix first
            await store.append_message(ids[0], "must not be acknowledged")
        await store.append_message(ids[1], "fine")


async def test_a_session_quarantined_mid_stream_ends_its_subscriptions(root):
    ids = await two_sessions(root)
    async with open_session_store(root, config=StoreConfig(check_after_start=False)) as store:
        async with trio.open_nursery() as n:
            started = trio.Event()

            async def produce() -> None:
                async with store.inflight(ids[0]) as msg:
                    store._test_msg = msg  # type: ignore[attr-defined]
                    started.set()
                    while True:
                        msg.write("x")
                        await trio.sleep(0.01)
            n.start_soon(produce)
            await started.wait()
            sub = await store.subscribe(ids[0], store._test_msg.msg_id)  # type: ignore[attr-defined]
            flip(log_path(root, ids[0]), b"first 0")
            store.keeper.prefix_check.unchecked[ids[0]] = None  # type: ignore[attr-defined]
            assert await store.check_logs() == 1
            statuses = []
            with trio.fail_after(10):
                async for u in sub:
                    statuses.append(u.status)
            assert statuses[-1] == "aborted"
        assert store.hub.count() == 0


async def test_a_chat_into_a_damaged_session_gets_read_only_not_internal(root):
    ids = await two_sessions(root)
    flip(log_path(root, ids[0]), b"first 0")
    os.unlink(os.path.join(root, "index.json"))
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as c:
            with pytest.raises(ServerError) as e:
                await c.request("chat", session_id=ids[0], content="hello?")
            assert e.value.code == "read_only"
    finally:
        p.terminate()
        await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))


async def test_a_project_log_failure_while_serving_exits_5(root):
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root))
    try:
        os.makedirs(os.path.join(root, "projects", "log.jsonl"))  # its name taken: every write fails
        async with open_client("127.0.0.1", port, TOKEN) as c:
            with pytest.raises(ServerError) as e:
                await c.request("create_project", name="x", path=tempfile.mkdtemp())
            assert e.value.code == "store_broken"
        p.send_signal(signal.SIGTERM)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 5 and re.search(r"failed while serving", err)
