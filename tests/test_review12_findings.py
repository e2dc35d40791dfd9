"""Regressions for what the adversarial reviews of issue 12 (the journal,
the fan-out) found; each failed before its fix."""
from __future__ import annotations

import json
import os
import shutil
import struct

import msgspec
import trio
from trio_websocket import ConnectionClosed, open_websocket

from sessionlog_store.eventstore import open_event_store
from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, SessionCreated, SessionRenamed
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.journal import apply_journal, decode_frames, list_segments
from sessionlog_store.eventstore.local.log import log_path, read_log
from sessionlog_store.eventstore.record import scan
from sessionlog_store.projections.recovery import load_session_state
from sessionlog_store.server.domain.subscriptions import FRAME_BYTES, MsgUpdate, split_update

from .test_ws import TOKEN, start_server


async def _send(ws, action: str, **kw) -> None:  # type: ignore[no-untyped-def]
    await ws.send_message(json.dumps({"action": action, **kw}))


async def _chat(ws) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """Send a chat turn and subscribe to its reply: (session, reply)."""
    await _send(ws, "chat", content="hi", request_id=1)
    while True:
        f = json.loads(await ws.get_message())
        if f.get("request_id") == 1:
            break
    sid, rid = f["data"]["session_id"], f["data"]["reply_id"]
    await _send(ws, "subscribe_msg", session_id=sid, msg_id=rid, offset=0, request_id=2)
    return sid, rid


async def _chat_and_follow(port: int) -> tuple[str, str, list[dict]]:
    """Start a reply over a real socket and follow it to its terminal update."""
    updates: list[dict] = []
    async with open_websocket("127.0.0.1", port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
        sid, rid = await _chat(ws)
        with trio.fail_after(10):
            while not updates or updates[-1]["status"] == "running":
                f = json.loads(await ws.get_message())
                if f["type"] == "msg_update":
                    updates.append(f["data"])
    return sid, rid, updates


async def test_a_stop_while_a_reply_ends_done_tells_its_subscriber_done(root, nursery):
    server = await start_server(nursery, root, speed=100.0, tokens=(30, 30))
    store = server.server.store

    def on_rec(sid, rec, end):  # type: ignore[no-untyped-def]
        if type(rec.event) is MessageFinalized and rec.event.status == "done" and not store.shutting_down:
            nursery.start_soon(server.server.prepare_stop)  # while `done` waits to be durable
    store.es.listeners.append(on_rec)
    sid, rid, updates = await _chat_and_follow(server.port)
    await store.es.flush()
    state, _ = load_session_state(OS_FILES, root, sid, use_snapshot=False)
    assert updates[-1]["status"] == state.messages[rid].status == "done"


async def test_a_reply_whose_placeholder_is_written_as_a_stop_begins_ends_at_once(root, nursery):
    """The chat is in flight as the stop begins: it gets its chat_ack before
    the close handshake (it was closed unanswered under load), and its reply,
    live only as the stop began, is finalized `aborted` before the stop ends.
    The subscribe sent after the ack is read after the stop began: at most
    `shutting_down`."""
    server = await start_server(nursery, root, speed=50.0, tokens=(300, 300))
    store = server.server.store
    stopped = trio.Event()

    async def stop() -> None:
        await server.server.prepare_stop()
        stopped.set()

    def on_rec(sid, rec, end):  # type: ignore[no-untyped-def]
        if type(rec.event) is MessageCreated and rec.event.status == "running" and not store.shutting_down:
            nursery.start_soon(stop)  # while the placeholder waits for its sync
    store.es.listeners.append(on_rec)
    with trio.fail_after(10):
        async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
            sid, rid = await _chat(ws)
            frames: list[dict] = []
            try:
                while True:
                    frames.append(json.loads(await ws.get_message()))
            except ConnectionClosed as e:
                assert e.reason is not None and e.reason.code == 1001
        answers = [f for f in frames if f.get("request_id") == 2]
        assert all(f["type"] == "error" and f["data"]["code"] == "shutting_down" for f in answers), answers
        await stopped.wait()
    assert not store.saver.active
    await store.es.flush()
    state, _ = load_session_state(OS_FILES, root, sid, use_snapshot=False)
    reply = state.messages[rid]
    assert reply.status == "aborted" and reply.metadata.get("aborted_reason") == "server shutdown"


def test_catch_up_pieces_are_flagged_and_a_tree_piece_fits_a_frame():
    tree = {"fn": "x", "children": [{"n": "y" * 1000}] * 300}  # ~300 KB of JSON
    u = MsgUpdate(session_id="s", msg_id="m", seq=9, offset=0, content_delta="\u0001" * 300_000,
                  status="done", durable_seq=9, tree=tree)
    pieces = split_update(u)
    assert "".join(p.content_delta for p in pieces) == u.content_delta
    assert all(p.more and p.status == "running" and p.tree is None for p in pieces[:-1])
    assert not pieces[-1].more and pieces[-1].status == "done" and pieces[-1].tree == tree
    enc = msgspec.json.Encoder()
    assert all(len(enc.encode(p)) <= FRAME_BYTES for p in pieces)


def _copy_open(tmp_path, work) -> str:  # type: ignore[no-untyped-def]
    live, copy = str(tmp_path / "live"), str(tmp_path / "copy")

    async def run() -> None:
        async with open_event_store(live, journal_sync_interval=3600) as es:
            await work(es, live)
            shutil.copytree(live, copy, ignore=shutil.ignore_patterns(".lock"))
    trio.run(run)
    return copy


def test_a_torn_last_frame_whose_text_holds_the_frame_magic_is_still_torn(tmp_path):
    async def work(es, live):  # type: ignore[no-untyped-def]
        await es.create("s", [SessionCreated(session_id="s", created_at=1.0)])
        await es.append("s", SessionRenamed(title="first"))
        await es.append("s", SessionRenamed(title="about SLJ1 frames " + "x" * 200))
    root = _copy_open(tmp_path, work)
    ((_, seg),) = list_segments(OS_FILES, root)[0]
    data = OS_FILES.read_bytes(seg)
    frames, _, _ = decode_frames(data, 1)
    pos = 0
    for _ in frames[:-1]:
        pos += 20 + struct.unpack_from("<4sQII", data, pos)[2]
    with open(seg, "r+b") as f:
        f.truncate(pos + (len(data) - pos) * 3 // 4)  # the last frame torn (never acknowledged)
    rep = apply_journal(OS_FILES, root)
    assert not [d for d in os.listdir(root) if d.startswith("journal-damaged")], rep.notes
    assert any("torn last write" in n for n in rep.notes)


def test_a_log_whose_first_line_is_over_64_kib_gets_its_records_back(tmp_path):
    live = str(tmp_path / "live")

    async def first() -> None:
        async with open_event_store(live) as es:
            await es.create("s", [SessionCreated(session_id="s", created_at=1.0, title="t" * 70_000)])
    trio.run(first)

    async def work(es, live):  # type: ignore[no-untyped-def]
        data = read_log(OS_FILES, live, "s")
        es.register("s", scan("s", data).records[-1].seq, len(data))  # what a start does
        await es.append("s", SessionRenamed(title="acknowledged"))
        await es.flush()
    root = _copy_open(tmp_path, work)
    data = read_log(OS_FILES, root, "s")
    with open(log_path(root, "s"), "r+b") as f:  # the unsynced log write lost
        f.truncate(len(data) - len(data.splitlines(keepends=True)[-1]))
    apply_journal(OS_FILES, root)
    assert [r.seq for r in scan("s", read_log(OS_FILES, root, "s")).records] == [1, 2]


async def test_a_refused_re_subscribe_leaves_the_old_subscription_streaming(root, nursery):
    """Review finding: re-subscribing with a bad offset closed the old
    subscription first, so the page's reply never got its terminal update."""
    server = await start_server(nursery, root, speed=100.0, tokens=(40, 40))
    async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
        sid, rid = await _chat(ws)
        await _send(ws, "subscribe_msg", session_id=sid, msg_id=rid, offset=10**9, request_id=3)
        statuses, refused = [], False
        with trio.fail_after(10):
            while not statuses or statuses[-1] == "running":
                f = json.loads(await ws.get_message())
                refused = refused or (f["type"] == "error" and f.get("request_id") == 3)
                if f["type"] == "msg_update":
                    statuses.append(f["data"]["status"])
    assert refused and statuses[-1] == "done"
