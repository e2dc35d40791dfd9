"""`sessionlog migrate` between a data root and a real 3-node JetStream
cluster, both ways, `verify --backend` and `rebuild --backend`: every
session copied byte for byte (seqs and times kept) and read back, a rerun
copies nothing twice, a damaged log is reported and left, the deleted are
left out, a worker started on the stream lists what the local store listed,
and the way back gives the same log files."""
from __future__ import annotations

import os
import shutil

import pytest
import trio

from sessionlog_store.eventstore.local.log import list_session_ids, log_path
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.jetstream.imports import import_log
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def nats_args(cluster, stream: str) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
    monitors = [a for p in cluster.http_ports for a in ("--nats-monitor", f"http://127.0.0.1:{p}")]
    return ("--nats-stream", stream, *monitors)


async def make_store(root: str) -> dict[str, str]:
    """Three sessions (one renamed, one with a long reply) and one deleted."""
    made: dict[str, str] = {}
    async with open_session_store(root) as store:
        a, _ = await store.create_session(title="kept a", first_message="hello")
        async with store.inflight(a.id) as msg:
            msg.write("a reply " * 2000)
        b, _ = await store.create_session(first_message="second")
        await store.rename_session(b.id, "renamed b")
        c, _ = await store.create_session()
        folder = os.path.join(os.path.dirname(root), "project-folder")
        os.makedirs(folder)
        project = await store.create_project("proj", folder)
        await store.set_session_project(c.id, project.id)
        await store.append_message(c.id, "third")
        gone, _ = await store.create_session(first_message="deleted")
        await store.delete_session(gone.id)
        made.update(a=a.id, b=b.id, c=c.id, gone=gone.id, project=project.id)
    return made


def test_migrate_to_a_stream_and_back_keeps_every_byte(nats_cluster, tmp_path):
    root, back = str(tmp_path / "local"), str(tmp_path / "back")
    made = trio.run(make_store, root)
    urls = ",".join(nats_cluster.urls)
    r = run_cli("migrate", "--from", root, "--to", urls, *nats_args(nats_cluster, "MIG"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 sessions copied" in r.stdout and "1 project record(s)" in r.stdout and "0 problem(s)" in r.stdout, r.stdout
    again = run_cli("migrate", "--from", root, "--to", urls, *nats_args(nats_cluster, "MIG"))
    assert again.returncode == 0 and "0 sessions copied" in again.stdout and "3 already there" in again.stdout
    v = run_cli("verify", "--backend", urls, "--nats-stream", "MIG")
    assert v.returncode == 0 and "verified 3 sessions on stream MIG: 0 problem(s)" in v.stdout, v.stdout + v.stderr
    rb = run_cli("rebuild", "--backend", urls, "--nats-stream", "MIG")
    assert rb.returncode == 0 and "3 sessions" in rb.stdout, rb.stdout + rb.stderr

    async def compare() -> None:
        async with open_session_store(root) as local:
            want, _ = local.list_sessions()
            texts = {sid: [m.content for m in await local.get_messages(sid)] for sid in (made["a"], made["b"])}
        config = StoreConfig(backend=tuple(nats_cluster.urls), stream="MIG")
        os.makedirs(tmp_path / "worker")
        async with open_session_store(str(tmp_path / "worker"), config=config) as worker:
            got, _ = worker.list_sessions()
            assert [(r["id"], r["title"], r["preview"]) for r in got] == \
                [(r["id"], r["title"], r["preview"]) for r in want]
            for sid, text in texts.items():
                assert [m.content for m in await worker.get_messages(sid)] == text
            assert worker.get_row(made["c"])["project"]["name"] == "proj", "the project came with its session"
    trio.run(compare)
    out = run_cli("migrate", "--from", urls, "--to", back, "--nats-stream", "MIG")
    assert out.returncode == 0 and "3 sessions copied" in out.stdout, out.stdout + out.stderr
    assert sorted(list_session_ids(OS_FILES, back)) == sorted([made["a"], made["b"], made["c"]])
    for sid in (made["a"], made["b"], made["c"]):
        with open(log_path(root, sid), "rb") as f, open(log_path(back, sid), "rb") as g:
            assert f.read() == g.read(), "the way back gives the same log, byte for byte"
    with open(f"{root}/projects/log.jsonl", "rb") as f, open(f"{back}/projects/log.jsonl", "rb") as g:
        assert f.read() == g.read(), "and the same project log"
    check = run_cli("verify", "--root", back)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_damaged_log_is_reported_and_the_rest_copied(nats_cluster, tmp_path):
    root = str(tmp_path / "local")
    made = trio.run(make_store, root)
    path = log_path(root, made["b"])
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[1] = lines[1].replace(b'"', b"'", 3)  # damage before the last record: not a torn tail
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    r = run_cli("migrate", "--from", root, "--to", ",".join(nats_cluster.urls), *nats_args(nats_cluster, "MIGD"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{made['b']}: not copied" in r.stdout and "repair it first" in r.stdout
    assert "2 sessions copied" in r.stdout


def test_migrate_refuses_what_it_cannot_do(nats_cluster, tmp_path):
    root = str(tmp_path / "local")
    trio.run(make_store, root)
    urls = ",".join(nats_cluster.urls)
    both = run_cli("migrate", "--from", root, "--to", str(tmp_path / "other"))
    assert both.returncode == 3 and "one of --from and --to must be nats://" in both.stderr
    unsynced = run_cli("migrate", "--from", root, "--to", urls, "--nats-stream", "MIGU")
    assert unsynced.returncode == 3 and "--nats-monitor" in unsynced.stderr
    missing = run_cli("migrate", "--from", urls, "--to", str(tmp_path / "back"), "--nats-stream", "NOSUCH")
    assert missing.returncode == 3 and "there is no stream NOSUCH" in missing.stderr, missing.stderr
    shutil.rmtree(tmp_path / "back", ignore_errors=True)


def test_verify_reports_what_matters_on_a_stream(nats_cluster):
    """Issue 25 item 9: sessions put on a stream as they are (migrate's path,
    which checks nothing of the lifecycle), each breaking one rule; verify
    names each, and passes the clean one."""
    from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress,
                                                    SessionCreated, SessionFlags)
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log
    from sessionlog_store.eventstore.jetstream.natsio import default_prefix
    from sessionlog_store.eventstore.record import encode_record

    def log(sid: str, *events, seqs=None) -> bytes:  # type: ignore[no-untyped-def]
        made = [SessionCreated(session_id=sid), MessageCreated(msg_id="m", role="assistant", kind="llm_reply",
                                                               status="running"), *events]
        return b"".join(encode_record(seq, 1.0, ev) for seq, ev in zip(seqs or range(1, len(made) + 1), made))
    end = MessageFinalized(msg_id="m", status="done")
    logs = {
        "clean": log("clean", SessionFlags(status="running"), MessageProgress(msg_id="m", content_delta="hi", offset=0),
                     end, SessionFlags(status="idle")),
        "progressafter": log("progressafter", end, MessageProgress(msg_id="m", content_delta="late", offset=0)),
        "finaltwice": log("finaltwice", end, MessageFinalized(msg_id="m", status="aborted")),
        "flagrunning": log("flagrunning", SessionFlags(status="running"), end),
        "nevermade": log("nevermade", end, MessageProgress(msg_id="x", content_delta="?", offset=0)),
        "seqgap": log("seqgap", end, seqs=[1, 2, 4]),
        "seqrepeat": log("seqrepeat", end, seqs=[1, 2, 2]),
    }

    async def put() -> None:
        async with open_jetstream_log(nats_cluster.urls, stream="VER", prefix=default_prefix("VER")) as es:
            for sid, data in logs.items():
                await import_log(es, sid, data)
    trio.run(put)
    v = run_cli("verify", "--backend", ",".join(nats_cluster.urls), "--nats-stream", "VER")
    assert v.returncode != 0, v.stdout
    out = v.stdout + v.stderr
    said = {sid: [line for line in out.splitlines() if sid in line] for sid in logs}
    assert said["clean"] == [], out
    assert any("progress of message m after its finalize" in s for s in said["progressafter"]), out
    assert any("finalize of message m after its finalize" in s for s in said["finaltwice"]), out
    assert any("flagged running, with no message running" in s for s in said["flagrunning"]), out
    assert any("never made" in s for s in said["nevermade"]), out
    assert said["seqgap"] and said["seqrepeat"], out
    assert "verified 7 sessions on stream VER: 6 problem(s)" in v.stdout, out
