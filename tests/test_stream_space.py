"""The generic namespace's streams (/v1/stream/<name>) as a user relies on
them beyond the protocol's conformance suite: what was acknowledged
survives a SIGKILL (data, closure, producer state, forks, soft deletes);
an expired stream's log is removed; whose a stream is; and the anonymous
mode's limits (issue 27 item 2)."""
from __future__ import annotations

import http.client
import json
import os
import re
import time
from pathlib import Path

from .processes import ServeProcess, free_port

TOKEN = "stream-space-token"


def call(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         token: str | None = TOKEN) -> tuple[int, dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = {**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    c.close()
    return out


def serve(tmp_path: Path, *extra: str, port: int | None = None) -> ServeProcess:
    s = ServeProcess(str(tmp_path / "data"), port or free_port(), token=TOKEN, extra=("--log-level", "WARNING", *extra),
                     log=tmp_path / f"serve-{len(list(tmp_path.glob('serve-*')))}.log")
    s.start()
    return s


def stream_logs(tmp_path: Path) -> list[str]:
    base = tmp_path / "data" / "streams" / "sessions"
    return sorted(p.name for p in base.iterdir() if (p / "log.jsonl").exists()) if base.exists() else []


def test_what_was_acknowledged_survives_a_sigkill(tmp_path):
    s = serve(tmp_path)
    p = s.port
    text = {"Content-Type": "text/plain"}
    assert call(p, "PUT", "/v1/stream/notes", b"one ", text)[0] == 201
    prod = {**text, "Producer-Id": "w1", "Producer-Epoch": "0"}
    assert call(p, "POST", "/v1/stream/notes", b"two ", {**prod, "Producer-Seq": "0"})[0] == 200
    status, h, _ = call(p, "POST", "/v1/stream/notes", b"three", {**prod, "Producer-Seq": "1"})
    assert status == 200
    fork_at = h["stream-next-offset"]
    assert call(p, "PUT", "/v1/stream/json", b'[{"a":1},{"b":2}]', {"Content-Type": "application/json"})[0] == 201
    assert call(p, "POST", "/v1/stream/json", b"", {"Stream-Closed": "true"})[0] == 204
    assert call(p, "PUT", "/v1/stream/fork", b"", {"Stream-Forked-From": "/v1/stream/notes",
                                                     "Stream-Fork-Offset": fork_at})[0] == 201
    assert call(p, "POST", "/v1/stream/fork", b"+fork", text)[0] == 204
    assert call(p, "PUT", "/v1/stream/gone", b"x", text)[0] == 201
    assert call(p, "DELETE", "/v1/stream/gone")[0] == 204
    s.kill()  # SIGKILL: no shutdown ran
    s = serve(tmp_path, port=p)
    try:
        assert call(p, "GET", "/v1/stream/notes")[2] == b"one two three"
        # the producer's state came back with the data: a retry is a duplicate, the next one is taken
        status, h, _ = call(p, "POST", "/v1/stream/notes", b"three", {**prod, "Producer-Seq": "1"})
        assert (status, h["producer-seq"]) == (204, "1")
        assert call(p, "POST", "/v1/stream/notes", b"!", {**prod, "Producer-Seq": "3"})[0] == 409
        status, h, body = call(p, "GET", "/v1/stream/json")
        assert (json.loads(body), h.get("stream-closed")) == ([{"a": 1}, {"b": 2}], "true")
        assert call(p, "POST", "/v1/stream/json", b"{}", {"Content-Type": "application/json"})[0] == 409
        assert call(p, "GET", "/v1/stream/fork")[2] == b"one two three+fork"
        assert call(p, "GET", "/v1/stream/gone")[0] == 404
        # deleting the source while its fork reads from it: gone to clients, kept for the fork, across a restart
        assert call(p, "DELETE", "/v1/stream/notes")[0] == 204
        assert call(p, "GET", "/v1/stream/notes")[0] == 410
        assert call(p, "PUT", "/v1/stream/notes", b"", text)[0] == 409
    finally:
        s.kill()
    s = serve(tmp_path, port=p)
    try:
        assert call(p, "GET", "/v1/stream/notes")[0] == 410
        assert call(p, "GET", "/v1/stream/fork")[2] == b"one two three+fork"
        before = stream_logs(tmp_path)
        assert call(p, "DELETE", "/v1/stream/fork")[0] == 204  # the last fork: the source goes with it
        assert call(p, "GET", "/v1/stream/notes")[0] == 404
        assert len(stream_logs(tmp_path)) == len(before) - 2
        assert call(p, "PUT", "/v1/stream/notes", b"new", text)[0] == 201
    finally:
        s.stop()


def test_an_expired_stream_is_gone_and_its_log_removed(tmp_path):
    s = serve(tmp_path)
    try:
        p = s.port
        assert call(p, "PUT", "/v1/stream/brief", b"x", {"Content-Type": "text/plain",
                                                          "Stream-Expires-At": "2000-01-01T00:00:00Z"})[0] == 201
        assert call(p, "PUT", "/v1/stream/kept", b"y", {"Content-Type": "text/plain"})[0] == 201
        assert len(stream_logs(tmp_path)) == 2
        assert call(p, "GET", "/v1/stream/brief")[0] == 404
        assert call(p, "DELETE", "/v1/stream/kept")[0] == 204  # (a removal also removes what expired)
        assert stream_logs(tmp_path) == []
    finally:
        s.stop()


def test_a_stream_is_its_owners_and_anonymous_streams_are_apart(tmp_path):
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"alice-token-0123456789": "alice", "bob-token-0123456789": "bob"}))
    os.chmod(tokens, 0o600)
    s = serve(tmp_path, "--auth", "tokens-file", "--tokens-file", str(tokens), "--streams-anonymous")
    try:
        p = s.port
        text = {"Content-Type": "text/plain"}
        assert call(p, "PUT", "/v1/stream/plan", b"alice's", text, token="alice-token-0123456789")[0] == 201
        assert call(p, "GET", "/v1/stream/plan", token="bob-token-0123456789")[0] == 404
        assert call(p, "POST", "/v1/stream/plan", b"bob's", text, token="bob-token-0123456789")[0] == 404
        assert call(p, "PUT", "/v1/stream/plan", b"bob's", text, token="bob-token-0123456789")[0] == 201
        assert call(p, "GET", "/v1/stream/plan", token="alice-token-0123456789")[2] == b"alice's"
        # no credentials, from this machine: the anonymous owner's streams, no one else's
        assert call(p, "GET", "/v1/stream/plan", token=None)[0] == 404
        assert call(p, "PUT", "/v1/stream/plan", b"anon", text, token=None)[0] == 201
        assert call(p, "GET", "/v1/stream/plan", token=None)[2] == b"anon"
        assert call(p, "GET", "/v1/stream/plan", token="bob-token-0123456789")[2] == b"bob's"
        # a wrong credential is refused, not taken for none; a proxied request is never anonymous
        assert call(p, "GET", "/v1/stream/plan", token="wrong")[0] == 401
        assert call(p, "GET", "/v1/stream/plan", headers={"X-Forwarded-For": "203.0.113.9"}, token=None)[0] == 401
        # and the anonymous mode never reaches a session
        assert call(p, "GET", "/v1/sessions", token=None)[0] == 401
        assert call(p, "GET", "/v1/stream/sessions/x/messages/y", token=None)[0] == 401
    finally:
        s.stop()


def test_without_the_anonymous_mode_a_request_needs_credentials(tmp_path):
    s = serve(tmp_path)
    try:
        status, _, body = call(s.port, "PUT", "/v1/stream/x", b"", {"Content-Type": "text/plain"}, token=None)
        assert status == 401 and json.loads(body)["error"]["code"] == "unauthorized"
    finally:
        s.stop()


def test_a_stop_ends_every_live_read_cleanly_and_readers_resume(tmp_path):
    """SIGTERM while SSE readers follow a generic stream, a reply and a
    session's log, and a long-poll waits: every answer is complete (an SSE
    answer ends, a reply's with its `aborted` closure), the long-poll is
    answered, and after the restart each reader resumes from its offset."""
    import subprocess
    s = serve(tmp_path)
    p = s.port
    auth = f"Authorization: Bearer {TOKEN}"
    assert call(p, "PUT", "/v1/stream/g", b"x", {"Content-Type": "text/plain"})[0] == 201
    sid = json.loads(call(p, "POST", "/v1/sessions", b"{}", {"Content-Type": "application/json"})[2])["session"]["id"]
    reply = json.loads(call(p, "POST", f"/v1/sessions/{sid}/replies", b"{}",
                            {"Content-Type": "application/json"})[2])
    assert call(p, "POST", reply["stream"], b"hel", {"Content-Type": "text/plain"})[0] == 204
    base = f"http://127.0.0.1:{p}"
    reads = {"generic": f"{base}/v1/stream/g?offset=-1&live=sse",
             "reply": f"{base}{reply['stream']}?offset=-1&live=sse",
             "log": f"{base}/v1/stream/sessions/{sid}?offset=-1&live=sse"}
    outs = {k: tmp_path / f"{k}.sse" for k in reads}
    curls = {k: subprocess.Popen(["curl", "-s", "-N", "-H", auth, url, "-o", str(outs[k])]) for k, url in reads.items()}
    for k in reads:  # each is following (its first control event came)
        deadline = time.monotonic() + 30
        while "streamNextOffset" not in (outs[k].read_text() if outs[k].exists() else ""):
            assert time.monotonic() < deadline, k
            time.sleep(0.05)
    poll = subprocess.Popen(["curl", "-s", "-i", "-H", auth, f"{base}/v1/stream/g?offset=0000000000000000_"
                             "0000000000000002&live=long-poll"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while "sessionlog_stream_reads 4.0" not in call(p, "GET", "/metrics", token=None)[2].decode():
        assert time.monotonic() < deadline, "the long-poll is waiting"
        time.sleep(0.05)
    s.stop()  # SIGTERM, and its exit
    assert s.proc is not None and s.proc.returncode == 0
    for k, c in curls.items():
        assert c.wait(30) == 0, f"the {k} answer ended complete"
    answer = poll.communicate(timeout=30)[0]
    assert poll.returncode == 0 and answer.split()[1] == "204", answer
    reply_events = outs["reply"].read_text()
    assert '"status": "aborted"' in reply_events and "server shutdown" in reply_events
    last_offset = {k: re.findall(r'"streamNextOffset": ?"([^"]+)"', outs[k].read_text())[-1] for k in reads}
    s = serve(tmp_path, port=p)
    try:
        assert call(p, "POST", "/v1/stream/g", b"y", {"Content-Type": "text/plain"})[0] == 204
        assert call(p, "GET", f"/v1/stream/g?offset={last_offset['generic']}")[2] == b"y"
        rest = call(p, "GET", f"{reply['stream']}?offset={last_offset['reply']}")
        assert rest[2] == b"" and rest[1].get("stream-closed") == "true"
        log_rest = json.loads(call(p, "GET", f"/v1/stream/sessions/{sid}?offset={last_offset['log']}")[2])
        assert all(m["seq"] > int(last_offset["log"][:16]) for m in log_rest)
    finally:
        s.stop()
