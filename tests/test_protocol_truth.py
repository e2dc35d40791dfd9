"""Every open client sees the truth (issue 13), over real WebSockets on
127.0.0.1 with two (or three) connections: status pushes, branches, terminal
updates for every subscription, channel chats in one write, titles given at
creation, relocation that only repairs, an exact resume of the session list,
and the running-work list."""
from __future__ import annotations

import os

import pytest
import trio

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import read_log
from sessionlog_store.eventstore.record import scan
from sessionlog_store.projections.registry import ROW_FIELDS
from sessionlog_store.server.edge.client import Client, ServerError
from sessionlog_store.server.config import StoreConfig

from .conftest import run_cli
from .test_ws import start_server

ROW_KEYS = set(ROW_FIELDS) | {"project", "id", "rev", "damaged"}


def apply_push(rows: dict[str, dict], frame: dict) -> None:
    """What a page does with the session-list pushes."""
    t, d = frame["type"], frame["data"]
    if t == "session_created":
        rows[d["session"]["id"]] = dict(d["session"])
    elif t == "session_updated" and d["id"] in rows:
        rows[d["id"]].update({k: v for k, v in d.items() if k != "rev"})
    elif t == "session_deleted":
        rows.pop(d["session_id"], None)


async def fresh_rows(c: Client) -> dict[str, dict]:
    listed = await c.request("list_sessions", include_archived=True)
    return {r["id"]: r for r in listed["rows"]}


async def patched_rows_settle(watcher: Client, start: dict[str, dict], reader: Client) -> dict[str, dict]:
    """The rows a page holds after applying every push so far to `start`,
    once they equal what a fresh list returns (a push still in flight on a
    busy machine is waited for, not raced by a sleep). Fails after 30 s."""
    with trio.fail_after(30):
        while True:
            rows = {k: dict(v) for k, v in start.items()}
            for f in watcher.pushes:
                apply_push(rows, f)
            if rows == await fresh_rows(reader):
                return rows
            await trio.sleep(0.05)


async def wait_status(c: Client, sid: str, status: str, after: int = 0) -> dict:
    with trio.fail_after(30):
        while True:
            for f in c.pushes[after:]:
                if f["type"] == "session_updated" and f["data"]["id"] == sid and f["data"].get("status") == status:
                    return f
            await trio.sleep(0.02)


async def test_a_client_that_only_listed_sees_replies_start_and_end(root, nursery):
    server = await start_server(nursery, root, speed=40.0, tokens=(20, 30))
    async with server.client() as lister, server.client() as chatter, server.client() as late:
        rows = await fresh_rows(lister)
        ack = await chatter.request("chat", content="hello there")
        sid = ack["session_id"]
        running = await wait_status(lister, sid, "running")
        assert set(running["data"]) <= ROW_KEYS and "title" not in running["data"]
        idle = await wait_status(lister, sid, "idle")
        assert set(idle["data"]) <= ROW_KEYS
        stop_ack = await chatter.request("chat", content="and a second, stopped", session_id=sid)
        await wait_status(lister, sid, "running", lister.pushes.index(idle) + 1)
        await chatter.request("stop", session_id=sid, msg_id=stop_ack["reply_id"])
        await wait_status(lister, sid, "idle", lister.pushes.index(idle) + 1)
        # Rows patched live come to equal a late client's list (titles and
        # the last pushes land when they land).
        await patched_rows_settle(lister, rows, late)


async def test_regenerate_then_switch_branches_restores_the_exact_view(root, nursery):
    server = await start_server(nursery, root, speed=0.0, tokens=(3, 6))
    async with server.client() as a, server.client() as b:
        ack = await a.request("chat", content="turn 0")
        sid = ack["session_id"]
        await a.request("subscribe_msg", session_id=sid, msg_id=ack["reply_id"], offset=0)
        await a.wait_done(sid, ack["reply_id"])
        first_reply = ack["reply_id"]
        for k in range(1, 10):
            nxt = await a.request("chat", content=f"turn {k}", session_id=sid)
            await a.request("subscribe_msg", session_id=sid, msg_id=nxt["reply_id"], offset=0)
            await a.wait_done(sid, nxt["reply_id"])
        before = await a.request("load_session", session_id=sid)
        assert len([m for m in before["messages"] if m["caller"] is None]) == 20
        await b.request("load_session", session_id=sid)  # b watches the session
        regen = await a.request("retry", session_id=sid, msg_id=first_reply)  # regenerate a finished reply
        with trio.fail_after(10):  # the retry moved the head: watchers are told
            await b.wait_for(lambda f: f["type"] == "head_moved" and f["data"]["head"] == regen["reply_id"])
        await a.request("subscribe_msg", session_id=sid, msg_id=regen["reply_id"], offset=0)
        await a.wait_done(sid, regen["reply_id"])
        now = await a.request("load_session", session_id=sid)
        conv = [m for m in now["messages"] if m["caller"] is None]
        assert [m["msg_id"] for m in conv] == [before["messages"][0]["msg_id"], regen["reply_id"]]
        assert conv[1]["siblings"] == [first_reply, regen["reply_id"]]  # "‹ 2/2 ›"
        old = await a.request("load_session", session_id=sid, msg_id=first_reply)  # readable without switching
        assert [m["msg_id"] for m in old["messages"]] == [m["msg_id"] for m in before["messages"]]
        switched = await a.request("switch_branch", session_id=sid, msg_id=first_reply)
        assert switched["head"] == before["head"]
        with trio.fail_after(10):
            moved = await b.wait_for(lambda f: f["type"] == "head_moved" and f["data"]["head"] == before["head"])
        assert moved["data"]["session_id"] == sid
        after = await b.request("load_session", session_id=sid)
        strip = [{k: v for k, v in m.items() if k != "siblings"} for m in after["messages"]]
        assert strip == [{k: v for k, v in m.items() if k != "siblings"} for m in before["messages"]]
        assert [m for m in after["messages"] if m["caller"] is None][1]["siblings"] == \
            [first_reply, regen["reply_id"]]
        back = await a.request("switch_branch", session_id=sid, msg_id=regen["reply_id"])
        assert back["head"] == regen["reply_id"]


async def test_every_subscription_ends_with_a_terminal_update_on_delete(root, nursery):
    server = await start_server(nursery, root, speed=5.0, tokens=(200, 300))
    async with server.client() as watcher, server.client() as deleter:
        ack = await watcher.request("chat", content="a long one")
        sid = ack["session_id"]
        await watcher.request("subscribe_msg", session_id=sid, msg_id=ack["reply_id"], offset=0)
        with trio.fail_after(10):
            while not watcher.content.get((sid, ack["reply_id"])):
                await trio.sleep(0.02)
        await deleter.request("delete_session", session_id=sid)
        with trio.fail_after(10):
            status = await watcher.wait_done(sid, ack["reply_id"])
        assert status == "aborted"
        last = [f for f in watcher.pushes if f["type"] == "msg_update"][-1]["data"]
        assert last["aborted_reason"] == "session deleted"
        with trio.fail_after(10):
            while server.store.hub.count():
                await trio.sleep(0.02)


async def test_every_subscription_ends_when_the_store_stops(root):
    from sessionlog_store.server.stores import open_session_store
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="x")
        # A placeholder left running by another process: no producer here.
        from sessionlog_store.eventstore.events import MessageCreated
        await store.es.append(meta.id, MessageCreated(msg_id="elsewhere", role="assistant", kind="llm_reply",
                                                      status="running"))
        sub = await store.subscribe(meta.id, "elsewhere")
    updates = []
    with trio.fail_after(5):
        async for u in sub:
            updates.append(u)
    assert updates[-1].status == "aborted" and updates[-1].aborted_reason == "server shutdown"
    assert store.hub.count() == 0


async def test_a_channel_chat_is_born_with_its_first_message_in_one_write(root, nursery):
    server = await start_server(nursery, root, speed=0.0, tokens=(3, 4))
    async with server.client() as c:
        ack = await c.request("chat", content="hi from wechat", source="wechat", agent_id="helper")
        sid = ack["session_id"]
        row = (await c.request("load_session", session_id=sid))["session"]
        assert row["source"] == "wechat" and row["agent_id"] == "helper"
    recs = scan(sid, read_log(OS_FILES, root, sid), expect_seq=1).records
    assert [type(r.event).__name__ for r in recs[:2]] == ["SessionCreated", "MessageCreated"]
    assert recs[0].ts == recs[1].ts, "one write at birth: no empty-shell window"
    assert recs[1].event.started_at is not None, "user messages carry started_at"


async def test_a_title_given_at_creation_is_the_users(root, nursery):
    server = await start_server(nursery, root, speed=0.0, tokens=(3, 4))
    async with server.client() as c:
        made = await c.request("create_session", title="My plan")
        sid = made["session"]["id"]
        assert made["session"]["_user_titled"] is True
        ack = await c.request("chat", content="write the plan please", session_id=sid)
        await c.request("subscribe_msg", session_id=sid, msg_id=ack["reply_id"], offset=0)
        await c.wait_done(sid, ack["reply_id"])
        await trio.sleep(0.3)  # a title task would have run by now
        assert (await c.request("load_session", session_id=sid))["session"]["title"] == "My plan"


async def test_relocation_only_repairs(root, nursery, tmp_path):
    server = await start_server(nursery, root, speed=0.0, tokens=(3, 4))
    a, b, spare = tmp_path / "a", tmp_path / "b", tmp_path / "spare"
    for d in (a, b, spare):
        d.mkdir()
    async with server.client() as c:
        pa = (await c.request("create_project", name="a", path=str(a)))["project"]
        pb = (await c.request("create_project", name="b", path=str(b)))["project"]
        bound = await c.request("chat", content="in a", project_id=pa["id"])
        other = await c.request("chat", content="in default")

        async def code(**kw: str) -> str:
            with pytest.raises(ServerError) as e:
                await c.request("relocate_project", **kw)
            return str(e.value.code)
        assert await code(session_id=bound["session_id"], project_id=pa["id"], path=str(spare)) \
            == "project_not_missing"
        a.rename(tmp_path / "a-moved")
        assert await code(session_id=bound["session_id"], project_id=pa["id"], path=str(b)) == "path_in_use"
        assert await code(session_id=other["session_id"], project_id=pa["id"], path=str(spare)) \
            == "project_not_bound"
        out = await c.request("relocate_project", session_id=bound["session_id"], project_id=pa["id"],
                              path=str(tmp_path / "a-moved"))
        assert out["ok"] and pb["id"] != pa["id"]


async def test_msg_update_omits_empty_optional_fields(root, nursery):
    server = await start_server(nursery, root, speed=50.0, tokens=(20, 30))
    async with server.client() as c:
        ack = await c.request("chat", content="plain words")
        await c.request("subscribe_msg", session_id=ack["session_id"], msg_id=ack["reply_id"], offset=0)
        await c.wait_done(ack["session_id"], ack["reply_id"])
        updates = [f["data"] for f in c.pushes if f["type"] == "msg_update"]
        assert all("error" not in u and "aborted_reason" not in u for u in updates)
        assert all({"session_id", "msg_id", "seq", "offset", "content_delta", "status", "durable_seq"} <= set(u)
                   for u in updates)


async def test_the_session_list_resumes_exactly(root, nursery):
    server = await start_server(nursery, root, speed=0.0, tokens=(2, 3))
    async with server.client() as away:
        listed = await away.request("list_sessions", include_archived=True)
        rows = {r["id"]: r for r in listed["rows"]}
        pos = listed["rev"]
    async with server.client() as busy:
        sids = []
        for k in range(20):
            sids.append((await busy.request("create_session", title=f"s{k}"))["session"]["id"])
        for k, sid in enumerate(sids):
            if k % 3 == 0:
                await busy.request("rename_session", session_id=sid, title=f"renamed {k}")
            if k % 3 == 1:
                await busy.request("set_archived", session_id=sid, archived=True)
            if k % 4 == 0:
                await busy.request("delete_session", session_id=sid)
        for k in range(20):
            await busy.request("set_pinned", session_id=sids[1], pinned=bool(k % 2))
    async with server.client() as back:
        changes = await back.request("list_sessions", since=pos)
        assert len(changes["changes"]) >= 50
        for ch in changes["changes"]:
            apply_push(rows, ch)
        assert rows == await fresh_rows(back)
        again = await back.request("list_sessions", since=changes["rev"])
        assert again["changes"] == []
        stale = await back.request("list_sessions", since="another-epoch:3")
        assert stale["relist"] is True and "rows" in stale


async def test_list_running_names_every_running_reply(root, nursery):
    server = await start_server(nursery, root, speed=5.0, tokens=(200, 300))
    async with server.client() as a, server.client() as b:
        acks = [await a.request("chat", content=f"long {k}") for k in range(3)]
        with trio.fail_after(10):
            while True:
                running = (await b.request("list_running"))["running"]
                mine = [r for r in running if r["kind"] == "llm_reply"]
                if len(mine) == 3 and all(r["length"] > 0 for r in mine):
                    break
                await trio.sleep(0.05)
        assert {r["msg_id"] for r in mine} == {x["reply_id"] for x in acks}
        assert all(r["started_at"] > 0 and r["session_id"] for r in mine)
        for x in acks:
            await a.request("stop", session_id=x["session_id"], msg_id=x["reply_id"])
        with trio.fail_after(10):
            while (await b.request("list_running"))["running"]:
                await trio.sleep(0.05)


def test_maintenance_dry_run_and_retention_flags(root):
    async def make() -> str:
        from sessionlog_store.server.stores import open_session_store
        async with open_session_store(root) as store:
            meta, _ = await store.create_session()  # an empty shell
            await store.create_session(first_message="kept")
            return meta.id
    shell = trio.run(make)
    import time
    time.sleep(0.05)
    r = run_cli("maintenance", "--root", root, "--dry-run", "--empty-shell-age", "0.01")
    assert r.returncode == 0 and f"would remove {shell} (empty shell)" in r.stdout, r.stdout + r.stderr
    assert os.path.exists(os.path.join(root, "sessions", shell)), "a dry run changes nothing"
    r = run_cli("maintenance", "--root", root, "--dry-run")  # the default: 1 h
    assert shell not in r.stdout
    r = run_cli("maintenance", "--root", root, "--empty-shell-age", "0.01")
    assert r.returncode == 0 and f"removed {shell}" in r.stdout
    assert not os.path.exists(os.path.join(root, "sessions", shell))
    r = run_cli("serve", "--root", root, "--max-sessions", "-1")
    assert r.returncode == 2 and "must not be negative" in r.stderr


async def test_every_subscription_ends_when_the_store_fails(root):
    import errno

    from sessionlog_store.eventstore import StoreBroken
    from sessionlog_store.server.stores import open_session_store

    from .test_faults import FaultyFS
    fs = FaultyFS("write", errno.EIO, permanent=True)
    async with open_session_store(root, fs=fs, config=StoreConfig(progress_interval=0.01)) as store:
        meta, _ = await store.create_session(first_message="x")
        async with trio.open_nursery() as n:
            ready = trio.Event()
            holder = {}

            async def produce() -> None:
                try:
                    async with store.inflight(meta.id) as msg:
                        holder["msg"] = msg
                        ready.set()
                        while True:
                            msg.write("y")
                            await trio.sleep(0.005)
                except StoreBroken:
                    pass
            n.start_soon(produce)
            await ready.wait()
            sub = await store.subscribe(meta.id, holder["msg"].msg_id)
            fs.armed = True  # the next batch's write fails: the store breaks
            updates = []
            with trio.fail_after(10):
                async for u in sub:
                    updates.append(u)
        assert updates[-1].status == "aborted" and updates[-1].aborted_reason == "store failure"
        assert store.hub.count() == 0


async def test_startup_logs_one_summary_line_of_maintenance(root, caplog):
    import logging

    from sessionlog_store.projections.maintenance import MaintenanceConfig
    from sessionlog_store.server.stores import open_session_store
    async with open_session_store(root) as store:
        await store.create_session()
        await store.create_session()
    caplog.set_level(logging.INFO, logger="sessionlog")
    await trio.sleep(0.02)
    cfg = StoreConfig(maintenance=MaintenanceConfig(empty_shell_age=0.01))
    async with open_session_store(root, config=cfg) as store:
        assert len(store.removed_at_start) == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("maintenance:")]
    assert lines == ["maintenance: removed 2 empty shell(s), 0 expired archive(s), 0 archived session(s) "
                     "over capacity; 0 session(s) back to idle, 0 message(s) aborted"]


def test_the_feed_answers_exactly_or_says_relist():
    from sessionlog_store.server.domain.feed import ChangeFeed
    feed = ChangeFeed(history=3)
    start = feed.position
    for k in range(3):
        feed.add("session_updated", {"id": f"s{k}"})
    assert [d["id"] for _, d in feed.since(start)] == ["s0", "s1", "s2"]  # exactly the history
    feed.add("session_updated", {"id": "s3"})
    assert feed.since(start) is None, "older than the history: re-list"
    assert [d["id"] for _, d in feed.since(f"{feed.epoch}:1")] == ["s1", "s2", "s3"]
    assert feed.since(feed.position) == []
    assert feed.since(f"{feed.epoch}:99") is None and feed.since("other:1") is None
