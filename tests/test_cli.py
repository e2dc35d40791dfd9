"""`sessionlog rebuild / verify / inspect / repair`: what they print, and one-line errors."""
from __future__ import annotations

import json
import os

import pytest

from .conftest import run_cli


@pytest.fixture
def store(root: str) -> str:
    r = run_cli_populate(root, sessions=30, messages=6)
    assert r.returncode == 0, r.stderr
    return root


def run_cli_populate(root: str, sessions: int, messages: int):  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    from .conftest import ROOT
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "bench.populate", "--root", root, "--sessions", str(sessions),
                           "--messages", str(messages), "--seed", "3"], capture_output=True, text=True,
                          env=env, timeout=120)


def test_rebuild_rewrites_every_cache_and_says_what_it_did(store):
    os.unlink(os.path.join(store, "index.json"))
    r = run_cli("rebuild", "--root", store)
    assert r.returncode == 0, r.stderr
    assert "30 sessions" in r.stdout and "30 snapshots" in r.stdout and "0 torn tails repaired" in r.stdout
    assert os.path.exists(os.path.join(store, "index.json"))
    sid = sorted(os.listdir(os.path.join(store, "sessions")))[0]
    assert os.path.exists(os.path.join(store, "sessions", sid, "snapshot.json"))
    assert run_cli("verify", "--root", store).returncode == 0


def test_deleting_every_cache_loses_nothing(store):
    before = run_cli("inspect", "--root", store, sorted(os.listdir(os.path.join(store, "sessions")))[0])
    for dirpath, _, files in os.walk(store):
        for f in files:
            if f in ("index.json", "snapshot.json"):
                os.unlink(os.path.join(dirpath, f))
    assert run_cli("verify", "--root", store).returncode == 0
    assert run_cli("rebuild", "--root", store).returncode == 0
    after = run_cli("inspect", "--root", store, sorted(os.listdir(os.path.join(store, "sessions")))[0])
    assert before.stdout == after.stdout


def test_inspect_prints_records_after_a_seq_as_json_lines(store):
    sid = sorted(os.listdir(os.path.join(store, "sessions")))[0]
    r = run_cli("inspect", "--root", store, sid, "--after", "3")
    assert r.returncode == 0
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    assert recs and recs[0]["seq"] == 4
    assert [x["seq"] for x in recs] == list(range(4, 4 + len(recs)))


@pytest.mark.parametrize("args,msg", [
    (["inspect", "--root", "{root}", "../etc"], "invalid session id"),
    (["inspect", "--root", "{root}", "nosuchsession"], "unknown session"),
    (["repair", "--root", "{root}", "nosuchsession"], "unknown session"),
    (["verify", "--root", "{root}/nope"], "no store at"),
])
def test_errors_are_one_clear_line(store, args, msg):
    r = run_cli(*[a.format(root=store) for a in args])
    assert r.returncode != 0
    assert msg in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("cmd", ["serve", "rebuild", "verify", "inspect", "repair"])
def test_every_command_has_help(cmd):
    r = run_cli(cmd, "--help")
    assert r.returncode == 0 and "--root" in r.stdout
