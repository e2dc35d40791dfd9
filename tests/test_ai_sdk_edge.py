"""The AI SDK's door at its edges (docs/HTTP.md: "The Vercel AI SDK"), over
real sockets: a chat's whole UI message stream; the resume route replaying
a reply an external producer streams, live, to its Stop (`abort`); leaving
a stream does not stop the reply; credentials, another user's chat, bad
ids and bodies, CORS; and the fold itself for the endings a live run
rarely shows (error, a failed tool call, a deleted session, a delta sent
twice)."""
from __future__ import annotations

import json
import re
import signal

import trio
import trio.testing

from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress,
                                                SessionDeleted)
from sessionlog_store.projections.ui_stream import UiReplyFold, ui_messages
from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.edge.aisdk import chat_session
from sessionlog_store.server.edge.auth import AuthConfig

from .httpc import HttpClient
from .processes import ServeProcess, free_port
from .test_deploy import start
from .test_users import TOKENS, tokens_file
from .test_users import start as start_users  # (a server of several users)
from .test_stream_space_review import GateFS
from .test_ws import TOKEN


def chunks(body: bytes) -> list[object]:
    out: list[object] = []
    for event in body.decode().split("\n\n"):
        if event.startswith("data: "):
            data = event[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat_body(chat: str, text: str) -> dict[str, object]:
    return {"id": chat, "messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": text}]}],
            "trigger": "submit-message", "messageId": None, "extra": "an app's own field"}


async def external_reply(c: HttpClient, chat: str) -> tuple[str, dict]:
    """A chat made through the door (its first turn answered), then a reply
    an external producer streams in it: (its session id, the opened reply)."""
    got = chunks((await c.request("POST", "/v1/ai/chat", chat_body(chat, "hi"))).body)
    sid = got[0]["messageMetadata"]["sessionId"]  # type: ignore[index]
    await c.request("POST", f"/v1/sessions/{sid}/messages", {"content": "and now?"})
    opened = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
    assert "reply_id" in opened, opened
    return sid, opened


async def test_a_chat_is_one_ui_message_stream_and_its_messages_come_back(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        a = await c.request("POST", "/v1/ai/chat", chat_body("chatOne", "search for durable logs"))
        assert a.status == 200 and a.headers["content-type"] == "text/event-stream"
        assert a.headers["x-vercel-ai-ui-message-stream"] == "v1"
        got = chunks(a.body)
        assert got[-1] == "[DONE]" and got[-2] == {"type": "finish", "finishReason": "stop"}
        start_ = got[0]
        assert isinstance(start_, dict) and start_["type"] == "start"
        reply, sid = start_["messageId"], start_["messageMetadata"]["sessionId"]
        assert sid == chat_session("", "chatOne")
        text = "".join(c["delta"] for c in got if isinstance(c, dict) and c["type"] == "text-delta")
        calls = [c for c in got if isinstance(c, dict) and c["type"].startswith("tool-")]
        assert [c["type"] for c in calls][:2] == ["tool-input-available", "tool-output-available"]
        assert calls[0]["toolName"] == "search" and calls[0]["dynamic"] is True
        # the call stands where it was made: after exactly the text the agent wrote before it
        tokens, _, _ = DemoAgent().plan("search for durable logs")
        first_call = got.index(calls[0])
        before = "".join(c["delta"] for c in got[:first_call] if isinstance(c, dict) and c["type"] == "text-delta")
        assert before == "".join(tokens[:max(1, len(tokens) // 3) + 1])
        loaded = (await c.request("GET", f"/v1/sessions/{sid}")).json()
        stored = {m["msg_id"]: m for m in loaded["messages"]}
        assert loaded["session"]["source"] == "ai-sdk"
        assert stored[reply]["content"] == text and stored[reply]["status"] == "done"
        assert calls[1]["output"] == stored[calls[1]["toolCallId"]]["content"]
        # a second turn goes into the same session
        a = await c.request("POST", "/v1/ai/chat", chat_body("chatOne", "and again"))
        assert chunks(a.body)[-1] == "[DONE]"
        history = (await c.request("GET", "/v1/ai/chat/chatOne/messages")).json()
        assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
        assert history[1]["id"] == reply and history[1]["parts"][-1] == {"type": "text", "text": text}
        assert {p["type"] for p in history[1]["parts"][:-1]} == {"dynamic-tool"}
        assert (await c.request("GET", "/v1/ai/chat/chatOne/stream")).status == 204  # nothing runs
        assert (await c.request("GET", "/v1/ai/chat/neverMade/messages")).json() == []


async def test_resume_replays_a_running_reply_whole_then_live_to_its_stop(root, nursery):
    """An external producer's reply, followed through the resume route: the
    text before the read (replayed), the text after it (live), a reader
    that leaves (the reply goes on), and a Stop: `abort`, "stopped by user"."""
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c, HttpClient(server.port, TOKEN) as reader:
        sid, opened = await external_reply(c, "resumed")
        stream = opened["stream"]
        assert (await c.request("POST", stream, raw=b"before ", headers={"Content-Type": "text/plain"})).status in (200, 204)
        # a reader that leaves at once: the reply goes on
        s = await trio.open_tcp_stream("127.0.0.1", server.port)
        await s.send_all(f"GET /v1/ai/chat/resumed/stream HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        await s.receive_some(100)
        await s.aclose()
        result: dict[str, bytes] = {}

        async def read() -> None:
            result["body"] = (await reader.request("GET", "/v1/ai/chat/resumed/stream")).body
        async with trio.open_nursery() as n:
            n.start_soon(read)
            for text in (b"after ", b"more"):
                a = await c.request("POST", stream, raw=text, headers={"Content-Type": "text/plain"})
                assert a.status in (200, 204), a.body
            await trio.sleep(0)  # (the reader is live or reads it all in its catch-up: either is exact)
            assert (await c.request("POST", f"/v1/sessions/{sid}/messages/{opened['reply_id']}/stop")).status == 200
        got = chunks(result["body"])
        stored = [m for m in (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"]
                  if m["msg_id"] == opened["reply_id"]][0]
        assert stored["content"] == "before after more"
        assert got[0] == {"type": "start", "messageId": opened["reply_id"], "messageMetadata": {"sessionId": sid}}
        assert "".join(c["delta"] for c in got if isinstance(c, dict) and c["type"] == "text-delta") == \
            "before after more"
        assert got[-2:] == [{"type": "text-end", "id": f"{opened['reply_id']}-1"},
                            {"type": "abort", "reason": "stopped by user"}] or \
            got[-3:-1] == [{"type": "text-end", "id": f"{opened['reply_id']}-1"},
                           {"type": "abort", "reason": "stopped by user"}]
        assert got[-1] == "[DONE]"


async def test_credentials_another_users_chat_and_bad_input(root, nursery, tmp_path):
    server = await start_users(nursery, root, auth=AuthConfig(mode="tokens-file", tokens_file=tokens_file(tmp_path)))
    async with HttpClient(server.port, TOKENS["alice"]) as alice, HttpClient(server.port, TOKENS["bob"]) as bob, \
            HttpClient(server.port) as nobody:
        got = chunks((await alice.request("POST", "/v1/ai/chat", chat_body("alicechat", "hello"))).body)
        assert got[-1] == "[DONE]"
        hers = got[0]["messageMetadata"]["sessionId"]  # type: ignore[index]
        assert hers == chat_session("alice", "alicechat")
        a = await nobody.request("POST", "/v1/ai/chat", chat_body("x1", "hello"))
        assert a.status == 401
        # bob names alice's chat id: it is a new chat of his (nothing of hers is read, written or told)
        got = chunks((await bob.request("POST", "/v1/ai/chat", chat_body("alicechat", "let me in"))).body)
        assert got[-1] == "[DONE]" and got[0]["messageMetadata"]["sessionId"] != hers  # type: ignore[index]
        assert [m["role"] for m in (await bob.request("GET", "/v1/ai/chat/alicechat/messages")).json()] == \
            ["user", "assistant"]
        assert "let me in" not in (await alice.request("GET", "/v1/ai/chat/alicechat/messages")).body.decode()
        assert len((await alice.request("GET", f"/v1/sessions/{hers}")).json()["messages"]) == 2
        assert (await bob.request("GET", f"/v1/sessions/{hers}")).status == 404
        for body, code in [(chat_body("x" * 201, "x"), "bad_field"), (chat_body("", "x"), "bad_field"),
                           (chat_body("ok1", "   "), "bad_field"),
                           ({**chat_body("ok1", "x"), "trigger": "regenerate-message"}, "bad_request"),
                           ({"id": "ok1", "messages": []}, "bad_request"),
                           ({"messages": []}, "bad_request")]:
            a = await alice.request("POST", "/v1/ai/chat", body)
            assert a.status == 400 and a.json()["error"]["code"] == code, (body, a.body)
        a = await alice.request("GET", "/v1/ai/chat/..%2F..%2Fetc/messages")  # (a chat id, hashed: no path)
        assert a.status == 200 and a.json() == []
        assert [r["id"] for r in (await alice.request("GET", "/v1/sessions")).json()["rows"]] == [hers]


async def test_a_page_of_another_origin_given_by_allow_origin(root, nursery):
    server = await start(nursery, root, allowed_origins=("http://app.example",))
    async with HttpClient(server.port, TOKEN) as alice, HttpClient(server.port) as nobody:
        pre = await nobody.request("OPTIONS", "/v1/ai/chat", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status == 204 and pre.headers["access-control-allow-origin"] == "http://app.example"
        assert "Authorization" in pre.headers["access-control-allow-headers"]
        a = await alice.request("GET", "/v1/ai/chat/somechat/messages", headers={"Origin": "http://app.example"})
        assert a.status == 200 and a.headers["access-control-allow-origin"] == "http://app.example"
        a = await alice.request("GET", "/v1/ai/chat/somechat/messages", headers={"Origin": "http://evil.example"})
        assert a.status == 403 and "access-control-allow-origin" not in a.headers


async def read_sse_until(port: int, path: str, until: bytes) -> bytes:
    s = await trio.open_tcp_stream("127.0.0.1", port)
    await s.send_all(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
                     .encode())
    got = b""
    with trio.fail_after(30):
        while until not in got:
            got += await s.receive_some(65536)
    await s.aclose()
    return got


async def test_a_live_reader_that_comes_while_a_record_is_not_durable_yet_gets_it(root, nursery):
    """A record appended, then a live reader (its tap opens after the
    append), then the record's durability: the reader's catch-up must wait
    for it rather than skip it (it is in no tap). Both of the session's
    live streams: its event log (SSE) and the AI SDK's resume."""
    fs = GateFS()
    server = await start(nursery, root, fs=fs)
    async with HttpClient(server.port, TOKEN) as c:
        sid, opened = await external_reply(c, "gated")
        fs.gate.clear()  # what is appended now is not durable until the gate opens
        a = await c.request("POST", opened["stream"], raw=b"held back ", headers={"Content-Type": "text/plain"})
        assert a.status in (200, 204)
        got: dict[str, bytes] = {}

        async def read(name: str, path: str, until: bytes) -> None:
            got[name] = await read_sse_until(server.port, path, until)
        async with trio.open_nursery() as n:
            end = f'"message_finalized","msg_id":"{opened["reply_id"]}"'.encode()
            n.start_soon(read, "log", f"/v1/stream/sessions/{sid}?offset=-1&live=sse", end)
            n.start_soon(read, "ai", "/v1/ai/chat/gated/stream", b"[DONE]")
            await trio.testing.wait_all_tasks_blocked()
            fs.gate.set()
            a = await c.request("POST", opened["stream"], raw=b"and the end",
                                headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
            assert a.status in (200, 204), a.body
    assert b'"d":"held back "' in got["log"], got["log"][-2000:]
    events = [json.loads(line) for line in re.findall(rb"^data: (\{.*\})\r?$", got["ai"], re.M)]
    deltas = "".join(c["delta"] for c in events if c["type"] == "text-delta")
    assert "held back " in deltas and deltas.endswith("and the end"), got["ai"][-2000:]


class SseReader:
    """A raw live read: its bytes so far, and an event per marker seen."""

    def __init__(self, port: int, path: str) -> None:
        self.port, self.path, self.got = port, path, b""
        self.seen: dict[bytes, trio.Event] = {}

    def when(self, marker: bytes, after: int = 0) -> trio.Event:
        ev = self.seen[marker] = trio.Event()
        self._check(after)
        return ev

    def _check(self, after: int = 0) -> None:
        for marker, ev in self.seen.items():
            if marker in self.got[after:]:
                ev.set()

    async def run(self, end: bytes) -> None:
        s = await trio.open_tcp_stream("127.0.0.1", self.port)
        await s.send_all(f"GET {self.path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                         f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
        with trio.fail_after(30):
            while end not in self.got:
                self.got += await s.receive_some(65536)
                self._check()
        await s.aclose()


async def test_a_heartbeat_during_a_durability_wait_loses_nothing(root, nursery, monkeypatch):
    """A live reader waits for a record's durability when its heartbeat's
    timer fires (a slow disk, or a model silent for 15 s then writing): the
    records it was waiting for are sent after the keep-alive, not dropped."""
    from sessionlog_store.server.edge import aisdk, logstream
    monkeypatch.setattr(aisdk, "HEARTBEAT_SECONDS", 0.3)
    monkeypatch.setattr(logstream, "HEARTBEAT_SECONDS", 0.3)
    fs = GateFS()
    server = await start(nursery, root, fs=fs)
    async with HttpClient(server.port, TOKEN) as c:
        sid, opened = await external_reply(c, "beating")
        ai = SseReader(server.port, "/v1/ai/chat/beating/stream")
        log = SseReader(server.port, f"/v1/stream/sessions/{sid}?offset=-1&live=sse")
        async with trio.open_nursery() as n:
            n.start_soon(ai.run, b"[DONE]")
            n.start_soon(log.run, f'"message_finalized","msg_id":"{opened["reply_id"]}"'.encode())
            await ai.when(b"start-step").wait()
            await log.when(opened["reply_id"].encode()).wait()
            fs.gate.clear()
            mark_ai, mark_log = len(ai.got), len(log.got)
            a = await c.request("POST", opened["stream"], raw=b"held back ", headers={"Content-Type": "text/plain"})
            assert a.status in (200, 204)
            await ai.when(b"keep-alive", mark_ai).wait()   # the timer fired while the record waited
            await log.when(b"keep-alive", mark_log).wait()
            fs.gate.set()
            a = await c.request("POST", opened["stream"], raw=b"and the end",
                                headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
            assert a.status in (200, 204), a.body
    events = [json.loads(line) for line in re.findall(rb"^data: (\{.*\})\r?$", ai.got, re.M)]
    assert "".join(c["delta"] for c in events if c["type"] == "text-delta") == "held back and the end"
    assert b'"d":"held back "' in log.got


def test_the_fold_ends_an_error_a_failed_tool_and_a_deleted_session():
    fold = UiReplyFold("r")
    assert fold.feed(MessageCreated(msg_id="u", role="user", content="hi")) == []
    out = fold.feed(MessageCreated(msg_id="r", role="assistant", kind="llm_reply", status="running"))
    assert out == [{"type": "start", "messageId": "r"}, {"type": "start-step"}]
    assert fold.feed(MessageProgress(msg_id="r", content_delta="Hel", offset=0))[-1]["delta"] == "Hel"
    # a delta sent again (a resent record) adds only what is new
    assert [c["delta"] for c in fold.feed(MessageProgress(msg_id="r", content_delta="Hello", offset=0))] == ["lo"]
    out = fold.feed(MessageCreated(msg_id="t", role="tool", kind="tool_call", caller="r", status="running",
                                   metadata={"tool": "add", "tool_call_id": "call_1", "arguments": '{"a": 1}'}))
    assert out == [{"type": "text-end", "id": "r-1"},
                   {"type": "tool-input-available", "toolCallId": "call_1", "toolName": "add", "input": {"a": 1},
                    "dynamic": True}]
    assert fold.feed(MessageFinalized(msg_id="t", status="error", error="it broke")) == [
        {"type": "tool-output-error", "toolCallId": "call_1", "dynamic": True, "errorText": "it broke"}]
    out = fold.feed(MessageProgress(msg_id="r", content_delta=" again", offset=5))
    assert [c["type"] for c in out] == ["finish-step", "start-step", "text-start", "text-delta"]
    assert out[2]["id"] == "r-2"
    out = fold.feed(MessageFinalized(msg_id="r", status="error", error="model down", content="Hello again!"))
    assert out == [{"type": "text-delta", "id": "r-2", "delta": "!"}, {"type": "text-end", "id": "r-2"},
                   {"type": "error", "errorText": "model down"}]
    assert fold.ended and fold.feed(MessageProgress(msg_id="r", content_delta="late", offset=12)) == []
    other = UiReplyFold("r")
    other.feed(MessageCreated(msg_id="r", role="assistant", kind="llm_reply", status="running"))
    assert other.feed(SessionDeleted()) == [{"type": "abort", "reason": "session deleted"}]
    assert UiReplyFold("nope").feed(SessionDeleted()) == []
    msgs = [{"msg_id": "u", "role": "user", "kind": "chat", "caller": None, "status": "done", "content": "q"},
            {"msg_id": "r", "role": "assistant", "kind": "llm_reply", "caller": None, "status": "running",
             "content": "partial"}]
    assert ui_messages(msgs) == [{"id": "u", "role": "user", "parts": [{"type": "text", "text": "q"}]},
                                 {"id": "r", "role": "assistant", "parts": [{"type": "text", "text": "partial"}]}]


async def test_a_stop_of_the_server_ends_a_stream_with_its_reply_abort(tmp_path):
    """SIGTERM while a reply streams through the door: the stream's last
    chunks say how the reply ended (`abort`, "server shutdown"), then
    `[DONE]`, and they match what is stored once the server is back."""
    proc = ServeProcess(str(tmp_path / "data"), free_port(), speed=10.0, token=TOKEN, log=tmp_path / "serve.log")
    proc.start()
    try:
        reader = SseReader(proc.port, "/v1/ai/chat")
        body = json.dumps(chat_body("stopped", "tell me everything")).encode()

        async def post() -> None:  # (SseReader's GET, as a POST with the chat's body)
            s = await trio.open_tcp_stream("127.0.0.1", proc.port)
            await s.send_all(f"POST /v1/ai/chat HTTP/1.1\r\nHost: 127.0.0.1:{proc.port}\r\nAuthorization: Bearer "
                             f"{TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                             .encode() + body)
            with trio.fail_after(60):
                while b"[DONE]" not in reader.got:
                    data = await s.receive_some(65536)
                    if not data:
                        break
                    reader.got += data
                    reader._check()
            await s.aclose()
        async with trio.open_nursery() as n:
            n.start_soon(post)
            await reader.when(b"text-delta").wait()
            assert proc.proc is not None
            proc.proc.send_signal(signal.SIGTERM)
        events = [json.loads(line) for line in re.findall(rb"^data: (\{.*\})\r?$", reader.got, re.M)]
        assert events[-1] == {"type": "abort", "reason": "server shutdown"}, events[-3:]
        assert b"data: [DONE]" in reader.got
        proc.proc.wait(30)
        proc.start()
        sid = events[0]["messageMetadata"]["sessionId"]
        async with HttpClient(proc.port, TOKEN) as c:
            reply = [m for m in (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"]
                     if m["msg_id"] == events[0]["messageId"]][0]
        assert reply["status"] == "aborted"
        assert "".join(e["delta"] for e in events if e["type"] == "text-delta") == reply["content"]
    finally:
        proc.stop()
