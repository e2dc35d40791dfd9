"""Real processes streaming into a store, killed: SIGKILL leaves the message
for the abort sweep, SIGTERM finalizes it; the sweep runs exactly once even
when a crash interrupts it."""
from __future__ import annotations

import os
import signal

import trio

from sessionlog_store.eventstore.events import MessageFinalized
from sessionlog_store.eventstore.record import scan
from sessionlog_store.server.stores import open_session_store

from .conftest import child, read_logs

STREAMER = r"""
import signal, sys, trio
from sessionlog_store.server.stores import open_session_store
N = int(sys.argv[2])
async def main():
    async with open_session_store(sys.argv[1]) as store:
        async def stream(k):
            meta, _ = await store.create_session(first_message=f"go {k}")
            async with store.inflight(meta.id) as msg:
                print("msg", k, meta.id, msg.msg_id, flush=True)
                i = 0
                while True:
                    chunk = f"<{k}.{i}>"
                    msg.write(chunk)
                    print("w", k, chunk, flush=True)
                    i += 1
                    await trio.sleep(0.01)
        async with trio.open_nursery() as n:
            for k in range(N):
                n.start_soon(stream, k)
            with trio.open_signal_receiver(signal.SIGTERM) as sigs:
                async for _ in sigs:
                    n.cancel_scope.cancel()
                    break
trio.run(main)
"""


def run_streamer(root: str, n: int, sig: int, after_chars: int) -> dict[int, tuple[str, str, str]]:
    """Stream n messages, send `sig` once each has `after_chars` characters.
    Returns k -> (session_id, msg_id, text written)."""
    p = child(STREAMER, root, str(n))
    assert p.stdout is not None
    info: dict[int, list[str]] = {}
    written: dict[int, str] = {}
    while len(written) < n or min(len(t) for t in written.values()) < after_chars:
        line = p.stdout.readline()
        assert line, p.stderr.read() if p.stderr else "child ended"
        parts = line.split()
        if parts[0] == "msg":
            info[int(parts[1])] = parts[2:4]
            written[int(parts[1])] = ""
        elif parts[0] == "w":
            written[int(parts[1])] += parts[2]
    os.kill(p.pid, sig)
    # (the rest through the same buffered file: communicate() reads the pipe
    # itself and misses lines readline() had buffered already: seen on a busy machine)
    out = p.stdout.read()
    err = p.stderr.read() if p.stderr else ""
    p.wait(30)
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "w":
            written[int(parts[1])] += parts[2]
    if sig == signal.SIGTERM:
        assert p.returncode == 0, err
    return {k: (info[k][0], info[k][1], written[k]) for k in info}


async def test_sigkill_mid_stream_is_aborted_with_its_persisted_content(root):
    streams = await trio.to_thread.run_sync(run_streamer, root, 3, signal.SIGKILL, 300)
    async with open_session_store(root) as store:
        for sid, mid, text in streams.values():
            m = (await store.load_session(sid)).messages[mid]
            assert m.status == "aborted" and m.metadata["aborted_reason"] == "worker restart"
            assert text.startswith(m.content), "persisted content is a prefix of what was written"
            # ~25 chunks of ~6 characters per 250 ms interval: at most about one interval lost.
            assert len(text) - len(m.content) <= 2 * 25 * 8, (len(text), len(m.content))
            assert len(m.content) >= 300 - 2 * 25 * 8
            assert store.get_meta(sid).status == "idle"
    first = read_logs(root)
    async with open_session_store(root) as store:
        assert store.aborted_at_start == []
    assert read_logs(root) == first, "a second restart changes nothing"


async def test_sigterm_mid_stream_persists_everything_and_aborts_server_shutdown(root):
    streams = await trio.to_thread.run_sync(run_streamer, root, 3, signal.SIGTERM, 100)
    async with open_session_store(root) as store:
        assert store.aborted_at_start == []
        for sid, mid, text in streams.values():
            m = (await store.load_session(sid)).messages[mid]
            assert m.status == "aborted" and m.metadata["aborted_reason"] == "server shutdown"
            assert m.content == text


SWEEP_CRASH = r"""
import re, sys, threading
import trio
from sessionlog_store.eventstore import FileOps
from sessionlog_store.server.stores import open_session_store
FINAL = re.compile(rb'"message_finalized"[^\n]*?"msg_id":"([^"]+)"')
class StuckAtTheSecondAbort(FileOps):
    # The sweep appends one session's abort at a time, each acknowledged
    # before the next is written. The first message's abort passes (journal
    # and log); the first write of any other message's abort never returns:
    # the crash lands between two acknowledged steps of the sweep, whatever
    # the machine's speed.
    seen: set[bytes] = set()
    def write(self, fd, data):
        ids = set(FINAL.findall(data))
        if ids - StuckAtTheSecondAbort.seen and StuckAtTheSecondAbort.seen:
            print("stuck", len(StuckAtTheSecondAbort.seen), flush=True)
            threading.Event().wait()
        StuckAtTheSecondAbort.seen |= ids
        super().write(fd, data)
async def main():
    async with open_session_store(sys.argv[1], fs=StuckAtTheSecondAbort()):
        pass
trio.run(main)
"""


async def test_abort_sweep_runs_exactly_once_even_when_a_crash_interrupts_it(root):
    streams = await trio.to_thread.run_sync(run_streamer, root, 4, signal.SIGKILL, 30)

    def crash_during_sweep() -> None:
        p = child(SWEEP_CRASH, root)
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        assert line == "stuck 1", (line, p.stderr.read() if p.stderr else "")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)

    await trio.to_thread.run_sync(crash_during_sweep)
    for _ in range(2):
        async with open_session_store(root) as store:
            for sid, mid, _text in streams.values():
                assert (await store.load_session(sid)).messages[mid].status == "aborted"
    for sid, data in read_logs(root).items():
        finals = [r.event.msg_id for r in scan(sid, data).records if isinstance(r.event, MessageFinalized)]
        assert len(finals) == len(set(finals)) == 1, "aborted exactly once"
