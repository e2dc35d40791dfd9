"""Streams and external producers over HTTP (issue 27 items 2 and 3;
docs/HTTP.md): a backend outside the server streams a reply in, readers
follow it by SSE or long-poll and resume exactly from an offset, a Stop
reaches the producer, a silent producer loses its reply, and appends are
exactly once across retries. The first test is the curl-only session of
the issue, with the real curl against a real `serve` process."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from sessionlog_store.server.edge.auth import AuthConfig
from sessionlog_store.server.edge.client import open_client
from sessionlog_store.server.edge.streams import encode_offset, stream_tag

from .httpc import HttpClient
from .processes import ServeProcess, free_port
from .test_deploy import start
from .test_users import TOKENS, tokens_file
from .test_users import start as start_users
from .test_ws import TOKEN

CURL = shutil.which("curl")


def curl(*args: str, timeout: float = 30) -> str:
    assert CURL is not None
    return subprocess.run([CURL, "-s", "--fail-with-body", *args], capture_output=True, text=True,
                          timeout=timeout, check=True).stdout


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) of each event of an SSE body (data lines joined by LF)."""
    out = []
    for block in text.split("\n\n"):
        kind, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
        if data:
            out.append((kind, "\n".join(data)))
    return out


@pytest.mark.slow
@pytest.mark.skipif(CURL is None, reason="curl is not installed (.ci/run installs it)")
def test_a_curl_only_session_end_to_end(tmp_path: Path):
    server = ServeProcess(str(tmp_path / "root"), free_port(), token="curl-token", extra=("--producer-timeout", "2"))
    server.start()
    url, auth = f"http://127.0.0.1:{server.port}", ["-H", "Authorization: Bearer curl-token"]
    try:
        sid = json.loads(curl(*auth, "-X", "POST", "-d", "{}", f"{url}/v1/sessions"))["session"]["id"]
        curl(*auth, "-X", "POST", "-d", '{"content": "write me a poem"}', f"{url}/v1/sessions/{sid}/messages")
        opened = json.loads(curl(*auth, "-X", "POST", "-d", "{}", f"{url}/v1/sessions/{sid}/replies"))
        stream = url + opened["stream"]

        def append(text: str, seq: int, *extra: str) -> dict[str, str]:
            out = subprocess.run([CURL, "-s", "-i", *auth, "-H", "Content-Type: text/plain", "-H", "Producer-Id: poet",
                                  "-H", "Producer-Epoch: 0", "-H", f"Producer-Seq: {seq}", *extra,
                                  "--data-binary", text, stream], capture_output=True, text=True, check=True).stdout
            head = out.split("\n\n")[0].split("\n")  # (text mode: CRLF read as LF)
            return {"status": head[0].split()[1], **{k.lower(): v.strip() for k, _, v in
                                                      (ln.partition(":") for ln in head[1:])}}

        lines = [f"line {i}: the log holds what was said\n" for i in range(6)]
        assert append(lines[0], 0)["status"] == "200"
        # A reader follows by SSE (`curl -N`) and is cut after the first pieces.
        reader = subprocess.Popen([CURL, "-s", "-N", *auth, f"{stream}?offset=-1&live=sse"], stdout=subprocess.PIPE,
                                  text=True)
        assert reader.stdout is not None
        got = ""
        while "streamNextOffset" not in got:
            got += reader.stdout.readline()
        for i, line in enumerate(lines[1:3], 1):
            assert append(line, i)["status"] == "200"
        while encode_offset(len("".join(lines[:3])), stream_tag(sid, opened["reply_id"])) not in got:
            got += reader.stdout.readline()
        reader.kill()
        reader.wait()
        events = sse_events(got)
        seen = "".join(d for k, d in events if k == "data")
        last = [json.loads(d) for k, d in events if k == "control"][-1]["streamNextOffset"]
        assert seen == "".join(lines[:3]) and last == encode_offset(len(seen), stream_tag(sid, opened["reply_id"]))
        # The producer goes on, a retry of an append adds nothing, then it ends the reply.
        assert append(lines[3], 3)["status"] == "200"
        assert append(lines[3], 3)["status"] == "204", "a retried append is stored once"
        assert append(lines[4], 4)["status"] == "200"
        end = append(lines[5], 5, "-H", "Stream-Closed: true")
        assert end["status"] == "200" and end.get("stream-closed") == "true" and end["stream-status"] == "done", end
        # The cut reader resumes from its offset and gets exactly the rest, then the closure.
        rest = curl(*auth, f"{stream}?offset={last}")
        assert rest == "".join(lines[3:])
        head = subprocess.run([CURL, "-s", "-I", *auth, stream], capture_output=True, text=True).stdout.lower()
        assert "stream-closed: true" in head and "stream-status: done" in head
        assert json.loads(curl(*auth, f"{url}/v1/sessions/{sid}"))["messages"][-1]["content"] == "".join(lines)

        # A second reply, stopped by a WebSocket client: the producer's next append is refused.
        second = json.loads(curl(*auth, "-X", "POST", "-d", "{}", f"{url}/v1/sessions/{sid}/replies"))
        stream2 = url + second["stream"]
        curl(*auth, "-H", "Content-Type: text/plain", "--data-binary", "half a thought", stream2)

        async def stop_over_the_websocket() -> None:
            async with open_client("127.0.0.1", server.port, "curl-token") as ws:
                await ws.request("stop", session_id=sid, msg_id=second["reply_id"])
        trio.run(stop_over_the_websocket)
        refused = subprocess.run([CURL, "-s", *auth, "-H", "Content-Type: text/plain", "--data-binary", "more",
                                  "-w", "\n%{http_code}", stream2], capture_output=True, text=True).stdout
        body, code = refused.rsplit("\n", 1)
        assert code == "409" and json.loads(body)["error"]["code"] == "message_finished" and "stopped by user" in body

        # A third producer goes silent: its reply ends "producer lost", with what it had sent, once.
        third = json.loads(curl(*auth, "-X", "POST", "-d", "{}", f"{url}/v1/sessions/{sid}/replies"))
        curl(*auth, "-H", "Content-Type: text/plain", "--data-binary", "and then", url + third["stream"])
        deadline = time.monotonic() + 30
        while True:  # (the server's own timer: polled by reads, each an event of its own)
            msgs = json.loads(curl(*auth, f"{url}/v1/sessions/{sid}?msg_id={third['reply_id']}"))["messages"]
            m = next(x for x in msgs if x["msg_id"] == third["reply_id"])
            if m["status"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (m["status"], m["content"], m["metadata"].get("aborted_reason")) == ("aborted", "and then",
                                                                                     "producer lost")
    finally:
        server.stop()
    # Each reply was ended once, as the log holds it: done, stopped, lost.
    records = [json.loads(ln) for p in (tmp_path / "root").rglob("log.jsonl") for ln in p.read_text().splitlines()]
    ends = [(r["msg_id"], r.get("status", "done"), r.get("aborted_reason")) for r in records if r["type"] == "message_finalized"]
    assert ends == [(opened["reply_id"], "done", None), (second["reply_id"], "aborted", "stopped by user"),
                    (third["reply_id"], "aborted", "producer lost")]


async def test_sse_and_long_poll_readers_resume_exactly(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        opened = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        stream, tag = opened["stream"], stream_tag(sid, opened["reply_id"])
        for piece in ["zero ", "one ", "two "]:
            a = await c.request("POST", stream, raw=piece.encode(), headers={"Content-Type": "text/plain"})
            assert a.status == 204
        a = await c.request("GET", f"{stream}?offset={encode_offset(5, tag)}")
        assert a.body == b"one two " and a.headers["stream-next-offset"] == encode_offset(13, tag)
        assert "stream-closed" not in a.headers
        again = await c.request("GET", f"{stream}?offset={encode_offset(5, tag)}", headers={"If-None-Match": a.headers["etag"]})
        assert again.status == 304
        # A long-poll at the tail waits for the next append, and gets exactly it.
        async with HttpClient(server.port, TOKEN) as poller:
            async with trio.open_nursery() as n:
                got: list = []

                async def poll() -> None:
                    got.append(await poller.request("GET", f"{stream}?offset={encode_offset(13, tag)}&live=long-poll"))
                n.start_soon(poll)
                await trio.sleep(0)  # (the poll is sent; the append below may come before or after it waits)
                await c.request("POST", stream, raw="three".encode(), headers={"Content-Type": "text/plain"})
            assert got[0].status == 200 and got[0].body == b"three"
            assert got[0].headers["stream-next-offset"] == encode_offset(18, tag) and got[0].headers["stream-cursor"]
        end = await c.request("POST", stream, headers={"Content-Type": "text/plain", "Stream-Closed": "true"})
        assert end.headers["stream-closed"] == "true" and end.headers["stream-status"] == "done"
        # A closed stream's SSE read from the middle: the rest, then a control event that closes it.
        a = await c.request("GET", f"{stream}?offset={encode_offset(9, tag)}&live=sse")
        events = sse_events(a.body.decode())
        assert "".join(d for k, d in events if k == "data") == "two three"
        control = json.loads([d for k, d in events if k == "control"][-1])
        assert control["streamClosed"] is True and control["status"] == "done"
        assert control["streamNextOffset"] == encode_offset(18, tag)
        assert a.headers["x-accel-buffering"] == "no" and a.headers["content-type"].startswith("text/event-stream")
        for bad in ("12", "abc", encode_offset(99, tag), encode_offset(3, stream_tag(sid, "another"))):
            a = await c.request("GET", f"{stream}?offset={bad}")
            assert a.status == 400 and a.json()["error"]["code"] == "bad_offset", bad


async def test_producer_appends_are_exactly_once_and_fenced(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        stream = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()["stream"]

        async def append(text: str, epoch: int, seq: int, **extra: str):  # type: ignore[no-untyped-def]
            return await c.request("POST", stream, raw=text.encode(), headers={
                "Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": str(epoch),
                "Producer-Seq": str(seq), **extra})
        assert (await append("a", 0, 0)).status == 200
        assert (await append("a", 0, 0)).status == 204
        gap = await append("c", 0, 2)
        assert gap.status == 409 and gap.headers["producer-expected-seq"] == "1"
        assert (await append("b", 0, 1)).status == 200
        assert (await append("X", 1, 3)).status == 400, "a new epoch starts at 0"
        assert (await append("c", 1, 0)).status == 200  # a restarted producer claims the reply
        stale = await append("zombie", 0, 2)
        assert stale.status == 403 and stale.headers["producer-epoch"] == "1"
        only_some = await c.request("POST", stream, raw=b"x", headers={"Content-Type": "text/plain", "Producer-Id": "p"})
        assert only_some.status == 400
        wrong_type = await c.request("POST", stream, raw=b"{}", headers={"Content-Type": "application/json"})
        assert wrong_type.status == 409 and wrong_type.json()["error"]["code"] == "content_type_mismatch"
        empty = await c.request("POST", stream, raw=b"", headers={"Content-Type": "text/plain"})
        assert empty.status == 400
        end = await append("", 1, 1, **{"Stream-Closed": "true", "Stream-Status": "error",
                                       "Stream-Error": "the model went away"})
        assert end.headers["stream-status"] == "error"
        assert (await append("", 1, 1, **{"Stream-Closed": "true"})).status == 204, "a retried close is stored once"
        msg = (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"][-1]
        assert msg["content"] == "abc" and msg["status"] == "error" and "the model went away" in msg["error"]


async def test_a_producer_writes_only_its_users_sessions_and_only_external_replies(root, nursery, tmp_path):
    server = await start_users(nursery, root, auth=AuthConfig(mode="tokens-file", tokens_file=tokens_file(tmp_path)))
    async with HttpClient(server.port, TOKENS["alice"]) as alice, HttpClient(server.port, TOKENS["bob"]) as bob:
        sid = (await alice.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        opened = (await alice.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        assert (await bob.request("POST", f"/v1/sessions/{sid}/replies", {})).status == 404
        a = await bob.request("POST", opened["stream"], raw=b"not yours", headers={"Content-Type": "text/plain"})
        assert a.status == 404 and a.json()["error"]["code"] == "unknown_session"
        assert (await bob.request("GET", opened["stream"])).status == 404
        # A turn at a time: a second reply while this one runs is refused, as a chat is.
        busy = await alice.request("POST", f"/v1/sessions/{sid}/replies", {})
        assert busy.status == 409 and busy.json()["error"]["code"] == "reply_running"
        # A reply the server's own agent streams takes no external appends.
        ack = (await alice.request("POST", "/v1/chat", {"content": "hello"})).json()
        a = await alice.request("POST", f"/v1/stream/sessions/{ack['session_id']}/messages/{ack['reply_id']}",
                                raw=b"x", headers={"Content-Type": "text/plain"})
        assert a.status == 409 and a.json()["error"]["code"] in ("not_producer", "message_finished")
        assert (await alice.request("GET", opened["stream"])).body == b""


async def test_an_external_producer_records_tool_calls_tokens_and_its_tree(root, nursery):
    """What an in-process agent records, an external producer records too: a
    tool call as a `tool_call` message under its reply (its arguments and
    result as its text, its tool in its metadata), token totals and the
    agentic tree (PATCH, idempotent), seen live by a reader and in the log."""
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        reply = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        rid, stream = reply["reply_id"], reply["stream"]
        text = {"Content-Type": "text/plain"}
        assert (await c.request("POST", stream, raw=b"Let me look. ", headers=text)).status == 204
        call = await c.request("POST", f"/v1/sessions/{sid}/replies", {
            "kind": "tool_call", "caller": rid, "parent_id": rid,
            "metadata": {"tool": "search", "tool_call_id": "call_1"}})
        assert call.status == 201, call.body
        call_stream = call.json()["stream"]
        assert (await c.request("POST", call_stream, raw=b'{"q": "durable logs"}\n', headers=text)).status == 204
        assert (await c.request("POST", call_stream, raw=b"3 results", headers={
            **text, "Stream-Closed": "true"})).status == 204
        tree = {"name": "plan", "status": "running", "children": [{"name": "search", "status": "done"}]}
        for _ in range(2):  # a retry sets the same totals: idempotent
            got = await c.request("PATCH", f"/v1/sessions/{sid}/replies/{rid}",
                                  {"tokens": {"input": 120, "output": 34}, "tree": tree})
            assert got.status == 200 and got.json() == {"reply_id": rid, "tokens": {"input": 120, "output": 34}}
        live = (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"]
        running = next(m for m in live if m["msg_id"] == rid)
        assert running["status"] == "running"
        assert running["metadata"]["partial_tokens_used"] == {"input": 120, "output": 34}
        assert running["metadata"]["context_tree"] == tree
        bad = await c.request("PATCH", f"/v1/sessions/{sid}/replies/{rid}", {"tokens": {"input": -1}})
        assert bad.status == 400
        assert (await c.request("POST", stream, raw=b"Found it.", headers={**text, "Stream-Closed": "true"})).status \
            == 204
        late = await c.request("PATCH", f"/v1/sessions/{sid}/replies/{rid}", {"tokens": {"output": 99}})
        assert late.status == 409 and late.json()["error"]["code"] == "message_finished"
        log = (await c.request("GET", f"/v1/stream/sessions/{sid}")).json()
        created = {m["event"]["msg_id"]: m["event"] for m in log if m["event"]["type"] == "message_created"}
        tool = next(e for e in created.values() if e.get("kind") == "tool_call")
        assert (tool["role"], tool["caller"], tool["parent_id"], tool["metadata"]) == (
            "tool", rid, rid, {"tool": "search", "tool_call_id": "call_1"})
        state = (await c.request("GET", f"/v1/sessions/{sid}")).json()
        assert [m["content"] for m in state["messages"] if m["msg_id"] == rid] == ["Let me look. Found it."]
        loaded = await server.store.load_session(sid)
        assert loaded.messages[tool["msg_id"]].content == '{"q": "durable logs"}\n3 results'
        assert loaded.messages[rid].metadata["partial_tokens_used"] == {"input": 120, "output": 34}


async def test_a_producer_following_its_replys_stream_learns_of_a_stop_at_once(root, nursery):
    """The control channel: a producer reading its own reply's stream (SSE)
    sees the Stop as the stream's closure, `aborted`, "stopped by user",
    without having to append first; its next append is refused."""
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c, HttpClient(server.port, TOKEN) as reader:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        reply = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        assert (await c.request("POST", reply["stream"], raw=b"working", headers={
            "Content-Type": "text/plain"})).status == 204
        got: list = []

        async def follow() -> None:
            got.append(await reader.request("GET", f"{reply['stream']}?offset=-1&live=sse"))
        async with trio.open_nursery() as n:
            n.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            stop = await c.request("POST", f"/v1/sessions/{sid}/messages/{reply['reply_id']}/stop")
            assert stop.status == 200
        events = got[0].body.decode()
        last = json.loads(events.strip().split("\n")[-1].removeprefix("data: "))
        assert last["streamClosed"] is True and last["status"] == "aborted"
        assert last["abortedReason"] == "stopped by user"
        refused = await c.request("POST", reply["stream"], raw=b"more", headers={"Content-Type": "text/plain"})
        assert refused.status == 409 and refused.json()["error"]["code"] == "message_finished"


async def test_many_replies_appended_in_one_request(root, nursery, tmp_path):
    """POST /v1/appends: a backend streaming many replies sends their appends
    together; each is answered as its own append would be (producer rules,
    ownership, closure), and one item's refusal leaves the others standing."""
    server = await start_users(nursery, root, auth=AuthConfig(mode="tokens-file", tokens_file=tokens_file(tmp_path)))
    async with HttpClient(server.port, TOKENS["alice"]) as alice, HttpClient(server.port, TOKENS["bob"]) as bob:
        replies = []
        for _ in range(3):
            sid = (await alice.request("POST", "/v1/sessions", {})).json()["session"]["id"]
            replies.append((sid, (await alice.request("POST", f"/v1/sessions/{sid}/replies", {})).json()["reply_id"]))
        bob_sid = (await bob.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        bob_reply = (await bob.request("POST", f"/v1/sessions/{bob_sid}/replies", {})).json()["reply_id"]

        def item(sid: str, rid: str, text: str, seq: int, **extra: object) -> dict[str, object]:
            return {"session_id": sid, "reply_id": rid, "text": text,
                    "producer": {"id": "backend", "epoch": 0, "seq": seq}, **extra}
        first = await alice.request("POST", "/v1/appends", {"appends": [
            item(s, r, f"{i}a", 0) for i, (s, r) in enumerate(replies)] + [item(bob_sid, bob_reply, "x", 0)]})
        assert first.status == 200
        got = first.json()["results"]
        assert [r["status"] for r in got] == [200, 200, 200, 404]
        assert got[3]["error"]["code"] == "unknown_session", "another user's session is an unknown one"
        again = await alice.request("POST", "/v1/appends", {"appends": [
            item(*replies[0], "0a", 0),                      # a retry: a duplicate, nothing appended
            item(*replies[1], "1b", 2),                      # a gap
            item(*replies[2], "2b", 1, close="done"),        # the last append, and the end
            {"session_id": replies[0][0], "reply_id": replies[0][1]}]})  # empty
        r = again.json()["results"]
        assert [x["status"] for x in r] == [204, 409, 200, 400]
        assert r[1]["error"]["code"] == "producer_seq_gap" and r[2]["closed"] == "done"
        late = await alice.request("POST", "/v1/appends", {"appends": [item(*replies[2], "more", 2)]})
        assert late.json()["results"][0]["error"]["code"] == "message_finished"
        bad = await alice.request("POST", "/v1/appends", {"appends": [{"session_id": "x", "reply_id": "y",
                                                                        "txt": "unknown field"}]})
        assert bad.status == 400
        texts = {}
        for sid, rid in replies:
            msgs = (await alice.request("GET", f"/v1/sessions/{sid}")).json()["messages"]
            texts[rid] = next(m for m in msgs if m["msg_id"] == rid)["content"]
        assert list(texts.values()) == ["0a", "1a", "2a2b"]
        assert (await bob.request("GET", f"/v1/sessions/{bob_sid}")).json()["messages"][-1]["content"] == ""


async def test_malformed_sse_reconnects_get_a_clear_answer_and_change_nothing(root, nursery):
    """What a confused or hostile client sends when it reconnects to a
    stream: an empty or mangled offset is 400 bad_offset; an EventSource's
    Last-Event-ID is ignored (resume is by offset); a garbage cursor gets a
    fresh one; none of it touches the reply."""
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        reply = (await c.request("POST", f"/v1/sessions/{sid}/replies", {})).json()
        stream = reply["stream"]
        assert (await c.request("POST", stream, raw=b"abc", headers={"Content-Type": "text/plain"})).status == 204
        tag = stream_tag(sid, reply["reply_id"])
        for bad in ("", "%0A", encode_offset(1, tag) + "%0D%0Aevent:%20x", "-2", "now%00"):
            a = await c.request("GET", f"{stream}?offset={bad}&live=sse")
            assert a.status == 400 and a.json()["error"]["code"] == "bad_offset", bad
        assert (await c.request("POST", stream, raw=b"def", headers={"Content-Type": "text/plain",
                                                                     "Stream-Closed": "true"})).status == 204
        a = await c.request("GET", f"{stream}?offset={encode_offset(1, tag)}&live=sse&cursor=%3Cscript%3E",
                            headers={"Last-Event-ID": "999999"})
        assert a.status == 200
        body = a.body.decode()
        assert "data: bcdef" in body and '"streamClosed": true' in body
        cursors = [json.loads(line.removeprefix("data: "))["streamCursor"] for line in body.splitlines()
                   if line.startswith("data: {") and "streamCursor" in line]
        assert all(cur.isdigit() for cur in cursors)
        msg = (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"][-1]
        assert (msg["content"], msg["status"]) == ("abcdef", "done")
