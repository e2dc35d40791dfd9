"""The Durable Streams protocol's own server conformance suite (npm
`@durable-streams/server-conformance-tests`, written by nobody here) against
a live `sessionlog serve --streams-anonymous`, and in the same run against
the protocol's Node reference server (`@durable-streams/server`): every test
the reference passes passes here, and every test not passed here is listed
with its reason in docs/HTTP.md (issue 27 item 2)."""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from .conftest import ROOT
from .nats_cluster import NatsCluster
from .nodejs import node_tests
from .processes import ServeProcess, free_port

DOC = ROOT / "docs" / "HTTP.md"


def run_suite(node: Path, out: Path, env: dict[str, str], *args: str) -> dict[str, str]:
    """{test's full name: passed | failed | skipped} of one run of the suite
    (`args`: vitest's, e.g. a name filter: the others are skipped)."""
    npx = shutil.which("npx")
    assert npx is not None
    proc = subprocess.run([npx, "vitest", "run", "conformance.test.mjs", "--reporter=json", f"--outputFile={out}",
                           *args],
                          cwd=node, env={**os.environ, **env}, capture_output=True, text=True, timeout=900)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    return {t["fullName"]: t["status"] for f in report["testResults"] for t in f["assertionResults"]}


def documented_exceptions() -> set[str]:
    """The tests docs/HTTP.md says this server does not pass (its
    "Conformance" section: a list of `full name`: reason)."""
    text = DOC.read_text()
    section = text.split("### Conformance", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return set(re.findall(r"^- `([^`]+)`", section, re.M))


def test_the_conformance_suite_passes_what_the_reference_server_passes(tmp_path):
    node = node_tests()
    server = ServeProcess(str(tmp_path / "data"), free_port(), extra=("--streams-anonymous", "--log-level", "WARNING"),
                          log=tmp_path / "serve.log")
    server.start()
    try:
        # The two runs at once (each mostly waits out TTLs and long-polls):
        # the suite's longest test halved.
        with ThreadPoolExecutor(2) as pool:
            runs = pool.submit(run_suite, node, tmp_path / "ours.json",
                               {"DS_BASE_URL": f"http://127.0.0.1:{server.port}"}), \
                pool.submit(run_suite, node, tmp_path / "reference.json", {"DS_REFERENCE": "1"})
            ours, reference = runs[0].result(), runs[1].result()
    finally:
        server.stop()
    assert len(reference) > 300 and set(ours) == set(reference), "the two runs ran different tests"
    passed = {n for n, s in ours.items() if s == "passed"}
    missing = {n for n, s in reference.items() if s == "passed"} - passed
    assert not missing, f"the reference passes these, sessionlog does not: {sorted(missing)}"
    not_passed = {n for n, s in ours.items() if s == "failed"}
    assert not_passed == documented_exceptions(), (
        "docs/HTTP.md's Conformance section must list exactly the tests not passed: "
        f"not passed {sorted(not_passed)}, listed {sorted(documented_exceptions())}")
    skipped = {n for n, s in ours.items() if s == "skipped"}
    assert skipped == {n for n, s in reference.items() if s == "skipped"}
    assert len(passed) >= len(ours) - len(skipped) - len(not_passed)
    assert "Server error" not in (tmp_path / "serve.log").read_text()


@contextmanager
def alternating_proxy(listener: socket.socket, ports: list[int]) -> Iterator[None]:
    """A TCP proxy on `listener` whose connections go to each of `ports` in
    turn (a load balancer in front of workers)."""
    turn = itertools.cycle(ports)
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket, mine: threading.Event, other: threading.Event) -> None:
        """src to dst until src ends; if dst goes first (a server that
        answered 413 and closed), src is read on and dropped until the other
        way is done, as a lingering server does, so the answer reaches its
        client."""
        sending = True
        try:
            while data := src.recv(65536):
                if sending:
                    try:
                        dst.sendall(data)
                    except OSError:
                        sending = False
                elif other.is_set():
                    break
        except OSError:
            pass
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            mine.set()
            if other.is_set():  # (both ways done)
                src.close()
                dst.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            backend = socket.create_connection(("127.0.0.1", next(turn)))
            up, down = threading.Event(), threading.Event()
            threading.Thread(target=pipe, args=(client, backend, up, down), daemon=True).start()
            threading.Thread(target=pipe, args=(backend, client, down, up), daemon=True).start()
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        listener.close()
        thread.join(10)


# Left out of the run on the JetStream backend (the local run has them): they
# wait out TTLs and long-poll timeouts (most of the suite's 90 s), and what
# they check is the space's, not the backend's.
SLOW_GROUPS = ("TTL Expiration Behavior", "Fork - TTL and Expiry", "Offset Validation and Resumability")


def test_the_conformance_suite_passes_on_workers_sharing_a_jetstream_stream(tmp_path, nats_cluster: NatsCluster):
    """The same suite against a worker of the JetStream backend (its
    streams on the cluster, server/scaleout/streamspace.py): every test run
    passes but the reserved APIs the suite skips itself. Half of its
    requests go to a second worker of the same stream (the suite reads what
    it wrote through the other: a proxy in between alternates them)."""
    from .test_scaleout import Worker
    node = node_tests()
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    workers = [Worker(nats_cluster, tmp_path / f"w{i}", free_port(), "DSCONF", "--streams-anonymous",
                      "--allowed-host", f"127.0.0.1:{port}", "--log-level", "WARNING") for i in range(2)]
    for i, w in enumerate(workers):
        w.log = tmp_path / f"w{i}.log"
        w.start()
    try:
        pattern = "^(?!.*(" + "|".join(re.escape(g) for g in SLOW_GROUPS) + ")).*$"
        with alternating_proxy(listener, [w.port for w in workers]):
            ours = run_suite(node, tmp_path / "ours.json", {"DS_BASE_URL": f"http://127.0.0.1:{port}"},
                             "-t", pattern, "--testTimeout=120000")  # (each request waits for the cluster)
    finally:
        for w in workers:
            w.stop()
    assert len(ours) > 300
    failed = sorted(n for n, s in ours.items() if s == "failed")
    assert not failed, failed
    ran = {n for n, s in ours.items() if s == "passed"}
    assert all(not any(g in n for g in SLOW_GROUPS) for n in ran)
    assert len(ran) > 250, len(ran)
    for w in workers:
        assert "Server error" not in (w.log or tmp_path).read_text()
