"""docs/DEPLOY.md works as written: its systemd unit passes `systemd-analyze
verify` (Debian's systemd; .ci/run installs it) and has no inline comment
systemd would read as part of a value; the container recipe's stop timeout
is above --stop-grace and a .dockerignore keeps the checkout's clutter out."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from sessionlog_store.server.cli import build_parser
from sessionlog_store.server.run import STOP_GRACE

from .conftest import ROOT

DEPLOY = (ROOT / "docs" / "DEPLOY.md").read_text()


def unit() -> str:
    m = re.search(r"```ini\n(# /etc/systemd/system/sessionlog.service\n.*?)```", DEPLOY, re.S)
    assert m, "DEPLOY.md holds the unit"
    return m.group(1)


def settings(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_the_stop_grace_default_is_one_number():
    serve = build_parser().parse_args(["serve"])
    assert serve.stop_grace == STOP_GRACE == 10.0


def test_the_unit_has_no_inline_comment_and_stops_and_restarts_as_documented():
    s = settings(unit())
    inline = [f"{k}={v}" for k, vs in s.items() for v in vs if re.search(r"\s[#;]", v)]
    assert not inline, f"systemd reads these as part of the value: {inline}"
    assert s["StateDirectory"] == ["sessionlog"] and s["Environment"][0] == "SESSIONLOG_ROOT=/var/lib/sessionlog"
    assert "3" in s["RestartPreventExitStatus"][0].split(), "exit 3 (could not start) must not restart-loop"
    assert s["Restart"] == ["on-failure"]
    assert float(s["TimeoutStopSec"][0]) > STOP_GRACE
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "RestrictAddressFamilies"):
        assert hardening in s, hardening


def test_the_unit_passes_systemd_analyze_verify(tmp_path):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI needs systemd-analyze (.ci/run installs Debian's systemd)")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # the one path that differs on this machine: the command the unit runs
    exe = os.path.join(os.path.dirname(sys.executable), "sessionlog")
    assert os.access(exe, os.X_OK), exe
    text = unit().replace("/opt/sessionlog/.venv/bin/sessionlog", exe)
    assert exe in text
    path = tmp_path / "sessionlog.service"
    path.write_text(text)
    r = subprocess.run([tool, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), r.stdout + r.stderr
    # and it would catch a mistake: a bad value is reported
    path.write_text(text.replace("ProtectSystem=strict", "ProtectSystem=strictly"))
    r = subprocess.run([tool, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert "ProtectSystem" in r.stderr or "protect system" in r.stderr.lower(), r.stderr


def test_the_container_stops_after_the_grace_and_ignores_the_clutter():
    m = re.search(r"--stop-timeout (\d+)", DEPLOY)
    assert m and int(m.group(1)) > STOP_GRACE, "Docker's default 10 s kills a stop that takes --stop-grace"
    ignored = (ROOT / ".dockerignore").read_text().split()
    for clutter in (".git/", ".venv/", "build/", "bench/results/", "data/"):
        assert clutter in ignored, clutter
