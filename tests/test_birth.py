"""Durable at birth (spec/launch-snapshot-at-birth.md), for real: SIGKILL a
process right after it launched a chat nobody typed into, and right in the
middle of a deletion."""
from __future__ import annotations

import os
import signal

import trio

from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.server.stores import open_session_store

from .conftest import child

LAUNCH = r"""
import sys, trio, time
from sessionlog_store.server.stores import open_session_store
async def main():
    async with open_session_store(sys.argv[1]) as store:
        meta, _ = await store.create_session(agent_id="dash", source="web")
        print(meta.id, flush=True)
        await trio.sleep_forever()
trio.run(main)
"""

DELETE = r"""
import sys, threading, trio
from sessionlog_store.eventstore import FileOps
from sessionlog_store.server.stores import open_session_store
class StuckRemoval(FileOps):
    def rmtree(self, path):
        print("tombstoned", flush=True)
        threading.Event().wait()
async def main():
    async with open_session_store(sys.argv[1], fs=StuckRemoval()) as store:
        meta, _ = await store.create_session(first_message="doomed")
        keep, _ = await store.create_session(first_message="kept")
        print(meta.id, keep.id, flush=True)
        await store.delete_session(meta.id)
trio.run(main)
"""


def _kill_after_line(code: str, root: str, until: str | None = None) -> list[str]:
    p = child(code, root)
    assert p.stdout is not None
    lines = [p.stdout.readline().strip()]
    while until is not None and lines[-1] != until:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.stderr else "child ended"
        lines.append(line.strip())
    os.kill(p.pid, signal.SIGKILL)
    p.wait(30)
    return lines


async def test_launched_chat_survives_sigkill_of_its_backend(root):
    [sid] = await trio.to_thread.run_sync(_kill_after_line, LAUNCH, root)
    # The log exists at birth, with the session's record in it.
    assert os.path.getsize(log_path(root, sid)) > 0
    # A respawned process (its memory gone) lists the session as idle.
    async with open_session_store(root) as store:
        row = store.get_row(sid)
        assert row["status"] == "idle" and row["agent_id"] == "dash" and row["message_count"] == 0
    # A registry rebuilt from nothing but the logs still lists it.
    os.unlink(os.path.join(root, "index.json"))
    async with open_session_store(root) as store:
        assert store.recovery is not None and store.recovery.full_replays == 1
        assert [r["id"] for r in store.list_sessions()[0]] == [sid]


async def test_deletion_interrupted_by_sigkill_finishes_at_the_next_start(root):
    lines = await trio.to_thread.run_sync(_kill_after_line, DELETE, root, "tombstoned")
    doomed, kept = lines[0].split()
    assert os.path.exists(log_path(root, doomed)), "killed before the folder went"
    async with open_session_store(root) as store:
        assert store.recovery is not None and store.recovery.unfinished_deletions == [doomed]
        assert [r["id"] for r in store.list_sessions()[0]] == [kept]
    assert not os.path.exists(os.path.dirname(log_path(root, doomed)))
