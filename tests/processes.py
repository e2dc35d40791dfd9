"""Processes the end-to-end tests start: `sessionlog serve` (ServeProcess)
and Debian's nginx in front of it (start_nginx, with the head of its
config); kept here so that the browser tests and the scale-out tests share
them without importing each other (the browser module skips itself where
Chromium is missing)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

import pytest

from .conftest import ROOT

NGINX = os.environ.get("SESSIONLOG_NGINX", "/usr/sbin/nginx")

# The http block's head every test config starts with ({d}: the config's folder).
NGINX_HEAD = """daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log;
events {{ worker_connections 128; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp; proxy_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;
  uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;
  map $http_upgrade $connection_upgrade {{ default upgrade; '' close; }}
"""
# A location's lines that pass the WebSocket upgrade and say who asked.
NGINX_PROXY = """      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection $connection_upgrade;
      proxy_set_header X-Forwarded-Host $http_host;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_read_timeout 3600s;
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], object], what: str, within: float = 30.0) -> None:
    """Until `cond()` holds (a state another process reaches), or fail saying `what`."""
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class ServeProcess:
    """`sessionlog serve` in a process of its own, started until it serves."""

    def __init__(self, root: str, port: int, speed: float = 25.0, extra: tuple[str, ...] = (),
                 prefix: str = "", token: str = "browser-test-token", log: Path | None = None,
                 runner: tuple[str, ...] = ("-m", "sessionlog_store"), env: dict[str, str] | None = None) -> None:
        self.root, self.port, self.speed, self.extra, self.prefix = root, port, speed, extra, prefix
        # what runs `serve` (a module, or a script: tests/held_serve.py) and what its environment adds
        self.runner, self.env = runner, env or {}
        self.token = token
        self.log = log  # where its stderr goes (None: a pipe, read if it ends early; keep it quiet)
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}/#token={self.token}"

    def start(self) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **self.env)
        self.proc = subprocess.Popen(
            [sys.executable, *self.runner, "serve", "--root", self.root, "--port", str(self.port),
             "--token", self.token, "--agent-speed", str(self.speed), *self.extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE if self.log is None else self.log.open("w"), text=True,
            env=env)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            assert line, (self.proc.stderr.read() if self.proc.stderr else
                          self.log.read_text() if self.log is not None else "server ended")
            if "serving http://" in line:
                return
        raise AssertionError("server did not start")

    def http(self) -> Any:
        """A client of its HTTP API as its user (the bearer token); no kept
        connections, so it goes on across a kill and a start."""
        import httpx
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}{self.prefix}", timeout=30,
                            headers={"Authorization": f"Bearer {self.token}"},
                            limits=httpx.Limits(max_keepalive_connections=0))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_nginx(d: Path, conf: str, port: int) -> subprocess.Popen[str]:
    """nginx with `conf` (written to d/nginx.conf), once it accepts on `port`;
    skipped with a message where nginx is not installed (a failure under CI)."""
    if not os.path.exists(NGINX):
        if os.environ.get("CI"):
            raise RuntimeError(f"CI needs nginx at {NGINX} (.ci/run installs Debian's nginx)")
        pytest.skip(f"no nginx at {NGINX}: install Debian's `nginx` to run this test")
    (d / "tmp").mkdir(parents=True, exist_ok=True)
    (d / "nginx.conf").write_text(conf)
    proxy = subprocess.Popen([NGINX, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while True:  # nginx is up once it accepts connections
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proxy
        except OSError:
            assert proxy.poll() is None, proxy.stderr.read() if proxy.stderr else "nginx ended"
            assert time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)


def stop_nginx(proxy: subprocess.Popen[str]) -> None:
    proxy.terminate()
    proxy.wait(10)
