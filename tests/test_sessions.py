"""Session operations (spec/session-operations.md) on the log."""
from __future__ import annotations

import logging
import os
import random

import msgspec
import pytest
import trio

from sessionlog_store.eventstore import FileOps
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.maintenance import MaintenanceConfig
from sessionlog_store.projections.recovery import recover_registry
from sessionlog_store.projections.session import truncate_preview
from sessionlog_store.server.domain.errors import BadRequest, Conflict, NotFound
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import FROZEN_ERROR
from sessionlog_store.server.stores import open_session_store
from sessionlog_store.server.domain.titles import title_from_text

from .conftest import read_logs


@pytest.fixture
async def store(root):
    config = StoreConfig(home=root, project_roots=(os.path.dirname(root),))  # projects in tmp_path
    async with open_session_store(root, config=config) as s:
        yield s


def log_bytes(store) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    return read_logs(store.root)


# -- create -------------------------------------------------------------------

async def test_create_generates_an_id_and_is_durable_at_birth(store):
    meta, first = await store.create_session(agent_id="a1", source="web", title="T")
    assert first is None and meta.id and meta.agent_id == "a1" and meta.status == "idle"
    assert os.path.getsize(log_path(store.root, meta.id)) > 0
    assert meta.message_count == 0


async def test_duplicate_id_is_refused(store):
    await store.create_session("same-id")
    before = log_bytes(store)
    with pytest.raises(Conflict, match="already exists"):
        await store.create_session("same-id")
    assert log_bytes(store) == before


async def test_create_with_first_message_is_one_write(root):
    class CountingFS(FileOps):
        writes = 0

        def write(self, fd: int, data: bytes) -> None:
            CountingFS.writes += 1
            super().write(fd, data)

    fs = CountingFS()
    async with open_session_store(root, fs=fs) as store:
        CountingFS.writes = 0
        meta, first = await store.create_session(first_message="hello")
        assert CountingFS.writes == 1
        assert meta.message_count == 1 and meta.preview == "hello"
        with open(log_path(root, meta.id), "rb") as f:
            assert len(f.read().splitlines()) == 2


# -- append / preview ---------------------------------------------------------

@pytest.mark.parametrize("text,preview", [
    ("", None), (None, None), ("  hi  ", "hi"), ("a\nb", "a b"), ("x" * 80, "x" * 80),
    ("x" * 81, "x" * 77 + "…"), ("\n" + "y" * 100, "y" * 77 + "…"),
])
def test_preview_truncation(text, preview):
    assert truncate_preview(text) == preview


async def test_user_message_updates_preview_and_updated_at(store):
    meta, _ = await store.create_session()
    await trio.sleep(0.01)
    await store.append_message(meta.id, "line one\nline two")
    after = store.get_meta(meta.id)
    assert after.preview == "line one line two" and after.updated_at > meta.updated_at
    await store.append_message(meta.id, "a reply", role="assistant", kind="llm_reply")
    assert store.get_meta(meta.id).preview == "line one line two"


async def test_registry_checkpoint_is_debounced_and_flushed_on_shutdown(root, mock_clock):
    # Virtual time that jumps only after real idleness, so fsyncs in worker
    # threads finish before the clock moves on.
    mock_clock.autojump_threshold = 0.05
    from sessionlog_store.projections.checkpoint import IndexCheckpoint

    def on_disk(sid: str) -> str | None:
        ck = msgspec.json.decode(open(os.path.join(root, "index.json"), "rb").read(), type=IndexCheckpoint)
        e = ck.sessions.get(sid)
        return e.meta.preview if e else None

    async with open_session_store(root) as store:
        async def written() -> None:
            """Until a write under way is done (the virtual clock can jump
            while its fsyncs run in threads: on a loaded machine they take
            longer than the jump's 50 ms of real idleness)."""
            async with store.keeper.caches._index_lock:
                pass
        meta, _ = await store.create_session(first_message="one")
        await trio.sleep(6)
        await written()
        assert on_disk(meta.id) == "one"
        await store.append_message(meta.id, "two")
        await trio.sleep(1)
        await written()
        assert on_disk(meta.id) == "one", "the index write waits for the debounce"
        await trio.sleep(5)
        await written()
        assert on_disk(meta.id) == "two"
        await store.append_message(meta.id, "three")
    assert on_disk(meta.id) == "three", "flushed on shutdown"


# -- update -------------------------------------------------------------------

async def test_update_returns_exactly_the_changed_fields(store):
    meta, _ = await store.create_session(title="old")
    seen = []
    store.watchers.append(lambda kind, data: seen.append((kind, data)))
    assert await store.update_session(meta.id, title="new", pinned=False, unread=True) == \
        {"title": "new", "unread": True}
    assert [(k, {f: v for f, v in d.items() if f != "rev"}) for k, d in seen] == \
        [("session_updated", {"id": meta.id, "title": "new", "unread": True})]
    assert seen[0][1]["rev"] == store.feed.position
    assert await store.update_session(meta.id, title="new") == {}
    m = store.get_meta(meta.id)
    assert (m.title, m.unread, m.pinned) == ("new", True, False)


@pytest.mark.parametrize("fields,msg", [
    ({"colour": "red"}, "unknown field"), ({"pinned": "yes"}, "Expected `bool`"),
    ({"title": 5}, "Expected `str`"), ({"status": "exploded"}, "status"),
    ({"_title_gen_count": "1"}, "Expected `int`"), ({"pinned": True, "bogus": 1}, "unknown field"),
])
async def test_update_refuses_unknown_fields_and_wrong_types_changing_nothing(store, fields, msg):
    meta, _ = await store.create_session()
    before = log_bytes(store)
    with pytest.raises(BadRequest, match=msg):
        await store.update_session(meta.id, **fields)
    assert log_bytes(store) == before
    assert store.get_meta(meta.id) == meta


async def test_unknown_session_is_not_found_and_changes_nothing(store):
    await store.create_session()
    before = log_bytes(store)
    with pytest.raises(NotFound):
        await store.update_session("nosuch", title="x")
    with pytest.raises(NotFound):
        await store.append_message("nosuch", "x")
    assert await store.set_archived("nosuch", True) is False
    assert await store.delete_session("nosuch") is False
    assert log_bytes(store) == before


# -- archive / delete -----------------------------------------------------------

async def test_archive_keeps_updated_at_and_place_and_messages(store):
    ids = []
    for i in range(4):
        meta, _ = await store.create_session(first_message=f"m{i}")
        ids.append(meta.id)
        await trio.sleep(0.002)
    order = [r["id"] for r in store.list_sessions()[0]]
    target = ids[1]
    before = store.get_meta(target).updated_at
    assert await store.set_archived(target, True) is True
    assert store.get_meta(target).updated_at == before
    assert target not in [r["id"] for r in store.list_sessions()[0]]
    assert [m.content for m in await store.get_messages(target)] == ["m1"]
    assert await store.set_archived(target, False) is True
    assert [r["id"] for r in store.list_sessions()[0]] == order


async def test_delete_is_a_tombstone_then_the_folder(store):
    meta, _ = await store.create_session(first_message="bye")
    seen = []
    store.watchers.append(lambda kind, data: seen.append((kind, data)))
    assert await store.delete_session(meta.id) is True
    assert not os.path.exists(os.path.dirname(log_path(store.root, meta.id)))
    assert meta.id not in store.registry
    assert [(k, {f: v for f, v in d.items() if f != "rev"}) for k, d in seen] == [("session_deleted", {"session_id": meta.id})]
    assert await store.delete_session(meta.id) is False


# -- listing --------------------------------------------------------------------

async def test_list_filters_archived_views_and_paging(store):
    a, _ = await store.create_session(agent_id="x", first_message="1")
    b, _ = await store.create_session(agent_id="y", first_message="2")
    c, _ = await store.create_session(agent_id="x", first_message="3")
    await store.set_archived(b.id, True)
    ids = lambda rows: [r["id"] for r in rows]  # noqa: E731
    rows, total = store.list_sessions()
    assert ids(rows) == [c.id, a.id] and total == 2
    assert ids(store.list_sessions(include_archived=True)[0]) == [c.id, b.id, a.id]
    assert ids(store.list_sessions(archived=True)[0]) == [b.id]
    assert ids(store.list_sessions(filters={"agent_id": "x"})[0]) == [c.id, a.id]
    rows, total = store.list_sessions(include_archived=True, offset=1, limit=1)
    assert ids(rows) == [b.id] and total == 3
    with pytest.raises(BadRequest):
        store.list_sessions(filters={"nope": 1})


async def test_a_row_has_the_17_documented_fields(store):
    await store.create_session(first_message="hi")
    row = store.list_sessions()[0][0]
    assert set(row) == {"id", "agent_id", "source", "title", "status", "created_at", "updated_at", "pinned",
                        "unread", "archived", "project_id", "message_count", "_user_titled", "_auto_titled",
                        "_title_gen_count", "preview", "project"}


async def test_order_after_random_operations_equals_a_sort_of_replayed_rows(store):
    rng = random.Random(7)
    ids = []
    for step in range(120):
        op = rng.random()
        live = [s for s in ids if s in store.registry]
        if op < 0.15 or not live:
            meta, _ = await store.create_session(first_message="x")
            ids.append(meta.id)
        elif op < 0.45:
            await store.append_message(rng.choice(live), f"msg {step}")
        elif op < 0.6:
            await store.rename_session(rng.choice(live), f"name {step}")
        elif op < 0.85:
            sid = rng.choice(live)
            before = [r["id"] for r in store.list_sessions(include_archived=True)[0]]
            await store.set_archived(sid, not store.get_meta(sid).archived)
            assert [r["id"] for r in store.list_sessions(include_archived=True)[0]] == before
        else:
            await store.delete_session(rng.choice(live))
        store.registry.check()
    await store.es.flush()
    replayed, _, _ = recover_registry(OS_FILES, store.root, use_checkpoint=False, repair=False)
    expect = sorted(replayed.rows.values(), key=lambda m: (-m.updated_at, m.id))
    assert [r["id"] for r in store.list_sessions(include_archived=True)[0]] == [m.id for m in expect]


# -- titles ---------------------------------------------------------------------

@pytest.mark.parametrize("text,title", [
    ("Plan a trip", "Plan a trip"),
    ("[attachment:foo.png] Describe this\nmore", "Describe this"),
    ("<file name='a.py'>code</file>\n\nFix the bug", "Fix the bug"),
    ("<attachment-preview>x</attachment-preview>Hi", "Hi"),
    ("z" * 60, "z" * 50 + "…"),
])
def test_title_from_text(text, title):
    assert title_from_text(text) == title


class GateTitler:
    def __init__(self) -> None:
        self.gate = trio.Event()
        self.calls = 0
        self.entered = trio.Event()

    async def generate(self, messages):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        return f"LLM title {self.calls} ({len(messages)} msgs)"


async def settled(store) -> None:  # type: ignore[no-untyped-def]
    """Wait until the store's background title tasks (which append through the
    committer's worker thread) have finished."""
    with trio.fail_after(10):
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if not any(t.name.endswith("maybe_auto_title") for t in store._nursery.child_tasks):
                return
            await trio.sleep(0.001)


async def reply(store, sid: str, text: str = "ok") -> None:  # type: ignore[no-untyped-def]
    async with store.inflight(sid, kind="llm_reply") as m:
        m.write(text)


async def test_two_phase_auto_title_at_the_thresholds(root):
    titler = GateTitler()
    titler.gate.set()
    async with open_session_store(root, titler=titler) as store:
        meta, _ = await store.create_session(first_message="[attachment:x] Weekend plan in Rome\nwith kids")
        await reply(store, meta.id)
        await settled(store)
        m = store.get_meta(meta.id)
        assert m.title == "LLM title 1 (2 msgs)" and m.auto_titled and m.title_gen_count == 2
        for turn in range(2, 7):
            await store.append_message(meta.id, f"q{turn}")
            await reply(store, meta.id)
            await settled(store)
        assert titler.calls == 2 and store.get_meta(meta.id).title_gen_count == 3
        assert store.get_meta(meta.id).title.startswith("LLM title 2")


async def test_phase1_title_then_user_rename_wins_the_race(root):
    titler = GateTitler()
    async with open_session_store(root, titler=titler) as store:
        meta, _ = await store.create_session(first_message="Weekend plan in Rome")
        await reply(store, meta.id)
        await titler.entered.wait()
        assert store.get_meta(meta.id).title == "Weekend plan in Rome"  # phase 1
        await store.rename_session(meta.id, "Mine")
        titler.gate.set()
        await settled(store)
        m = store.get_meta(meta.id)
        assert m.title == "Mine" and m.user_titled
        for _ in range(6):
            await store.append_message(meta.id, "more")
            await reply(store, meta.id)
        await settled(store)
        assert titler.calls == 1, "after a manual rename, auto-naming stops for good"


async def test_phase2_gives_up_when_the_phase1_title_changed_meanwhile(root):
    titler = GateTitler()
    async with open_session_store(root, titler=titler) as store:
        meta, _ = await store.create_session(first_message="Weekend plan in Rome")
        await reply(store, meta.id)
        await titler.entered.wait()
        await store.update_session(meta.id, title="changed by a regenerate")  # no lock
        titler.gate.set()
        await settled(store)
        assert store.get_meta(meta.id).title == "changed by a regenerate"


async def test_regenerate_renames_without_locking(store):
    meta, _ = await store.create_session(first_message="Kubernetes cluster upgrade checklist")
    changed = await store.regenerate_title(meta.id)
    assert changed["title"] and not store.get_meta(meta.id).user_titled


async def test_channel_source_is_stored_and_never_in_the_title(store):
    meta, _ = await store.create_session(source="wechat", first_message="Weekend plan")
    await reply(store, meta.id)
    await settled(store)
    m = store.get_meta(meta.id)
    assert m.source == "wechat" and "WeChat" not in m.title and "[" not in m.title


# -- projects -------------------------------------------------------------------

async def test_projects_default_binding_freeze_and_relocation(store, tmp_path):
    home = store.list_projects()[0]
    assert home.is_default and home.id == "default" and not home.path_missing
    d1 = tmp_path / "proj"
    d1.mkdir()
    p = await store.create_project("proj", str(d1))
    meta, _ = await store.create_session()
    assert await store.set_session_project(meta.id, p.id) == {"project_id": p.id}
    assert await store.set_session_project(meta.id, "default") == {"project_id": "default"}
    assert await store.set_session_project(meta.id, p.id) == {"project_id": p.id}
    await store.append_message(meta.id, "first turn")
    assert await store.set_session_project(meta.id, p.id) == {}  # idempotent at any age
    before = log_bytes(store)
    with pytest.raises(Conflict, match=FROZEN_ERROR):
        await store.set_session_project(meta.id, "default")
    assert log_bytes(store) == before
    # The folder moves: the project points at nothing.
    d2 = tmp_path / "moved"
    os.rename(d1, d2)
    assert [x.path_missing for x in store.list_projects() if x.id == p.id] == [True]
    assert store.project_workdir_for(meta.id) is None
    head_before = (await store.load_session(meta.id)).head
    out = await store.relocate_project(meta.id, p.id, str(d2))
    assert out["ok"] and out["old_path"] == str(d1) and out["path"] == str(d2) and out["node_id"]
    state = await store.load_session(meta.id)
    assert state.head == head_before, "a relocation node never moves head"
    assert state.messages[out["node_id"]].kind == "relocate"
    assert store.project_workdir_for(meta.id) == str(d2)
    assert store.get_meta(meta.id).project_id == p.id


async def test_bad_project_calls_change_nothing(store, tmp_path):
    """Relocation only repairs (spec): a healthy project, a folder another
    project has, a session not bound to the project are refused, each with its
    own code, and nothing is written."""
    d = tmp_path / "p"
    d.mkdir()
    other = tmp_path / "q"
    other.mkdir()
    (tmp_path / "file").write_text("x")
    p = await store.create_project("p", str(d))
    q = await store.create_project("q", str(other))
    meta, _ = await store.create_session(project_id=p.id)
    unbound, _ = await store.create_session()
    spare = tmp_path / "spare"
    spare.mkdir()
    before = log_bytes(store)
    with pytest.raises(Conflict) as e:
        await store.relocate_project(meta.id, p.id, str(spare))
    assert e.value.code == "project_not_missing"
    d.rename(tmp_path / "gone")
    with pytest.raises(BadRequest, match="does not exist"):  # the single user is told what is wrong
        await store.relocate_project(meta.id, p.id, str(tmp_path / "missing"))
    with pytest.raises(BadRequest, match="not a directory"):
        await store.relocate_project(meta.id, p.id, str(tmp_path / "file"))
    with pytest.raises(Conflict) as e:
        await store.relocate_project(meta.id, p.id, str(other))
    assert e.value.code == "path_in_use"
    with pytest.raises(Conflict) as e:
        await store.relocate_project(unbound.id, p.id, str(spare))
    assert e.value.code == "project_not_bound"
    with pytest.raises(BadRequest, match="default project"):
        await store.relocate_project(unbound.id, "default", str(spare))
    with pytest.raises(NotFound):
        await store.set_session_project(meta.id, "p-nosuch")
    with pytest.raises(NotFound):
        await store.relocate_project("nosuch", p.id, str(spare))
    assert log_bytes(store) == before
    assert q.id in [x.id for x in store.list_projects()]
    out = await store.relocate_project(meta.id, p.id, str(spare))  # the repair itself still works
    assert out["path"] == str(spare)


async def test_projects_survive_a_restart(root, tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    async with open_session_store(root) as store:
        p = await store.create_project("p", str(d))
    async with open_session_store(root) as store:
        assert p.id in [x.id for x in store.list_projects()]


# -- startup maintenance ---------------------------------------------------------

async def test_startup_maintenance_in_the_spec_order(root, caplog):
    async with open_session_store(root) as store:
        shell, _ = await store.create_session()
        old_archive, _ = await store.create_session(first_message="a")
        await store.set_archived(old_archive.id, True)
        keep_archived = []
        for i in range(3):
            m, _ = await store.create_session(first_message=f"k{i}")
            await store.set_archived(m.id, True)
            keep_archived.append(m.id)
        active, _ = await store.create_session(first_message="active")
        await store.update_session(active.id, status="running")
    cfg = StoreConfig(maintenance=MaintenanceConfig(empty_shell_age=1e-9, archive_ttl=3600, max_sessions=3))
    caplog.set_level(logging.INFO, "sessionlog")
    async with open_session_store(root, config=cfg) as store:
        removed = dict(store.removed_at_start)
        assert removed[shell.id] == "empty shell"
        assert store.get_meta(active.id).status == "idle"
        # 5 with messages; the cap of 3 removes the 2 oldest archived.
        assert [s for s, why in store.removed_at_start if why == "over capacity"] == [old_archive.id, keep_archived[0]]
        assert len(store.registry) == 3
    assert "empty shell" in caplog.text and "over capacity" in caplog.text
    cfg = StoreConfig(maintenance=MaintenanceConfig(archive_ttl=1e-9))
    async with open_session_store(root, config=cfg) as store:
        assert sorted(s for s, why in store.removed_at_start if why == "archive expired") == sorted(keep_archived[1:])
        assert [r["id"] for r in store.list_sessions(include_archived=True)[0]] == [active.id]


async def test_fresh_empty_session_survives_a_restart(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session()
    async with open_session_store(root) as store:
        assert store.get_meta(meta.id).status == "idle"


async def test_deleting_a_session_while_its_title_is_generated_keeps_the_store_up(root):
    titler = GateTitler()
    async with open_session_store(root, titler=titler) as store:
        meta, _ = await store.create_session(first_message="Weekend plan")
        await reply(store, meta.id)
        await titler.entered.wait()
        await store.delete_session(meta.id)
        titler.gate.set()
        await settled(store)
        other, _ = await store.create_session(first_message="still here")
        await reply(store, other.id)
        await settled(store)
