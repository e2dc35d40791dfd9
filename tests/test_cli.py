"""`sessionlog rebuild / verify / inspect / repair`: what they print, and one-line errors."""
from __future__ import annotations

import argparse
import json
import os
import subprocess

import pytest

from .conftest import run_cli, run_cli_env


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


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr and "ExceptionGroup" not in r.stderr, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, r.stderr
    return errors[0]


def test_serve_startup_failures_are_one_line_with_their_own_exit_code(store, tmp_path):
    import socket
    from .test_stop import start_serve
    p, port = start_serve(store)
    try:
        r = run_cli("serve", "--root", store, "--port", "0")  # the root is locked by the running server
        assert r.returncode == 3 and "in use by another process" in _one_line_error(r)
    finally:
        p.terminate()
        p.communicate(timeout=30)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        r = run_cli("serve", "--root", str(tmp_path / "other"), "--port", str(busy))
        line = _one_line_error(r)
        assert r.returncode == 3 and "address already in use" in line.lower()
        # An error that is not the store's own says where it came from (which
        # request timed out, which socket was busy): the last of our frames.
        assert "(OSError in " in line and "server/edge/" in line, line


@pytest.mark.parametrize("args,msg", [
    (["serve", "--port", "99999"], "99999 is not a port"),
    (["serve", "--log-level", "LOUD"], "'LOUD' is not one of"),
    (["serve", "--stop-grace", "-1"], "not a duration"),
])
def test_bad_serve_options_are_refused_as_usage_errors(store, args, msg):
    r = run_cli(*args, "--root", store)
    assert r.returncode == 2 and msg in _one_line_error(r)


def test_a_mistyped_root_creates_nothing_and_verify_tells_missing_from_corrupt(store, tmp_path):
    typo = str(tmp_path / "typo")
    for cmd in ("rebuild", "verify", "repair"):
        args = [cmd, "--root", typo] + (["someid"] if cmd == "repair" else [])
        r = run_cli(*args)
        assert r.returncode == 3 and "no store at" in _one_line_error(r)
        assert not os.path.exists(typo)
    assert run_cli("verify", "--root", store).returncode == 0
    from sessionlog_store.eventstore.local.log import list_session_ids, log_path
    from sessionlog_store.eventstore.local.fsio import OS_FILES
    sid = list_session_ids(OS_FILES, store)[0]
    with open(log_path(store, sid), "rb") as f:
        data = bytearray(f.read())
    data[30] ^= 0x01
    with open(log_path(store, sid), "wb") as f:
        f.write(data)
    assert run_cli("verify", "--root", store).returncode == 1


def test_a_session_named_projects_is_repaired_as_a_session(tmp_path):
    import trio

    from sessionlog_store.server.stores import open_session_store
    root = str(tmp_path / "store")

    async def make() -> None:
        async with open_session_store(root) as store:
            await store.create_session("projects", first_message="a session with that id")
    trio.run(make)
    r = run_cli("repair", "--root", root, "projects")
    assert r.returncode == 0 and r.stdout.startswith("projects: nothing to repair (2 good records)"), r.stdout
    r = run_cli("repair", "--root", root, "--project-log")
    assert r.returncode == 0 and "no project log" in r.stdout
    r = run_cli("repair", "--root", root)
    assert r.returncode == 3 and "--project-log" in r.stderr


def test_every_serve_flag_comes_from_the_environment_too(monkeypatch):
    """Issue 15 item 4: each `serve` option has a $SESSIONLOG_* twin, checked as
    the flag is; `--help` lists each with its variable and default (never the
    token's value); a flag on the command line wins."""
    from sessionlog_store.server.cli import build_parser
    parser = build_parser()
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    text = serve.format_help()
    for action in serve._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and action.dest != "help":
            name = "$SESSIONLOG_" + longs[0][2:].upper().replace("-", "_")
            assert name in text, f"{longs[0]} has no environment variable in --help"
    monkeypatch.setenv("SESSIONLOG_STATE_CACHE", "7")
    monkeypatch.setenv("SESSIONLOG_SYNC_MODE", "auto")
    monkeypatch.setenv("SESSIONLOG_TOKEN", "s3cret-value")
    monkeypatch.setenv("SESSIONLOG_ALLOW_ORIGIN", "https://a.example,https://b.example")
    parser = build_parser()
    args = parser.parse_args(["serve"])
    assert (args.state_cache, args.sync_mode, args.token) == (7, "auto", "s3cret-value")
    assert args.allow_origin == ["https://a.example", "https://b.example"]
    assert parser.parse_args(["serve", "--state-cache", "9"]).state_cache == 9
    assert parser.parse_args(["serve", "--log-write-interval", "0"]).log_write_interval == 0  # (0: no linger)
    serve = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    assert "s3cret-value" not in serve.format_help()


def test_a_bad_environment_value_is_a_usage_error_naming_the_variable(root):
    import os
    env_bad = {"SESSIONLOG_PROGRESS_INTERVAL": "-1"}
    r = run_cli_env(env_bad, "serve", "--root", root, "--port", "0")
    assert r.returncode == 2 and "$SESSIONLOG_PROGRESS_INTERVAL" in r.stderr
    assert not os.path.exists(root), "nothing was created"


def test_version_names_the_distribution():
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("sessionlog (the sessionlog-store distribution) ")


def test_a_repeatable_flag_replaces_the_environment_list(monkeypatch):
    """Review finding: argparse appends flags to a default list; the
    environment's list must be replaced, not extended (trust '*' stays off)."""
    from sessionlog_store.server.cli import _flags_replace_env, build_parser
    monkeypatch.setenv("SESSIONLOG_FORWARDED_ALLOW_IPS", "*")
    parser = build_parser()
    args = parser.parse_args(["serve", "--forwarded-allow-ips", "10.0.0.1"])
    _flags_replace_env(parser, args)
    assert args.forwarded_allow_ips == ["10.0.0.1"]
    args = parser.parse_args(["serve"])
    _flags_replace_env(parser, args)
    assert args.forwarded_allow_ips == ["*"]


def test_a_public_url_is_compared_as_browsers_send_it():
    from sessionlog_store.server.edge.ws import _public_netloc
    assert _public_netloc("https://Chat.Example.com:443/chat") == "chat.example.com"
    assert _public_netloc("http://chat.example.com:8080/") == "chat.example.com:8080"


@pytest.mark.parametrize("args", [["serve", "--port", "0", "--backend", "nats://127.0.0.1:4222"],
                                  ["verify", "--backend", "nats://127.0.0.1:4222"],
                                  ["migrate", "--from", "ROOT", "--to", "nats://127.0.0.1:4222"]])
def test_the_nats_backend_without_its_extra_is_one_line_naming_the_extra(tmp_path, args):
    """(issue 24, item 9) Without nats-py installed (hidden from the child as
    an uninstalled package is: `sys.modules['nats'] = None` makes find_spec
    answer None), a nats:// backend is one line and exit 3, not a traceback."""
    import subprocess
    import sys

    from .conftest import ROOT
    args = [str(tmp_path) if a == "ROOT" else a for a in args]
    code = ("import sys; sys.modules['nats'] = None\n"
            "from sessionlog_store.server.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", code, *args, "--root", str(tmp_path)] if args[0] != "migrate"
                       else [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 3, r
    [line] = r.stderr.strip().splitlines()
    assert "pip install 'sessionlog-store[nats]'" in line and "Traceback" not in r.stderr, line
