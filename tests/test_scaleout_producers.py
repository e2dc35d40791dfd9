"""External producers (docs/HTTP.md) on a shared stream: two `sessionlog
serve --backend nats://…` workers on a real 3-node cluster. A producer
streams into a reply through one worker while a reader follows it through
the other; a Stop sent to the other worker refuses the producer's next
append; a producer that goes silent loses its reply ("producer lost")
exactly once; a producer whose worker is paused (SIGSTOP) past its lease
has its reply swept by the other worker, and after SIGCONT its appends are
refused, never written past the finalize (issue 27 item 3)."""
from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .nats_cluster import NatsCluster, _free_ports
from .test_scaleout import TOKEN, Worker

pytest.importorskip("nats", reason="nats-py is not installed (pip install 'sessionlog-store[nats]')")


def call(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
         timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=body, headers={"Authorization": f"Bearer {TOKEN}", **(headers or {})})
    r = c.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    c.close()
    return out


def jcall(port: int, method: str, path: str, doc: object = None) -> tuple[int, dict]:
    status, _, body = call(port, method, path, json.dumps(doc).encode() if doc is not None else b"",
                           {"Content-Type": "application/json"} if doc is not None else None)
    return status, json.loads(body) if body else {}


def text(port: int, stream: str, piece: str, **extra: str) -> tuple[int, dict[str, str], bytes]:
    return call(port, "POST", stream, piece.encode(), {"Content-Type": "text/plain", **extra})


def until(pred, within: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def workers(nats_cluster: NatsCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Worker]]:
    stream = "P" + request.node.name.replace("test_", "")[:30].replace("_", "")
    made = [Worker(nats_cluster, tmp_path / f"w{i}", port, stream, "--producer-timeout", "3")
            for i, port in enumerate(_free_ports(2))]
    try:
        for w in made:
            w.start()
        yield made
    finally:
        for w in made:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
            w.stop()


def message(port: int, sid: str, mid: str) -> dict:
    msgs = jcall(port, "GET", f"/v1/sessions/{sid}")[1]["messages"]
    return next(m for m in msgs if m["msg_id"] == mid)


def test_producers_on_a_shared_stream_stop_lose_and_fence(workers):
    one, two = workers
    status, made = jcall(one.port, "POST", "/v1/sessions", {})
    assert status == 201
    sid = made["session"]["id"]
    until(lambda: call(two.port, "GET", f"/v1/sessions/{sid}")[0] == 200)
    # a producer streams through one worker; a reader follows through the other
    status, reply = jcall(one.port, "POST", f"/v1/sessions/{sid}/replies", {})
    assert status == 201, reply
    stream, rid = reply["stream"], reply["reply_id"]
    assert text(one.port, stream, "hello ")[0] == 204
    until(lambda: call(two.port, "GET", stream)[2] == b"hello ")
    tail = call(two.port, "GET", stream)[1]["stream-next-offset"]
    polled: list = []
    poll = threading.Thread(target=lambda: polled.append(call(two.port, "GET", f"{stream}?offset={tail}"
                                                                           "&live=long-poll")))
    poll.start()
    until(lambda: "sessionlog_stream_reads 1.0" in call(two.port, "GET", "/metrics")[2].decode())
    assert text(one.port, stream, "world")[0] == 204
    poll.join(30)
    assert polled[0][0] == 200 and polled[0][2] == b"world", "the long-poll on the other worker got it"
    until(lambda: call(two.port, "GET", stream)[2] == b"hello world")
    # a Stop sent to the other worker: the producer's next append is refused
    status, _ = jcall(two.port, "POST", f"/v1/sessions/{sid}/messages/{rid}/stop")
    assert status == 200
    until(lambda: message(one.port, sid, rid)["status"] == "aborted")
    status, _, body = text(one.port, stream, " more")
    assert status == 409 and json.loads(body)["error"]["code"] == "message_finished"
    until(lambda: message(two.port, sid, rid)["status"] == "aborted")  # (two folds one's finalize from its tail)
    m = message(two.port, sid, rid)
    assert (m["content"], m["metadata"]["aborted_reason"]) == ("hello world", "stopped by user")
    # a producer that goes silent past --producer-timeout loses its reply, once
    # (opened once the stopped reply's turn is given back: its lease goes a moment after its finalize)
    opened: list = []
    until(lambda: opened.append(jcall(one.port, "POST", f"/v1/sessions/{sid}/replies", {})) or
          opened[-1][0] != 409 or opened[-1][1]["error"]["code"] != "reply_running")
    status, quiet = opened[-1]
    assert status == 201, quiet
    assert text(one.port, quiet["stream"], "partial")[0] == 204
    until(lambda: message(two.port, sid, quiet["reply_id"])["status"] == "aborted", within=40)
    m = message(two.port, sid, quiet["reply_id"])
    assert (m["content"], m["metadata"]["aborted_reason"]) == ("partial", "producer lost")
    # a producer whose worker is paused past its lease: the other worker sweeps the reply;
    # after SIGCONT the paused worker writes nothing past that finalize
    status, held = jcall(one.port, "POST", f"/v1/sessions/{sid}/replies", {})
    assert status == 201, held
    assert text(one.port, held["stream"], "before the pause")[0] == 204
    until(lambda: call(two.port, "GET", held["stream"])[2] == b"before the pause")
    assert one.proc is not None
    one.proc.send_signal(signal.SIGSTOP)
    try:
        until(lambda: message(two.port, sid, held["reply_id"])["status"] == "aborted", within=60)
    finally:
        one.proc.send_signal(signal.SIGCONT)
    swept = message(two.port, sid, held["reply_id"])
    assert swept["content"] == "before the pause"
    status, _, body = text(one.port, held["stream"], " after the pause")
    assert status == 409, body
    time.sleep(0)  # (the paused worker's own view catches up from the stream)
    until(lambda: message(one.port, sid, held["reply_id"])["status"] == "aborted")
    for port in (one.port, two.port):
        m = message(port, sid, held["reply_id"])
        assert m["content"] == "before the pause", "nothing written past the finalize"
