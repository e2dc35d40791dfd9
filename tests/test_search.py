"""Full-text search (issue 30 item 7): a projection of the logs in SQLite
FTS5, kept live by the appends, caught up at a start, rebuilt by `sessionlog
rebuild`, answered per user over the WebSocket and HTTP."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from typing import Any

import trio

from sessionlog_store.eventstore.events import (
    MessageCreated,
    MessageFinalized,
    MessageProgress,
    OwnerChanged,
    SessionCreated,
    SessionDeleted,
)
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.session import SessionState
from sessionlog_store.projections.search import Drop, Put, Redo, SearchFold, fts_query, split_marks
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.local.search import FILE
from sessionlog_store.server.stores import open_session_store

from .httpc import HttpClient
from .conftest import read_logs
from .processes import ROOT, ServeProcess, free_port, wait_for
from .test_users import TOKENS, start_users, user


def rec(seq: int, ev: object) -> Record:
    return Record(seq, 1000.0 + seq, ev)  # type: ignore[arg-type]


def test_the_fold_indexes_a_message_when_it_finishes_with_the_text_it_ended_with():
    # the loaded session, as the store folds it before the search index sees a record
    state, loaded = SessionState(), [True]
    f = SearchFold(lambda sid, mid: (m.content if loaded[0] and (m := state.messages.get(mid)) is not None
                                     else None))

    def apply(r: Record) -> list[object]:
        state.apply(r)
        return f.apply("s", r)  # type: ignore[return-value]
    state.apply(rec(0, SessionCreated(session_id="s", title="t")))
    assert apply(rec(1, MessageCreated(msg_id="u", content="hello there"))) == [
        Put("s", "u", "user", "chat", 1001.0, "hello there")]
    assert apply(rec(2, MessageCreated(msg_id="r", role="assistant", kind="llm_reply", status="running"))) == []
    assert apply(rec(3, MessageProgress(msg_id="r", content_delta="a draft", offset=0))) == []
    assert apply(rec(4, MessageProgress(msg_id="r", content_delta="n answer", offset=1))) == []  # (a rewrite)
    assert apply(rec(5, MessageFinalized(msg_id="r"))) == [Put("s", "r", "assistant", "llm_reply", 1002.0, "an answer")]
    # a finalize with its content: that text; one begun before the fold saw it: the log knows it
    apply(rec(6, MessageCreated(msg_id="t", role="tool", kind="tool_call", status="running")))
    assert apply(rec(7, MessageFinalized(msg_id="t", content="final words"))) == [
        Put("s", "t", "tool", "tool_call", 1006.0, "final words")]
    assert apply(rec(8, MessageFinalized(msg_id="older"))) == [Redo("s")]
    assert apply(rec(9, MessageProgress(msg_id="gone", offset=5, content_delta="x"))) == []
    # its session not loaded when it ends: the log knows its text
    apply(rec(10, MessageCreated(msg_id="q", role="assistant", kind="llm_reply", status="running")))
    apply(rec(11, MessageProgress(msg_id="q", content_delta="unseen", offset=0)))
    loaded[0] = False
    assert apply(rec(12, MessageFinalized(msg_id="q"))) == [Redo("s")]
    assert apply(rec(13, SessionDeleted())) == [Drop("s")]


def test_a_query_is_words_the_last_a_prefix_and_operators_are_words():
    assert fts_query("lighthouse keep") == 'body : "lighthouse" body : "keep"*'
    assert fts_query("lighthouse keeper ") == 'body : "lighthouse" body : "keeper"'
    assert fts_query('NOT "x" OR owner:y*') == 'body : "NOT" body : "x" body : "OR" body : "owner" body : "y"'
    assert fts_query("  ...  ") is None
    assert split_marks("a \x02bc\x03 d \x02e\x03") == ("a bc d e", [(2, 4), (7, 8)])


async def test_finished_messages_are_found_running_ones_when_they_end_deleted_ones_never(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="Where does the lighthouse keeper live?")
        other, _ = await store.create_session(first_message="something else", owner="bob")
        async with trio.open_nursery() as n:
            writing, go_on = trio.Event(), trio.Event()

            async def reply() -> None:
                async with store.inflight(meta.id) as msg:
                    msg.write("By the harbour, near the windmill.")
                    store.saver.flush(msg)
                    writing.set()
                    await go_on.wait()
                    msg.write(" Bring a lantern.")
            n.start_soon(reply)
            await writing.wait()
            await store.search.settled()
            assert (await store.search.search("windmill", owner=""))["hits"] == [], "running: not yet"
            go_on.set()
        await store.search.settled()
        found = (await store.search.search("lantern windm", owner=""))["hits"]
        assert [h["role"] for h in found] == ["assistant"]
        assert found[0]["snippet"] == "By the harbour, near the windmill. Bring a lantern."
        assert found[0]["marks"] == [[25, 33], [43, 50]]  # "windmill", "lantern"
        assert [h["role"] for h in (await store.search.search("lighthouse", owner=""))["hits"]] == ["user"]
        assert (await store.search.search("lighthouse", owner="bob"))["hits"] == [], "another user's: not found"
        assert len((await store.search.search("something", owner="bob"))["hits"]) == 1
        assert len((await store.search.search("lighthouse", owner=None))["hits"]) == 1  # (an admin: everyone's)
        await store.delete_session(meta.id)
        await store.search.settled()
        assert (await store.search.search("lighthouse", owner=""))["hits"] == []


async def test_a_session_made_while_the_start_catches_up_is_not_read_again(root, monkeypatch):
    """The start's catch-up reads the index file in a thread; a session made
    meanwhile (its records folded as they come) was taken for one the index
    is behind on and read again from its log (a loaded suite: `reindexed`
    1 where 0). The catch-up now covers the sessions as the start left them."""
    import threading

    from sessionlog_store.server.local.search import SearchDB
    gate, reading = threading.Event(), threading.Event()
    indexed = SearchDB.indexed

    def held(self):  # type: ignore[no-untyped-def]
        reading.set()
        gate.wait(30)  # (the catch-up's read of the index file, held until the session is made)
        return indexed(self)
    monkeypatch.setattr(SearchDB, "indexed", held)
    async with open_session_store(root) as store:
        with trio.fail_after(30):
            while not reading.is_set():
                await trio.sleep(0.01)
        meta, _ = await store.create_session(first_message="made during the catch-up: basalt")
        gate.set()
        await store.search.settled()
        assert len((await store.search.search("basalt", owner=""))["hits"]) == 1
        assert store.search.reindexed == 0, "no session read again"


async def test_a_reply_is_indexed_from_its_loaded_session_even_with_no_state_cache(root):
    """The index takes a finished reply's text from the loaded session; with
    `state_cache` 0 the session a reply starts in was dropped from memory at
    once, and each finished reply made the index read its whole session
    again. A reply's session now stays loaded while it runs; a session
    deleted in the batch that would be read again stays out."""
    async with open_session_store(root, config=StoreConfig(state_cache=0)) as store:
        meta, _ = await store.create_session(first_message="first question")
        others = [(await store.create_session(first_message=f"other {i}"))[0].id for i in range(3)]
        for i in range(3):
            async with store.inflight(meta.id) as msg:
                for sid in others:  # (other sessions loaded meanwhile: with no cache, each drops the last)
                    await store.load_session(sid)
                msg.write(f"answer number {i} about granite")
            await store.append_message(meta.id, f"question {i + 2}")
        await store.search.settled()
        assert len((await store.search.search("granite", owner=""))["hits"]) == 3
        assert store.search.reindexed == 0, "no session read again"
        # a session to be read again (a reply ended while it was not loaded) and deleted before the
        # index writes them, in one batch: its Drop stands, it is not left in the index's sessions
        gone = others[0]
        assert gone in await store.search._call(store.search.db.indexed)
        store.search._queue.append((gone, Redo(gone), 99))  # (what the fold queues then)
        await store.delete_session(gone)
        await store.search.settled()
        assert gone not in await store.search._call(store.search.db.indexed)


async def test_the_index_waits_for_its_records_to_be_durable_not_for_the_log_writer(root):
    """The index writes a batch once its records are durable (in the
    journal). It used to wait for them to be in the log files too (a
    flush), which ended the log writer's linger at each message created or
    finished: every log written at once again (issue 29)."""
    async with open_session_store(root, config=StoreConfig(log_write_interval=3600)) as store:
        meta, _ = await store.create_session(first_message="a question about basalt")
        await store.append_message(meta.id, "and one about obsidian")
        await store.search.settled()
        assert len((await store.search.search("obsidian", owner=""))["hits"]) == 1
        assert store.es.written_seq(meta.id) < store.es.durable_seq(meta.id), "the index had the log written"


async def test_the_index_checkpoint_waits_for_the_log_writer_without_ending_its_linger(root):
    """The registry checkpoint (index.json) waits for the logs to hold what
    it records, as readers do, but without ending the log writer's linger:
    under streaming it ran every few seconds, each time a burst of a write
    for every log."""
    from trio.testing import wait_all_tasks_blocked
    cfg = StoreConfig(log_write_interval=3600, checkpoint_interval=3600)
    with trio.fail_after(60):  # (a hang guard: the stop's own checkpoint must not wait the hour out)
        async with open_session_store(root, config=cfg) as store:
            meta, _ = await store.create_session(first_message="hello")
            await store.append_message(meta.id, "again")
            wanted = store.es.writer.wanted_no
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.keeper.caches.write_index, False)  # type: ignore[attr-defined]
                await wait_all_tasks_blocked()
                assert store.es.writer.wanted_no == wanted, "the periodic checkpoint ended the linger"
                assert store.es.written_seq(meta.id) < store.es.durable_seq(meta.id)
                nursery.cancel_scope.cancel()
    assert b"again" in read_logs(root)[meta.id], "the stop wrote what lingered"


async def test_a_start_catches_up_what_the_index_missed_and_a_damaged_index_is_written_again(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="the quartz mountain")
        async with store.inflight(meta.id) as msg:
            msg.write("Quartz is a mineral.")
        await store.search.settled()
    # what a crash leaves: the index behind the logs (its last batches never written)
    db = sqlite3.connect(os.path.join(root, FILE))
    db.executescript("DELETE FROM fts; DELETE FROM docs; UPDATE indexed SET seq = 1;")
    db.close()
    async with open_session_store(root) as store:
        await store.search.settled()
        assert len((await store.search.search("quartz", owner=""))["hits"]) == 2
    with open(os.path.join(root, FILE), "r+b") as f:  # torn garbage in the file
        f.write(b"not a database at all" * 100)
    async with open_session_store(root) as store:
        await store.search.settled()
        assert len((await store.search.search("mineral", owner=""))["hits"]) == 1
    os.unlink(os.path.join(root, FILE))
    r = subprocess.run([sys.executable, "-m", "sessionlog_store", "rebuild", "--root", root], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    assert "search index" in r.stdout
    db = sqlite3.connect(os.path.join(root, FILE))
    assert db.execute("SELECT count(*) FROM docs").fetchone()[0] == 2
    db.close()


async def test_search_over_http_and_the_websocket_is_each_users_own(root, nursery, tmp_path):
    server = await start_users(nursery, root, tmp_path)
    async with HttpClient(server.port, TOKENS["alice"]) as alice, HttpClient(server.port, TOKENS["bob"]) as bob:
        sid = (await alice.request("POST", "/v1/sessions", {"title": "Birds"})).json()["session"]["id"]
        await alice.request("POST", f"/v1/sessions/{sid}/messages", {"content": "the albatross glides"})
        await server.store.search.settled()
        a = (await alice.request("GET", "/v1/search?q=albat")).json()
        assert [(h["session_id"], h["title"], h["snippet"]) for h in a["hits"]] == [(sid, "Birds", "the albatross glides")]
        assert (await bob.request("GET", "/v1/search?q=albatross")).json()["hits"] == []
        bad = await alice.request("GET", "/v1/search?q=x&limit=1000")
        assert bad.status == 400
    async with user(server, "alice") as ws:
        got = await ws.request("search", query="glides")
        assert [h["msg_id"] for h in got["hits"]] == [a["hits"][0]["msg_id"]]
    async with user(server, "bob") as ws:
        assert (await ws.request("search", query="glides"))["hits"] == []


def test_a_reply_finished_before_a_sigkill_is_found_after_the_restart(tmp_path):
    s = ServeProcess(str(tmp_path / "store"), free_port(), speed=0.0)
    s.start()
    try:
        api = s.http()
        ack = api.post("/v1/chat", json={"content": "tell me about replay"}).json()

        def reply() -> dict[str, Any] | None:
            m = api.get(f"/v1/sessions/{ack['session_id']}").json()["messages"]
            return next((x for x in m if x["msg_id"] == ack["reply_id"] and x["status"] == "done"), None)
        wait_for(lambda: reply() is not None, "the reply finished (and durable)", within=60)
        content = reply()["content"]
        s.kill()  # the index may not have its last batch: the start catches up
        s.start()
        word = max(content.replace("*", " ").split(), key=len)
        # (`indexing`: the start's catch-up is still running)
        wait_for(lambda: not api.get("/v1/search", params={"q": word}).json()["indexing"], "caught up", within=60)
        got = api.get("/v1/search", params={"q": word}).json()
        assert ack["reply_id"] in [x["msg_id"] for x in got["hits"]], (word, got)
    finally:
        s.stop()


async def test_a_failed_index_write_stops_the_writing_and_the_next_start_catches_up(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="the first words")
        await store.search.settled()
        store.search.db.db.execute("PRAGMA query_only = ON")  # every write of the index now fails
        await store.append_events(meta.id, MessageCreated(msg_id="m2", content="the lighthouse keeper"))
        await store.search.settled()
        assert store.search.broken is not None
        store.search.db.db.execute("PRAGMA query_only = OFF")  # (the disk has room again: a later batch would write)
        await store.append_events(meta.id, MessageCreated(msg_id="m3", content="a later harbour"))  # (its seq moves on)
        await store.search.settled()
        got = await store.search.search("first", owner="")
        assert got["complete"] is False and len(got["hits"]) == 1  # it answers from what it holds
    async with open_session_store(root) as store:
        await store.search.settled()
        assert len((await store.search.search("lighthouse", owner=""))["hits"]) == 1, "caught up"
        assert len((await store.search.search("harbour", owner=""))["hits"]) == 1


async def test_a_session_given_to_another_user_is_found_by_its_new_owner_only(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="the albatross glides", owner="alice")
        await store.search.settled()
        assert len((await store.search.search("albatross", owner="alice"))["hits"]) == 1
        await store.append_events(meta.id, OwnerChanged(owner="bob", previous="alice"))
        await store.search.settled()
        assert (await store.search.search("albatross", owner="alice"))["hits"] == []
        assert len((await store.search.search("albatross", owner="bob"))["hits"]) == 1
