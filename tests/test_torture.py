"""kill -9 torture under load through the real `sessionlog serve`: clients keep
what was acknowledged; after every kill (some of them during recovery) the
next start must hold all of it, with no duplicate, and abort each message it
finds running exactly once. SESSIONLOG_TORTURE_KILLS sets the count (30 in
the normal run; the long mode is 200+)."""
from __future__ import annotations

import os
import re
import random
import signal
import subprocess
import sys
import time

import pytest
import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.journal import apply_journal
from sessionlog_store.eventstore.record import scan
from sessionlog_store.server.edge.client import ServerError, open_client

from .conftest import ROOT, read_logs

KILLS = int(os.environ.get("SESSIONLOG_TORTURE_KILLS", "30"))
TOKEN = "torture"


def spawn(root: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    with open(f"{root}.stderr", "a") as err:  # (every start's, kept: what a start that ended said)
        return subprocess.Popen([sys.executable, "-m", "sessionlog_store", "serve", "--root", root, "--port", "0",
                                 "--token", TOKEN, "--agent-speed", "200", "--log-level", "WARNING"],
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)


def wait_serving(proc: subprocess.Popen[str], root: str) -> int:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            with open(f"{root}.stderr") as err:
                said = err.read()[-3000:]
            raise AssertionError(f"the server ended before serving (exit {proc.wait(30)}); its stderr ends:\n{said}")
        if "serving http://" in line:
            return int(re.search(r"http://[^/]+:(\d+)/", line).group(1))  # type: ignore[union-attr]


async def load(port: int, seconds: float, rng: random.Random, acked: dict[str, set[str]]) -> None:
    with trio.move_on_after(seconds):
        async with open_client("127.0.0.1", port, TOKEN) as c:
            sessions = list(acked)
            while True:
                try:
                    if not sessions or rng.random() < 0.3:
                        ack = await c.request("chat", content=f"new {rng.random()}")
                        sessions.append(ack["session_id"])
                    else:
                        sid = rng.choice(sessions)
                        ack = await c.request("chat", session_id=sid, content=f"more {rng.random()}")
                    acked.setdefault(ack["session_id"], set()).update({ack["msg_id"], ack["reply_id"]})
                except ServerError as e:
                    assert e.code in ("unknown_session", "read_only", "reply_running"), e


def check(root: str, acked: dict[str, set[str]]) -> tuple[int, int]:
    """Every acknowledged message is in its log once (the journal's records
    written back first, as a start does); no message finalized twice."""
    apply_journal(OS_FILES, root)
    logs = read_logs(root)
    msgs = 0
    for sid, ids in acked.items():
        assert sid in logs, f"acknowledged session {sid} lost"
        s = scan(sid, logs[sid], expect_seq=1)
        assert s.corrupt is None
        created = [r.event.msg_id for r in s.records if isinstance(r.event, MessageCreated)]
        assert len(created) == len(set(created)), "a message was duplicated"
        missing = ids - set(created)
        assert not missing, f"acknowledged messages lost in {sid}: {sorted(missing)[:3]}"
        finals = [r.event.msg_id for r in s.records if isinstance(r.event, MessageFinalized)]
        assert len(finals) == len(set(finals)), "a message was finalized twice"
        msgs += len(created)
    return len(acked), msgs


@pytest.mark.slow
def test_kill_minus_nine_torture(tmp_path):
    root = str(tmp_path / "store")
    rng = random.Random(99)
    acked: dict[str, set[str]] = {}
    recoveries: list[float] = []
    during_recovery = 0
    for k in range(KILLS):
        t0 = time.monotonic()
        proc = spawn(root)
        try:
            if k % 5 == 4:  # kill it while it recovers
                time.sleep(rng.uniform(0.0, 0.4))
                during_recovery += 1
            else:
                port = wait_serving(proc, root)
                recoveries.append(time.monotonic() - t0)
                trio.run(load, port, rng.uniform(0.1, 0.6), rng, acked)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        check(root, acked)
    # A last, clean start: everything acknowledged, nothing running.
    proc = spawn(root)
    try:
        port = wait_serving(proc, root)

        async def final() -> None:
            async with open_client("127.0.0.1", port, TOKEN) as c:
                rows = (await c.request("list_sessions", include_archived=True))["rows"]
                assert {r["id"] for r in rows} >= set(acked)
                for sid in acked:
                    loaded = await c.request("load_session", session_id=sid)
                    assert not [m for m in loaded["messages"] if m["status"] in ("pending", "running")]
        trio.run(final)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    sessions, messages = check(root, acked)
    recoveries.sort()
    p99 = recoveries[min(len(recoveries) - 1, int(0.99 * len(recoveries)))]
    print(f"torture: {KILLS} kills ({during_recovery} during recovery), {sessions} sessions, {messages} messages; "
          f"acknowledged lost 0, duplicated 0, finalized twice 0; start-to-serving p99 {p99:.2f} s")
