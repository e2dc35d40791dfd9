"""Hostile clients: traversal attempts through every action that takes an id
or a path, tokens that differ anywhere, and a stalled subscriber among 50."""
from __future__ import annotations

import json
import os

import pytest
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket

from sessionlog_store.server.edge import protocol as p

from .test_ws import TOKEN, log_content, start_server

TRAVERSALS = ["..", "../..", "../../etc/passwd", "/etc/passwd", "a/../../b", "..\\..\\x", "%2e%2e%2f",
              "a\x00b", ".hidden", "sessions/../x", "~root", "x" * 65, "", " ", "\u2025"]
ID_ACTIONS = [(tag, [f.name for f in __import__("msgspec").structs.fields(c) if f.name in ("session_id", "msg_id")])
              for c in p.ClientAction.__args__ for tag in [c.__struct_config__.tag]]  # type: ignore[attr-defined]
ID_ACTIONS = [(a, f) for a, f in ID_ACTIONS if f]


def tree(path: str) -> set[str]:
    out = set()
    for dp, dns, fns in os.walk(path):
        for n in dns + fns:
            out.add(os.path.relpath(os.path.join(dp, n), path))
    return out


async def test_traversal_through_every_action_that_takes_an_id_or_a_path(root, nursery, tmp_path):
    server = await start_server(nursery, root)
    outside = tree(str(tmp_path))
    async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False) as ws:
        for action, fields in ID_ACTIONS:
            for bad in TRAVERSALS:
                frame = {"action": action, "session_id": "x", "msg_id": "m", "title": "t", "archived": True,
                         "pinned": True, "unread": True, "project_id": "default", "path": "/tmp", "content": "c"}
                frame = {k: v for k, v in frame.items() if k == "action" or k in
                         [f.name for f in __import__("msgspec").structs.fields(
                             next(c for c in p.ClientAction.__args__ if c.__struct_config__.tag == action))]}
                for field_name in fields:
                    frame[field_name] = bad
                await ws.send_message(json.dumps(frame))
                reply = json.loads(await ws.get_message())
                assert reply["type"] == "error", (action, bad, reply)
                assert reply["data"]["code"] in ("invalid_session_id", "bad_request", "unknown_session",
                                                 "unknown_message"), (action, bad, reply)
        for bad_path in ["../..", "relative/path", "/nonexistent/x", "/etc/passwd", "\x00"]:
            await ws.send_message(json.dumps({"action": "create_project", "name": "x", "path": bad_path}))
            reply = json.loads(await ws.get_message())
            assert reply["type"] == "error" and reply["data"]["code"] in ("bad_path", "bad_request"), reply
    assert tree(str(tmp_path)) - outside <= {p for p in tree(str(tmp_path)) if p.startswith("store")}
    assert not [s for s in os.listdir(os.path.join(root, "sessions"))], "no session folder was made"


@pytest.mark.parametrize("token", [TOKEN[:-1] + "X", "X" + TOKEN[1:], TOKEN + TOKEN, TOKEN.upper(), TOKEN[:1],
                                   TOKEN + "%00", "%20" + TOKEN])
async def test_tokens_differing_anywhere_are_refused(root, nursery, token):
    server = await start_server(nursery, root)
    with pytest.raises(HandshakeError):
        async with open_websocket("127.0.0.1", server.port, f"/ws?token={token}", use_ssl=False):
            pass


async def test_a_stalled_subscriber_among_fifty_is_dropped_and_the_others_stream_on(root, nursery):
    server = await start_server(nursery, root, speed=150.0, tokens=(150, 160), send_timeout=1.0)
    for _ in range(150):  # so that the stalled client's replies are megabytes
        await server.store.create_session(title="padding " * 20, first_message="x" * 70)
    with trio.fail_after(60):
        async with server.client() as starter:
            ack = await starter.request("chat", content="for fifty listeners")
            sid, rid = ack["session_id"], ack["reply_id"]
            async with open_websocket("127.0.0.1", server.port, f"/ws?token={TOKEN}", use_ssl=False,
                                      message_queue_size=1) as stalled:
                await stalled.send_message(json.dumps({"action": "subscribe_msg", "session_id": sid, "msg_id": rid}))
                try:
                    for _ in range(300):  # and flood it with replies it never reads
                        await stalled.send_message('{"action": "list_sessions", "include_archived": true}')
                except ConnectionClosed:  # (already dropped, on a busy machine: its send timeout is 1 s)
                    pass
                results: list[str] = []

                async def listener() -> None:
                    async with server.client() as c:
                        await c.follow(sid)
                        assert await c.wait_done(sid, rid) == "done"
                        assert not c.duplicated_or_missing
                        results.append(c.content[(sid, rid)])
                async with trio.open_nursery() as n:
                    for _ in range(49):
                        n.start_soon(listener)
                assert len(results) == 49 and len(set(results)) == 1
                assert results[0] == await log_content(server, root, sid, rid)
                with pytest.raises(ConnectionClosed):
                    while True:
                        await stalled.get_message()
            while len(server.server.connections) > 1:  # only the starter is left: the stalled one is gone
                await trio.sleep(0.05)
