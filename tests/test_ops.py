"""Operator endpoints (issue 15 item 3, first part): /healthz, /readyz and
/metrics over a real socket, for any Host (a probe addresses the pod), GET and
HEAD, readiness that turns 503 when the store fails, and metrics that say
what happened without a byte of anyone's session."""
from __future__ import annotations

import errno

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from eventstore import StoreBroken
from eventstore.fsio import FileOps
from server.agent import DemoAgent
from server.store import StoreConfig
from server.ws import Server, ServerConfig, serve_store

from .test_ws import TOKEN, raw_http, start_server


def get(path: str, method: str = "GET", host: str = "10.1.2.3:8765") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()


def metrics(body: bytes) -> dict[str, float]:
    text = body.split(b"\r\n\r\n", 1)[1].decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + "}" if s.labels else "")
            out[key] = s.value
    return out


async def test_probes_answer_any_host_with_get_and_head(root, nursery):
    server = await start_server(nursery, root)
    for path, want in (("/healthz", b"ok\n"), ("/readyz", b"ready\n")):
        r = await raw_http(server.port, get(path))
        assert r.startswith(b"HTTP/1.1 200") and r.endswith(want)
        h = await raw_http(server.port, get(path, "HEAD"))
        assert h.startswith(b"HTTP/1.1 200") and h.endswith(b"\r\n\r\n"), "HEAD: headers only"
    # the page still refuses a foreign Host
    assert (await raw_http(server.port, get("/"))).startswith(b"HTTP/1.1 403")


async def test_metrics_count_what_happened_and_name_no_session(root, nursery):
    server = await start_server(nursery, root, speed=400.0)
    async with server.client() as c:
        ack = await c.request("chat", content="a private question")
        await c.follow(ack["session_id"])
        assert await c.wait_done(ack["session_id"], ack["reply_id"]) == "done"
    r = await raw_http(server.port, get("/metrics"))
    assert r.startswith(b"HTTP/1.1 200") and b"text/plain; version=0.0.4" in r
    assert ack["session_id"].encode() not in r and b"private" not in r
    m = metrics(r)
    assert m["sessionlog_sessions{state=active}"] == 1 and m["sessionlog_sessions{state=quarantined}"] == 0
    assert m["sessionlog_store_ok"] == 1
    assert m["sessionlog_append_durable_seconds_count"] >= 2 and m["sessionlog_batch_records_count"] >= 2
    assert m["sessionlog_records_appended_total"] >= 4 and m["sessionlog_bytes_appended_total"] > 100
    assert m["sessionlog_inflight_messages"] == 0 and m["sessionlog_recovery_seconds"] >= 0


class BreakableFS(FileOps):
    broken = False

    def fdatasync(self, fd):  # type: ignore[no-untyped-def]
        if self.broken:
            raise OSError(errno.EIO, "injected EIO")
        super().fdatasync(fd)


async def test_readiness_turns_503_when_the_store_fails(root, nursery):
    fs = BreakableFS()
    ready = trio.Event()
    holder: dict[str, Server] = {}

    def on_ready(s: Server) -> None:
        holder["s"] = s
        ready.set()
    nursery.start_soon(lambda: serve_store(root, ServerConfig(port=0, token=TOKEN), agent=DemoAgent(speed=400),
                                           store_config=StoreConfig(), on_ready=on_ready, fs=fs))
    await ready.wait()
    server = holder["s"]
    assert (await raw_http(server.port, get("/readyz"))).startswith(b"HTTP/1.1 200")
    meta, _ = await server.store.create_session(first_message="x")
    fs.broken = True  # the journal's next sync fails
    with pytest.raises(StoreBroken):
        await server.store.append_message(meta.id, "doomed")
    r = await raw_http(server.port, get("/readyz"))
    assert r.startswith(b"HTTP/1.1 503") and b"store failed" in r
    assert (await raw_http(server.port, get("/healthz"))).startswith(b"HTTP/1.1 200"), "alive, not ready"
    assert metrics(await raw_http(server.port, get("/metrics")))["sessionlog_store_ok"] == 0
