"""Operator endpoints (issue 15 item 3, first part): /healthz, /readyz and
/metrics over a real socket, for any Host (a probe addresses the pod), GET and
HEAD, readiness that turns 503 when the store fails, and metrics that say
what happened without a byte of anyone's session."""
from __future__ import annotations

import errno

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from sessionlog_store.eventstore import StoreBroken
from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.server.agents.demo import DemoAgent
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.edge.ws import Server, ServerConfig
from sessionlog_store.server.run import serve_store

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


def documented_metrics(*docs: str) -> set[str]:
    """Every metric name (sessionlog_*, process_*) the given docs name."""
    import re

    from .conftest import ROOT
    names: set[str] = set()
    for doc in docs:
        text = (ROOT / doc).read_text()
        names |= set(re.findall(r"\b((?:sessionlog|process)_[a-z_]+[a-z])\b", text)) - {"sessionlog_store"}
    return names


def sample_names(m: dict[str, float]) -> set[str]:
    """The samples' names, and a histogram's by its family name too."""
    names = {k.split("{", 1)[0] for k in m}
    return names | {n.removesuffix("_bucket") for n in names if n.endswith("_bucket")}


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
    assert (await raw_http(server.port, get("/metrics"))).startswith(b"HTTP/1.1 403"), \
        "activity counts are not for any page (DNS rebinding): only allowed hosts"
    r = await raw_http(server.port, get("/metrics", host=f"127.0.0.1:{server.port}"))
    assert r.startswith(b"HTTP/1.1 200") and b"text/plain; version=0.0.4" in r
    assert ack["session_id"].encode() not in r and b"private" not in r
    m = metrics(r)
    assert m["sessionlog_sessions{state=active}"] == 1 and m["sessionlog_sessions{state=quarantined}"] == 0
    assert m["sessionlog_store_ok"] == 1
    assert m["sessionlog_append_durable_seconds_count"] >= 2 and m["sessionlog_batch_records_count"] >= 2
    assert m["sessionlog_records_appended_total"] >= 4 and m["sessionlog_bytes_appended_total"] > 100
    assert m["sessionlog_inflight_messages"] == 0 and m["sessionlog_recovery_seconds"] >= 0
    assert m["sessionlog_backend_info{backend=local,stream=,sync_mode=journal}"] == 1
    # the process's own figures, from prometheus_client's collector
    assert m["process_open_fds"] > 0 and m["process_max_fds"] > 0 and m["process_resident_memory_bytes"] > 0
    assert "process_cpu_seconds_total" in m
    # every name the operator docs give is one a scrape holds (an alert on a
    # name that does not exist never fires)
    named = documented_metrics("README.md", "docs/DEPLOY.md")
    assert named and not named - sample_names(m), sorted(named - sample_names(m))


async def test_a_scrape_reads_counts_kept_as_sessions_change(root, nursery):
    """Sessions by state are counts the registry and the event log keep, not a
    walk over the rows at each scrape: archive, unarchive, delete and a
    quarantine move them, and the registry's own check agrees."""
    server = await start_server(nursery, root, speed=400.0)
    store = server.store
    ids = [(await store.create_session(first_message=f"q{i}"))[0].id for i in range(5)]
    await store.update_session(ids[0], archived=True)
    await store.update_session(ids[1], archived=True)
    await store.update_session(ids[1], archived=False)
    await store.update_session(ids[2], archived=True)
    await store.delete_session(ids[2])
    store.registry.check()
    from sessionlog_store.eventstore.errors import CorruptRecord
    store.es.quarantine(ids[3], CorruptRecord(ids[3], 1, "found by a test"))
    m = metrics(await raw_http(server.port, get("/metrics", host=f"127.0.0.1:{server.port}")))
    assert (m["sessionlog_sessions{state=active}"], m["sessionlog_sessions{state=archived}"],
            m["sessionlog_sessions{state=quarantined}"]) == (3, 1, 1)


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
    assert r.startswith(b"HTTP/1.1 503") and b"store failed" in r and b"EIO" not in r, "no details: the log has them"
    assert (await raw_http(server.port, get("/healthz"))).startswith(b"HTTP/1.1 200"), "alive, not ready"
    m = metrics(await raw_http(server.port, get("/metrics", host=f"127.0.0.1:{server.port}")))
    assert m["sessionlog_store_ok"] == 0


def test_json_logs_name_their_logger_and_the_remote_and_never_the_token(root):
    """`serve --log-format json`: one JSON object a line on stderr, each naming
    its logger; a refused handshake carries the client's address; the token
    is on stdout (the URL) only."""
    import json
    import os
    import signal
    import subprocess
    import sys

    from .conftest import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    token = "tok-never-in-logs-123"
    proc = subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", root, "--port", "0",
                             "--token", token, "--log-format", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else "server ended"
            if "serving http://" in line:
                assert token not in line and "(token: as configured)" in line, "stdout is not a TTY: a log"
                port = int(line.split("serving http://", 1)[1].split(":")[1].split("/")[0])
                break

        async def refused() -> bytes:
            return await raw_http(port, b"GET /ws?token=wrong HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                                        b"Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n" % port)
        assert trio.run(refused).startswith(b"HTTP/1.1 403")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    lines = [json.loads(x) for x in err.splitlines() if x.strip()]
    assert lines and all({"ts", "level", "logger", "message"} <= set(x) for x in lines), err
    assert any(x["logger"] == "sessionlog.store" and x["message"].startswith("started:") for x in lines)
    refusal = [x for x in lines if "refused a WebSocket handshake" in x["message"]]
    assert refusal and refusal[0]["remote"].startswith("127.0.0.1:") and refusal[0]["logger"] == "sessionlog.ws"
    assert token not in err
