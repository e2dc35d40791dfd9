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
