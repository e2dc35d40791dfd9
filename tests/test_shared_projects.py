"""Projects on a shared stream (issue 17): every worker knows every
project, on a real 3-node cluster. A project made on one worker is listed,
bound and relocated on another; two workers making a project of one folder
for one user at once end with one project (the fence refuses the second
append, which catches up and is checked again); a new worker's start,
from the checkpoint or not, knows them all."""
from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest
import trio

from sessionlog_store.server.domain.errors import Conflict

from .test_workers import until, worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def folder(tmp_path, name: str) -> str:
    # under HOME (the project root by default: conftest.py sets it to the temp folder)
    path = tempfile.mkdtemp(prefix=f"{name}-", dir=tmp_path)
    assert path.startswith(os.path.expanduser("~"))
    return path


async def test_a_project_made_on_one_worker_is_every_workers(nats_cluster, tmp_path):
    stream = "PJ1"
    work = folder(tmp_path, "work")
    async with worker(nats_cluster, tmp_path, "a", stream) as a, worker(nats_cluster, tmp_path, "b", stream) as b:
        project = await a.create_project("work", work, owner="ann")
        await until(lambda: project.id in {p.id for p in b.list_projects("ann")})
        assert [p.path for p in b.list_projects("ann") if p.id == project.id] == [work]
        assert project.id not in {p.id for p in b.list_projects("bob")}, "another user's is not listed"
        # made on b, bound on b: a's row shows the project
        meta, _ = await b.create_session(owner="ann")
        await b.set_session_project(meta.id, project.id)
        await until(lambda: meta.id in a.registry and a.get_row(meta.id)["project"]["id"] == project.id)
        assert a.get_row(meta.id)["project"]["name"] == "work"
        # its folder moved: relocated from a, b follows
        os.rmdir(work)
        moved = folder(tmp_path, "moved")
        await a.relocate_project(meta.id, project.id, moved)
        await until(lambda: [p.path for p in b.list_projects("ann") if p.id == project.id] == [moved])
    async with worker(nats_cluster, tmp_path, "c", stream) as c, \
            worker(nats_cluster, tmp_path, "d", stream, stream_checkpoint_interval=0) as d:
        assert c.worker.checkpoints.start is not None, "a's stop wrote the checkpoint"
        for w in (c, d):
            assert [(p.id, p.path) for p in w.list_projects("ann") if not p.is_default] == [(project.id, moved)]


async def test_two_workers_making_one_folder_a_project_at_once_make_one(nats_cluster, tmp_path):
    stream = "PJ2"
    async with worker(nats_cluster, tmp_path, "a", stream) as a, worker(nats_cluster, tmp_path, "b", stream) as b:
        for round_ in range(5):
            path = folder(tmp_path, f"same{round_}")
            results: list[Any] = []

            async def make(store, name):  # type: ignore[no-untyped-def]
                try:
                    results.append(await store.create_project(name, path, owner="ann"))
                except Conflict as e:
                    results.append(e)
            async with trio.open_nursery() as n:
                n.start_soon(make, a, "from a")
                n.start_soon(make, b, "from b")
            made = [r for r in results if not isinstance(r, Conflict)]
            refused = [r for r in results if isinstance(r, Conflict)]
            assert len(made) == 1 and len(refused) == 1, results
            assert refused[0].code == "path_in_use"
            await until(lambda: all(len([p for p in w.list_projects("ann") if p.path == path]) == 1 for w in (a, b)))
        assert a.projects.log.seq == b.projects.log.seq == 5


async def test_a_refused_project_write_ends_once_the_write_that_refused_it_can_be_read(tmp_path):
    """The stream leader's two followers paused: one worker's project write
    waits for a quorum, and the other's, fenced on the same subject, is
    refused at once (10164) though nothing newer can be read yet. The
    refused append ends (ProjectsMoved) only once the first write can be
    read, so catching up finds it. It used to end at once: the registry
    caught up with nothing, was refused again, and ran out of its tries in
    milliseconds while a busy cluster replicated the other write (seen in
    a CI run of the test above)."""
    import signal

    from sessionlog_store.eventstore.errors import ProjectsMoved
    from sessionlog_store.eventstore.events import ProjectCreated
    from sessionlog_store.eventstore.jetstream.projects import StreamProjectLog
    from sessionlog_store.eventstore.jetstream.streamlog import open_jetstream_log

    from .nats_cluster import NatsCluster
    from .test_workers import until
    (tmp_path / "nats").mkdir()
    with NatsCluster(tmp_path / "nats") as cluster:
        kw: dict[str, Any] = dict(stream="PJ3", prefix="pj3", replicas=3)
        async with open_jetstream_log(cluster.urls, **kw) as boot:
            info = await boot.bridge.run(lambda: boot.js.stream_info("PJ3"))
        leader = int(info.cluster.leader.removeprefix("n"))
        followers = [cluster.procs[i] for i in range(3) if i != leader]
        at_leader = [cluster.urls[leader]]  # (a paused node's clients would wait with it)
        async with open_jetstream_log(at_leader, **kw) as a, open_jetstream_log(at_leader, **kw) as b:
            logs = [StreamProjectLog(a), StreamProjectLog(b)]
            told: dict[StreamProjectLog, list[str]] = {}
            for log in logs:  # (as the registry listens: server/domain/projects.py)
                told[log] = []
                log.listeners.append(lambda records, log=log: told[log].extend(
                    r.event.project_id for r in records))  # type: ignore[attr-defined]
                assert await log.catch_up() == []
            made: list[str] = []
            caught_up: list[list[str]] = []

            async def make(log: StreamProjectLog, pid: str) -> None:
                try:
                    await log.append(ProjectCreated(project_id=pid, name=pid, path="/srv/one", owner="ann"))
                    made.append(pid)
                except ProjectsMoved:  # what the registry has then: what it was told, and its catch-up
                    caught_up.append(told[log] + [r.event.project_id for r in await log.catch_up()])  # type: ignore[attr-defined]
            try:
                for p in followers:
                    os.kill(p.pid, signal.SIGSTOP)
                async with trio.open_nursery() as n:
                    n.start_soon(make, logs[0], "p-a")
                    n.start_soon(make, logs[1], "p-b")
                    await until(lambda: logs[0].refused + logs[1].refused >= 1)  # the second write refused
                    assert made == [] and caught_up == [], "nothing can be made or read without a quorum"
                    for p in followers:
                        os.kill(p.pid, signal.SIGCONT)
            finally:
                for p in followers:
                    os.kill(p.pid, signal.SIGCONT)
            assert len(made) == 1 and caught_up == [made], (made, caught_up)
            # A refusal that never clears (here a fence past the subject's end, as after a purge):
            # waited for once, then refused at once, so the registry's tries end
            log = logs[0]
            log.stream_seq += 1000
            log.moved_wait = 0.5
            for i in range(20):  # (SHARED_TRIES)
                with pytest.raises(ProjectsMoved):
                    await log.append(ProjectCreated(project_id=f"p-{i}", name="x", path="/srv/two", owner="ann"))
            assert log.waited_out == 1
