"""A store error while replies stream never kills the server (issue 11, item 3).

- A real disk full: a real `sessionlog serve` on a real 16 MiB loop-mounted
  ext4, replies streaming, the disk filled from outside. The server stays up;
  listing and loading work; every write gets `store_broken`; the running
  replies end; the next start (with space again) marks them aborted with
  their text; nothing acknowledged is lost.
- A producer writing 5 MB within one interval: split into records under the
  size limit, never a crash; a context tree too large for a record is a clear
  error to its producer.
- A session deleted while its producer has unsaved text: the saver goes on.
"""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import trio

from sessionlog_store.eventstore import RecordTooLarge
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, read_log
from sessionlog_store.eventstore.record import scan
from sessionlog_store.eventstore.record import MAX_RECORD_BYTES
from sessionlog_store.server.edge.client import ServerError, open_client
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .test_stop import TOKEN, start_serve


@pytest.fixture
def small_fs():  # type: ignore[no-untyped-def]
    """A real 16 MiB ext4, loop-mounted (needs root and a loop device)."""
    if shutil.which("mkfs.ext4") is None or os.geteuid() != 0:
        pytest.skip("a loop-mounted ext4 needs mkfs.ext4 and root")
    work = tempfile.mkdtemp(prefix="sessionlog-smallfs-")
    image, mnt = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    os.mkdir(mnt)
    with open(image, "wb") as f:
        f.truncate(16 * 1024 * 1024)
    subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True, capture_output=True)
    r = subprocess.run(["mount", "-o", "loop", image, mnt], capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(work)
        pytest.skip(f"cannot loop-mount an ext4 image here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def fill(path: str) -> str:
    """Fill the filesystem holding `path` until ENOSPC; returns the filler file."""
    filler = os.path.join(path, "filler")
    chunk = b"\0" * (256 * 1024)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        while True:  # the last few blocks
            try:
                f.write(b"\0" * 4096)
            except OSError:
                break
    return filler


@pytest.mark.slow
async def test_disk_full_while_replies_stream_keeps_the_server_up(small_fs):
    root = os.path.join(small_fs, "store")
    p, port = await trio.to_thread.run_sync(lambda: start_serve(root, "--agent-speed", "10"))
    try:
        async with open_client("127.0.0.1", port, TOKEN) as c:
            acked = []
            for k in range(3):
                acked.append(await c.request("chat", content=f"a long answer please {k}"))
            sid = acked[0]["session_id"]
            await trio.sleep(0.5)
            filler = await trio.to_thread.run_sync(fill, small_fs)
            # Replies keep writing progress: the next batch that needs a block fails.
            broken = None
            with trio.fail_after(30):
                while broken is None:
                    try:
                        await c.request("rename_session", session_id=sid, title=f"t{time.monotonic()}")
                    except ServerError as e:
                        broken = e
                    await trio.sleep(0.05)
            assert broken.code == "store_broken"
            await trio.sleep(1.0)  # several saver ticks with the replies' text pending
            assert p.poll() is None, "the server is still running"
            rows = await c.request("list_sessions")
            assert {r["id"] for r in rows["rows"]} >= {a["session_id"] for a in acked}
            loaded = await c.request("load_session", session_id=sid)
            assert loaded["session"]["id"] == sid
            with pytest.raises(ServerError) as e:
                await c.request("chat", content="another turn", session_id=sid)
            assert e.value.code == "store_broken"
            with pytest.raises(ServerError) as e:
                await c.request("create_session")
            assert e.value.code == "store_broken"
        async with open_client("127.0.0.1", port, TOKEN) as c2:  # a new client is served too
            assert (await c2.request("list_sessions"))["total"] >= 3
        p.send_signal(signal.SIGTERM)
        out, err = await trio.to_thread.run_sync(lambda: p.communicate(timeout=30))
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 5, err  # stopped after a store failure
    assert "Traceback" not in err
    os.unlink(filler)
    async with open_session_store(root, config=StoreConfig(check_after_start=False)) as store:
        for a in acked:
            state = await store.load_session(a["session_id"])
            assert a["msg_id"] in state.messages, "the acknowledged user message survived"
            reply = state.messages[a["reply_id"]]
            assert reply.status in ("done", "aborted")
            if reply.status == "aborted":
                assert reply.metadata["aborted_reason"] == "worker restart"


async def test_five_megabytes_in_one_interval_is_split_into_records(root):
    big = "".join(f"line {i} of a very long generated file\n" for i in range(140_000))
    assert len(big) > 5_000_000
    async with open_session_store(root, config=StoreConfig(progress_interval=3600)) as store:
        meta, _ = await store.create_session(first_message="dump it all")
        async with store.inflight(meta.id) as msg:
            msg.write(big)
            msg.write("é\x01" * 1000)  # characters that take more bytes in JSON
            with pytest.raises(RecordTooLarge, match="context tree"):
                msg.set_tree({"blob": "x" * MAX_RECORD_BYTES})
            msg.set_tree({"name": "ok"})
        mid = msg.msg_id
        assert store.es.broken is None
    data = read_log(OS_FILES, root, meta.id)
    assert max(len(line) for line in data.split(b"\n")) < MAX_RECORD_BYTES
    async with open_session_store(root) as store:
        m = (await store.load_session(meta.id)).messages[mid]
        assert m.status == "done" and m.content == big + "é\x01" * 1000
        assert m.metadata["context_tree"] == {"name": "ok"}


async def test_a_session_deleted_while_its_producer_has_unsaved_text(root):
    config = StoreConfig(progress_interval=0.05)
    async with open_session_store(root, config=config) as store:
        for k in range(20):
            meta, _ = await store.create_session(first_message=f"go {k}")
            async with trio.open_nursery() as n:
                async def produce() -> None:
                    async with store.inflight(meta.id) as msg:
                        while True:
                            msg.write("unsaved text ")
                            await trio.sleep(0.001)
                n.start_soon(produce)
                await trio.sleep(0.02 + 0.003 * k)  # sometimes mid-interval, with text pending
                assert await store.delete_session(meta.id)
            await trio.sleep(0.06)  # a saver tick after the deletion
        assert store.es.broken is None and store.saver.failed is None
        meta, _ = await store.create_session(first_message="still works")
    assert os.listdir(os.path.join(root, SESSIONS_DIR)) == [meta.id]
    data = read_log(OS_FILES, root, meta.id)
    assert len(scan(meta.id, data, expect_seq=1).records) == 2


async def test_a_huge_producer_error_is_cut_in_its_finalize(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="fail loudly")
        with pytest.raises(ValueError):
            async with store.inflight(meta.id) as msg:
                msg.write("partial")
                raise ValueError("x" * 10 * 1024 * 1024 + "\ud800")  # 10 MB and a lone surrogate
        m = (await store.load_session(meta.id)).messages[msg.msg_id]
        assert m.status == "error" and 100 < len(m.error or "") <= 4000
        assert store.es.broken is None
