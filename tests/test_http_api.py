"""The HTTP API under /v1/ (issue 27 item 1; docs/HTTP.md) over real sockets:
the document validates and is what the server does, a session's life over
HTTP is the WebSocket's (the same store calls), another user's session is
answered as an unknown one, bad input gets its status and code and changes
nothing, and a property-based run of schemathesis against a live `serve`
finds no 5xx and no answer off the document."""
from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from sessionlog_store.server.edge import http as edge_http
from sessionlog_store.server.edge.api import ROUTES
from sessionlog_store.server.edge.auth import AuthConfig

from .httpc import HttpClient
from .processes import ServeProcess, free_port
from .test_deploy import start
from .test_users import FAKE, TOKENS, tokens_file
from .test_users import start as start_users
from .test_ws import TOKEN
from sessionlog_store.server.edge.client import open_client

openapi_spec_validator = pytest.importorskip("openapi_spec_validator")


async def test_the_document_validates_and_names_every_route(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port) as c:  # (no credential: the document is public)
        a = await c.request("GET", "/v1/openapi.json")
    assert a.status == 200 and a.headers["content-type"] == "application/json"
    doc = a.json()
    openapi_spec_validator.validate(doc)
    assert doc["openapi"] == "3.1.0"
    for r in ROUTES:
        op = doc["paths"][r.path][r.method.lower()]
        assert op["operationId"] == r.name and str(r.status) in op["responses"]
    # the bodies are the msgspec types the handlers decode: unknown fields refused there too
    assert doc["components"]["schemas"]["NewSession"]["additionalProperties"] is False


async def test_a_sessions_life_over_http_is_the_websockets(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        a = await c.request("POST", "/v1/sessions", {"title": "over http", "source": "curl"})
        assert a.status == 201, a.body
        sid = a.json()["session"]["id"]
        a = await c.request("POST", f"/v1/sessions/{sid}/messages", {"content": "hello from a backend"})
        assert a.status == 201, a.body
        first = a.json()["msg_id"]
        a = await c.request("POST", f"/v1/sessions/{sid}/messages",
                            {"content": "a finished answer", "role": "assistant", "kind": "llm_reply"})
        answer = a.json()["msg_id"]
        a = await c.request("GET", f"/v1/sessions/{sid}")
        assert a.status == 200
        loaded = a.json()
        assert [m["msg_id"] for m in loaded["messages"]] == [first, answer]
        assert loaded["messages"][1]["content"] == "a finished answer" and loaded["head"] == answer
        a = await c.request("PATCH", f"/v1/sessions/{sid}", {"title": "renamed", "pinned": True})
        assert a.status == 200 and a.json()["changed"] == {"title": "renamed", "pinned": True}, a.body
        a = await c.request("GET", "/v1/sessions?pinned=true&source=curl")
        rows = a.json()["rows"]
        assert a.json()["type"] == "sessions_list" and [r["id"] for r in rows] == [sid]
        assert rows[0]["title"] == "renamed" and rows[0]["message_count"] == 2
        assert (await c.request("GET", "/v1/sessions?pinned=false")).json()["rows"] == []
        rev = a.json()["rev"]
        # What the WebSocket sees is the same store: its load gives the same messages.
        async with open_client("127.0.0.1", server.port, TOKEN) as ws:
            got = await ws.request("load_session", session_id=sid)
            assert [m["msg_id"] for m in got["messages"]] == [first, answer]
            assert got["session"]["title"] == "renamed"
        a = await c.request("PATCH", f"/v1/sessions/{sid}", {"archived": True})
        assert a.json()["changed"]["archived"] is True
        changes = (await c.request("GET", f"/v1/sessions?since={rev}")).json()
        assert changes["type"] == "sessions_changes" and changes["changes"][-1]["data"]["archived"] is True
        a = await c.request("DELETE", f"/v1/sessions/{sid}")
        assert a.status == 204 and a.body == b""
        a = await c.request("GET", f"/v1/sessions/{sid}")
        assert a.status == 404 and a.json()["error"]["code"] == "unknown_session"
        assert c.connections == 1, "every request went over one kept-alive connection"


async def test_a_chat_over_http_runs_the_servers_agent_and_can_be_stopped(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        a = await c.request("POST", "/v1/chat", {"content": "tell me something long"})
        assert a.status == 201, a.body
        ack = a.json()
        sid, reply = ack["session_id"], ack["reply_id"]
        running = (await c.request("GET", "/v1/running")).json()["running"]
        assert [r["msg_id"] for r in running] == [reply]
        a = await c.request("POST", f"/v1/sessions/{sid}/messages/{reply}/stop")
        assert a.status == 200 and a.json() == {"msg_id": reply}
        with trio.fail_after(10):
            while True:
                msgs = (await c.request("GET", f"/v1/sessions/{sid}")).json()["messages"]
                if msgs[-1]["status"] != "running":
                    break
                await trio.sleep(0.02)
        assert msgs[-1]["status"] == "aborted" and msgs[-1]["metadata"]["aborted_reason"] == "stopped by user"
        a = await c.request("POST", f"/v1/sessions/{sid}/messages/{reply}/stop")
        assert a.status == 409 and a.json()["error"]["code"] == "not_running"


async def test_another_users_session_is_answered_as_an_unknown_one(root, nursery, tmp_path):
    server = await start_users(nursery, root, auth=AuthConfig(mode="tokens-file", tokens_file=tokens_file(tmp_path)))
    async with HttpClient(server.port, TOKENS["alice"]) as alice, HttpClient(server.port, TOKENS["bob"]) as bob:
        sid = (await alice.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        mine = (await alice.request("POST", f"/v1/sessions/{sid}/messages", {"content": "mine"})).json()["msg_id"]
        for method, path, body in [("GET", "/v1/sessions/{}", None), ("PATCH", "/v1/sessions/{}", {"pinned": True}),
                                   ("DELETE", "/v1/sessions/{}", None),
                                   ("POST", "/v1/sessions/{}/messages", {"content": "x"}),
                                   ("POST", "/v1/sessions/{}/branch", {"msg_id": mine}),
                                   ("POST", "/v1/sessions/{}/messages/" + mine + "/retry", None)]:
            theirs = await bob.request(method, path.format(sid), body)
            unknown = await bob.request(method, path.format(FAKE), body)
            assert theirs.status == unknown.status == 404, (method, path, theirs.body)
            assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"] == "unknown_session"
            assert theirs.json()["error"]["message"].replace(sid, FAKE) == unknown.json()["error"]["message"]
        assert (await bob.request("GET", "/v1/sessions")).json()["rows"] == []
        rows = (await alice.request("GET", "/v1/sessions")).json()["rows"]
        assert [r["id"] for r in rows] == [sid] and rows[0]["pinned"] is False and rows[0]["message_count"] == 1
        nobody = HttpClient(server.port, "not-a-token")
        a = await nobody.request("GET", "/v1/sessions")
        assert a.status == 401 and a.headers["www-authenticate"].startswith("Bearer")
        await nobody.close()


async def test_bad_input_gets_its_status_and_code_and_changes_nothing(root, nursery, monkeypatch):
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        sid = (await c.request("POST", "/v1/sessions", {})).json()["session"]["id"]
        cases = [
            ("POST", "/v1/sessions", {"title": "x", "colour": "red"}, 400, "bad_request"),     # unknown field
            ("POST", "/v1/sessions", {"title": 7}, 400, "bad_request"),                         # wrong type
            ("POST", f"/v1/sessions/{sid}/messages", {"content": "   "}, 400, "bad_request"),   # blank
            ("POST", f"/v1/sessions/{sid}/messages", {"content": "x", "role": "root"}, 400, "bad_request"),
            ("GET", "/v1/sessions?limit=-1", None, 400, "bad_request"),
            ("GET", "/v1/sessions?colour=red", None, 400, "bad_request"),
            ("GET", "/v1/sessions/..%2F..%2Fetc", None, 400, "invalid_session_id"),
            ("PUT", f"/v1/sessions/{sid}", {}, 405, "method_not_allowed"),
            ("GET", "/v1/nothing-here", None, 404, "not_found"),
            ("POST", f"/v1/sessions/{sid}/branch", {"msg_id": FAKE}, 404, "unknown_message"),
        ]
        for method, path, body, status, code in cases:
            a = await c.request(method, path, body)
            assert (a.status, a.json()["error"]["code"]) == (status, code), (method, path, a.body)
        a = await c.request("PUT", f"/v1/sessions/{sid}", {})
        assert a.headers["allow"] == "DELETE, GET, HEAD, PATCH"
        a = await c.request("POST", "/v1/sessions", raw=b"{not json")
        assert (a.status, a.json()["error"]["code"]) == (400, "bad_request")
        # Over the body limit: refused from its Content-Length, before it is read, and the connection closes.
        big = b'{"title": "' + b"x" * (edge_http.MAX_BODY + 1) + b'"}'
        a = await c.request("POST", "/v1/sessions", raw=big)
        assert a.status == 413 and a.headers.get("connection") == "close"
        assert a.json()["error"]["code"] == "body_too_large"
        loaded = (await c.request("GET", f"/v1/sessions/{sid}")).json()
        assert loaded["messages"] == [] and loaded["session"]["title"] == ""
        assert (await c.request("GET", "/v1/sessions")).json()["total"] == 1, "nothing bad was created"
    # A body that trickles: 408 once BODY_TIMEOUT passes (shortened here), and the server serves on.
    monkeypatch.setattr(edge_http, "BODY_TIMEOUT", 0.5)
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    await stream.send_all(f"POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer "
                          f"{TOKEN}\r\nContent-Length: 100\r\n\r\n{{\"ti".encode())
    got = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in got:
            got += await stream.receive_some(4096)
    assert got.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in got
    await stream.aclose()


async def test_the_page_is_sent_with_validators_and_compressed(root, nursery):
    server = await start(nursery, root)
    async with HttpClient(server.port) as c:
        a = await c.request("GET", "/static/app.js", headers={"Accept-Encoding": "gzip"})
        assert a.status == 200 and a.headers["content-encoding"] == "gzip"
        plain = (Path(edge_http.__file__).parent / "static" / "app.js").read_bytes()
        assert gzip.decompress(a.body) == plain and len(a.body) < len(plain) / 2
        tag = a.headers["etag"]
        assert a.headers["cache-control"] == "no-cache" and a.headers["vary"] == "Accept-Encoding"
        again = await c.request("GET", "/static/app.js", headers={"Accept-Encoding": "gzip", "If-None-Match": tag})
        assert again.status == 304 and again.body == b"" and again.headers["etag"] == tag
        other = await c.request("GET", "/static/app.js")  # no gzip asked: the plain form, its own tag
        assert other.body == plain and other.headers["etag"] != tag and "content-encoding" not in other.headers
        assert c.connections == 1


@pytest.mark.slow
def test_schemathesis_finds_no_5xx_and_no_answer_off_the_document(tmp_path):
    """A property-based run against a live `serve` in its own process,
    bounded in examples. Left out, with their reason: `positive_data_acceptance`
    (a schema-valid project path is still refused unless it is an existing
    folder under a project root; a schema-valid id names no session) and
    `ensure_resource_availability` (its links guess a message id from a
    session's: a 404 there is right)."""
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable))
    if st is None:
        pytest.skip("schemathesis is not installed (the test extra has it)")
    server = ServeProcess(str(tmp_path / "root"), free_port(), token="st-token")
    server.start()
    try:
        r = subprocess.run([st, "run", f"http://127.0.0.1:{server.port}/v1/openapi.json",
                            "-H", "Authorization: Bearer st-token", "--max-examples", "25", "--seed", "1",
                            "--exclude-checks", "positive_data_acceptance,ensure_resource_availability",
                            "--no-color"], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    finally:
        server.stop()
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "passed" in r.stdout


async def test_an_unknown_major_version_is_refused_with_a_clear_error(root, nursery):
    """Issue 28 item 6: the HTTP API's version is its path (/v1/), the
    WebSocket's its subprotocol (sessionlog.v1). A request under another
    major version gets 404 unsupported_version; a handshake offering only
    other sessionlog.v* subprotocols gets 400 saying which this server
    speaks; one offering v1 among others gets v1; one offering none is v1
    (scripts' clients)."""
    from trio_websocket import HandshakeError, open_websocket

    from sessionlog_store.server.edge.auth import TOKEN_SUBPROTOCOL
    from .test_ws import raw_http
    server = await start(nursery, root)
    async with HttpClient(server.port, TOKEN) as c:
        for path in ("/v2/sessions", "/v2", "/v10/openapi.json"):
            a = await c.request("GET", path)
            assert (a.status, a.json()["error"]["code"]) == (404, "unsupported_version"), (path, a.body)
            assert "API version 1 (/v1/)" in a.json()["error"]["message"]
        assert (await c.request("GET", "/v1/sessions")).status == 200
    token = TOKEN_SUBPROTOCOL + __import__("base64").urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    up = (f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
          f"Sec-WebSocket-Protocol: sessionlog.v2, {token}\r\n\r\n")
    answer = await raw_http(server.port, up.encode())
    assert answer.startswith(b"HTTP/1.1 400") and b"unsupported protocol version sessionlog.v2" in answer
    assert b"this server speaks sessionlog.v1" in answer, answer
    for offered, selected in ((["sessionlog.v2", "sessionlog.v1", token], "sessionlog.v1"), ([token], None)):
        async with open_websocket("127.0.0.1", server.port, "/ws", use_ssl=False, subprotocols=offered) as ws:
            assert ws.subprotocol == selected
    with pytest.raises(HandshakeError):
        async with open_websocket("127.0.0.1", server.port, "/ws", use_ssl=False,
                                  subprotocols=["sessionlog.v3", token]):
            pass
