"""Real SIGKILL of a writer process: nothing acknowledged is lost, no partial line."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from sessionlog_store.eventstore.events import MessageCreated
from sessionlog_store.eventstore.local.log import list_session_ids, log_path
from sessionlog_store.eventstore.record import scan
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.journal import apply_journal

from .conftest import child

APPENDER = r"""
import random, sys, trio
from sessionlog_store.server.stores import open_session_store
root = sys.argv[1]
async def main():
    async with open_session_store(root) as store:
        rows, _ = store.list_sessions(include_archived=True)
        ids = [r["id"] for r in rows]
        while len(ids) < 5:
            meta, _ = await store.create_session()
            ids.append(meta.id)
        print("ready", flush=True)
        async def writer(k):
            rng = random.Random(k)
            while True:
                sid = rng.choice(ids)
                mid = await store.append_message(sid, "m" * rng.randint(1, 300))
                print("ack", sid, mid, flush=True)
        async with trio.open_nursery() as n:
            for k in range(8):
                n.start_soon(writer, k)
trio.run(main)
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_acknowledged_record(root):
    rng = random.Random(1234)
    acked: dict[str, set[str]] = {}
    kills = 0
    while kills < 12:
        p = child(APPENDER, root)
        assert p.stdout is not None
        first = p.stdout.readline()
        assert first.strip() == "ready", p.stderr.read() if p.stderr else first
        time.sleep(rng.uniform(0.02, 0.3))
        os.kill(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
        assert p.returncode == -signal.SIGKILL
        kills += 1
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "ack":
                acked.setdefault(parts[1], set()).add(parts[2])
        # Straight after the kill, before any recovery: the logs on disk
        # never hold a partial line; with the journal's records written back
        # (the first step of a start), every acknowledged record.
        for sid in list_session_ids(OS_FILES, root):
            with open(log_path(root, sid), "rb") as f:
                s = scan(sid, f.read(), expect_seq=1)
            assert s.corrupt is None and s.torn_bytes == 0, "a SIGKILL never leaves a partial line"
        apply_journal(OS_FILES, root)
        for sid in list_session_ids(OS_FILES, root):
            with open(log_path(root, sid), "rb") as f:
                s = scan(sid, f.read(), expect_seq=1)
            assert s.corrupt is None and s.torn_bytes == 0, "a SIGKILL never leaves a partial line"
            have = {r.event.msg_id for r in s.records if isinstance(r.event, MessageCreated)}
            missing = acked.get(sid, set()) - have
            assert not missing, f"acknowledged messages lost in {sid}: {sorted(missing)[:3]}"
    assert sum(map(len, acked.values())) > 50
