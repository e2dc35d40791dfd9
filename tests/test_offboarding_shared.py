"""`sessionlog users … --backend nats://…` (docs/SECURITY.md, "Offboarding a
user"): on a shared stream the command runs as one more worker while the
others serve. A real 3-node cluster, a worker serving in this process, the
command in a subprocess."""
from __future__ import annotations

import json
import os
import tarfile
from typing import Any

import pytest
import trio

from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.scaleout.streamspace import open_shared_stream_space
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli
from .test_offboarding import lines_of

pytestmark = pytest.mark.slow
pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


async def users(cluster: Any, stream: str, *args: str) -> Any:
    """`sessionlog users ARGS` on `stream`, in a subprocess (off the trio thread:
    the worker in this process goes on serving meanwhile)."""
    monitors = [a for p in cluster.http_ports for a in ("--nats-monitor", f"http://127.0.0.1:{p}")]
    return await trio.to_thread.run_sync(lambda: run_cli(
        "users", *args, "--backend", ",".join(cluster.urls), "--nats-stream", stream, *monitors))


async def until(pred, within: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(within):
        while not pred():
            await trio.sleep(0.02)


async def test_a_user_is_listed_exported_transferred_and_deleted_on_the_stream_while_a_worker_serves(
        nats_cluster, tmp_path):
    stream = "OFFBOARD"
    config = StoreConfig(backend=tuple(nats_cluster.urls), stream=stream, many_users=True)
    os.makedirs(tmp_path / "w")
    async with open_session_store(str(tmp_path / "w"), config=config) as store, \
            open_shared_stream_space(config) as space:
        made: dict[str, list[str]] = {}
        for owner, title in (("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("carol", "c1")):
            meta, _ = await store.create_session(title=title, owner=owner, first_message=f"{title} secret")
            await store.append_message(meta.id, f"{title} answer", role="assistant", kind="llm_reply")
            made.setdefault(owner, []).append(meta.id)
        async with store.inflight(made["alice"][0]) as reply:  # a long reply: the worker snapshots its session
            for i in range(900):
                reply.write(f"ALICE-REPLY-{i:05d} " * 5)
        assert store.worker is not None and store.worker.checkpoints.objects is not None
        objects = store.worker.checkpoints.objects
        from sessionlog_store.server.scaleout.worker import snapshot_name
        with trio.fail_after(30):
            while await objects.get(snapshot_name(made["alice"][0])) is None:
                await trio.sleep(0.05)
        kw: dict[str, Any] = dict(content_type="text/plain", ttl=None, expires_at=None, closed=False)
        await space.create("alice", "notes", data=b"alice's notes", **kw)
        await space.create("bob", "notes", data=b"bob's notes", **kw)
        logs = {sid: await store.log_bytes(sid) for sid in made["alice"]}

        r = await users(nats_cluster, stream, "list")
        assert r.returncode == 0, r.stderr
        listed = lines_of(r.stdout)
        assert set(listed) == {'"alice"', '"bob"', '"carol"'}, r.stdout
        assert "\t2 sessions (0 archived)\t0 projects\t" in listed['"alice"'] and listed['"alice"'].endswith("\t1 stream")

        out = tmp_path / "alice.tar"
        r = await users(nats_cluster, stream, "export", "alice", "--out", str(out))
        assert r.returncode == 0 and "exported 2 sessions, 0 projects and 1 stream of user 'alice'" in r.stderr, \
            r.stderr
        with tarfile.open(out) as tar:
            files = {n: tar.extractfile(n).read() for n in tar.getnames()}  # type: ignore[union-attr]
        for sid in made["alice"]:
            assert files[f"sessions/{sid}/log.jsonl"] == logs[sid], "the stream's lines, byte for byte"
        assert [s["name"] for s in json.loads(files["manifest.json"])["streams"]] == ["notes"]
        assert any(b"YWxpY2UncyBub3Rlcw==" in data for n, data in files.items() if n.startswith("streams/")), \
            "the stream's log, its data as logged (base64)"
        assert b"b1 secret" not in out.read_bytes() and b"bob's" not in out.read_bytes()

        r = await users(nats_cluster, stream, "transfer", "carol", "--to", "bob")
        assert r.returncode == 0 and "transferred 1 session and 0 projects of user 'carol' to 'bob'" in r.stdout, \
            r.stdout + r.stderr
        # Her second session streams a reply on the serving worker while the command deletes it.
        ended, streaming = trio.Event(), trio.Event()

        async def reply_of_alice() -> None:
            try:
                async with store.inflight(made["alice"][1]) as live:
                    while True:
                        live.write("ALICE-LIVE ")
                        streaming.set()
                        await trio.sleep(0.02)  # (a producer's pace, not a wait of the test)
            except Exception:  # noqa: BLE001 - however the store ends it: the deletion did
                pass
            finally:
                ended.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reply_of_alice)
            await streaming.wait()
            # (the checkpoint flag at 0, as a worker may run: the command's cache work is done all the same)
            r = await users(nats_cluster, stream, "delete", "alice", "--nats-checkpoint-interval", "0")
            assert r.returncode == 0 and "deleted 2 sessions, 0 projects and 1 stream" in r.stdout, \
                r.stdout + r.stderr
            assert "Traceback" not in r.stderr, r.stderr
            with trio.fail_after(30):
                await ended.wait()  # her reply ended with her session
        from sessionlog_store.eventstore.jetstream.leases import Leases
        assert await Leases.held(store.es) == [], "a lease of her reply is left"  # type: ignore[arg-type]
        assert await objects.get(snapshot_name(made["alice"][0])) is None, "her reply's snapshot is in the cache"

        # The serving worker learns both from the stream, as from any worker.
        rows = store.registry.rows
        await until(lambda: not set(made["alice"]) & set(rows) and rows[made["carol"][0]].owner == "bob")
        await until(lambda: sorted((st.owner, st.name) for st in space.logs.values()) == [("bob", "notes")])
        es = store.es
        from sessionlog_store.eventstore.jetstream.natsio import read_subject
        for sid in made["alice"]:  # purged from the stream, not only tombstoned
            data, _, _ = await es.bridge.run(lambda: read_subject(es.js, es.stream, es.subject(sid), 8))  # type: ignore[attr-defined]
            assert data == b"", f"session {sid}'s messages are still on the stream"
        assert {m.owner for sid, m in rows.items()} == {"bob"}
        # ... and from the stream's registry checkpoint (the command's stop wrote it, as any worker's does)
        got = await objects.get("registry")
        assert got is not None and not [sid for sid in made["alice"] if sid.encode() in got[0]], \
            "the registry checkpoint still names alice's sessions"


async def test_a_stream_that_is_not_there_is_an_error_and_is_not_made(nats_cluster):
    r = await users(nats_cluster, "NO-SUCH-STREAM", "list")
    assert r.returncode == 3 and r.stderr.count("\n") == 1, r.stderr
    assert "there is no stream NO-SUCH-STREAM" in r.stderr, r.stderr
    import asyncio

    import nats
    from nats.js.errors import NotFoundError

    def exists() -> bool:  # (nats-py is asyncio's: asked in a thread of its own)

        async def ask() -> bool:
            c = await nats.connect(servers=list(nats_cluster.urls))
            try:
                await c.jetstream().stream_info("NO-SUCH-STREAM")
                return True
            except NotFoundError:
                return False
            finally:
                await c.close()
        return asyncio.run(ask())
    assert not await trio.to_thread.run_sync(exists), "the command made the stream"
