"""What an adversarial review of the generic streams found (issue 27), each
a test that failed before its fix: a damaged stream log (the server kept
up, the stream read-only), a producer's retry answered before what it
duplicates was durable, an append refused after changing the state,
expired streams coming back after a SIGKILL, an owner's quota, JSON
rewritten, a long-poll on a deleted stream."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.projections.dstream import Refused
from sessionlog_store.server.local.streamspace import open_stream_space

from .conftest import run_cli
from .test_stream_space import call, serve


def logs_of(tmp_path: Path) -> dict[str, Path]:
    base = tmp_path / "data" / "streams" / "sessions"
    return {p.name: p / "log.jsonl" for p in base.iterdir() if (p / "log.jsonl").exists()}


def damage(log: Path, line: int) -> None:
    lines = log.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1].replace(b'"crc":', b'"crc":1', 1) if b'"crc":' in lines[line - 1] \
        else lines[line - 1][:-3] + b"zz}"
    log.write_bytes(b"\n".join(lines))


def test_a_damaged_stream_log_is_read_only_and_the_server_stays_up(tmp_path):
    s = serve(tmp_path)
    p = s.port
    text = {"Content-Type": "text/plain"}
    before = set()
    assert call(p, "PUT", "/v1/stream/hurt", b"one", {**text, "Stream-TTL": "3"})[0] == 201
    for piece in (b" two", b" three"):
        assert call(p, "POST", "/v1/stream/hurt", piece, text)[0] == 204
    before = set(logs_of(tmp_path))
    assert call(p, "PUT", "/v1/stream/fine", b"ok", text)[0] == 201
    assert call(p, "PUT", "/v1/stream/lost", b"x", text)[0] == 201
    ids = {name: log for name, log in logs_of(tmp_path).items()}
    hurt = next(iter(before))
    fine_and_lost = sorted(set(ids) - before)
    s.stop()
    clean = run_cli("verify", "--root", str(tmp_path / "data"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    damage(ids[hurt], 2)
    first_damaged = max(fine_and_lost, key=lambda i: b'"lost"' in ids[i].read_bytes())
    damage(ids[first_damaged], 1)
    found = run_cli("verify", "--root", str(tmp_path / "data"))
    assert found.returncode == 1 and f"streams/{hurt}" in found.stdout and "sessionlog repair --root" in found.stdout
    assert f"streams/{first_damaged}" in found.stdout
    s = serve(tmp_path, port=p)
    try:
        status, _, body = call(p, "GET", "/v1/stream/hurt")
        assert status == 409 and json.loads(body)["error"]["code"] == "read_only"
        assert "sessionlog repair" in json.loads(body)["error"]["message"]
        assert call(p, "DELETE", "/v1/stream/hurt")[0] == 409
        assert call(p, "PUT", "/v1/stream/hurt", b"again", text)[0] == 409  # (its name is still taken)
        assert call(p, "GET", "/v1/stream/fine")[2] == b"ok"
        assert call(p, "GET", "/v1/stream/lost")[0] == 404  # (damaged before its first record: not loaded)
        # past the damaged stream's TTL and a sweep: still up, the logs still there for a repair
        assert call(p, "PUT", "/v1/stream/t", b"", {**text, "Stream-Expires-At": "2000-01-01T00:00:00Z"})[0] == 201
        assert call(p, "GET", "/v1/sessions")[0] == 200
        assert ids[hurt].exists() and ids[first_damaged].exists()
        assert s.proc is not None and s.proc.poll() is None
    finally:
        s.stop()
    s = serve(tmp_path, port=p)  # and it starts again
    s.stop()


class GateFS(FileOps):
    """The journal's fdatasync waits for a gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()

    def fdatasync(self, fd: int) -> None:
        self.gate.wait(20)
        super().fdatasync(fd)


async def test_a_retry_is_not_acknowledged_before_what_it_repeats_is_durable(tmp_path):
    fs = GateFS()
    async with open_stream_space(str(tmp_path), fs=fs) as space:
        st, _ = await space.create("", "s", content_type="text/plain", ttl=None, expires_at=None, closed=False,
                                   data=b"")
        answers: list[int] = []

        async def append(tag: str) -> None:
            got = await space.append(st, b"data", content_type="text/plain", close=False,
                                     producer=("p", 0, 0), stream_seq=None)
            answers.append(got.status)
        fs.gate.clear()
        async with trio.open_nursery() as n:
            n.start_soon(append, "first")
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(append, "retry")
            await trio.testing.wait_all_tasks_blocked()
            assert answers == [], "neither is answered while its record is not durable"
            fs.gate.set()
        assert sorted(answers) == [200, 204]


async def test_a_refused_append_changes_nothing_and_an_owner_has_a_quota(tmp_path):
    async with open_stream_space(str(tmp_path)) as space:
        space.max_owner_bytes = 5 + 5 + 2 * 64  # (two appends of 5 bytes: each unit also costs 64)
        st, _ = await space.create("u", "s", content_type="text/plain", ttl=None, expires_at=None, closed=False,
                                   data=b"12345")
        with pytest.raises(Refused) as over:
            await space.append(st, b"678901", content_type="text/plain", close=False, producer=("p", 0, 0),
                               stream_seq=None)
        assert (over.value.status, over.value.code) == (429, "limit_streams")
        assert (st.tail, st.producers) == (6, {}), "the refused append left no trace"
        got = await space.append(st, b"67890", content_type="text/plain", close=False, producer=("p", 0, 0),
                                 stream_seq=None)
        assert got.status == 200  # (seq 0 is still the next)
        other, _ = await space.create("v", "s", content_type="text/plain", ttl=None, expires_at=None, closed=False,
                                      data=b"01234")
        assert other.tail == 6, "another owner has a quota of its own"
        # a fork's share of its source counts; a deleted source under forks still counts
        space.max_owner_bytes = 10_000
        await space.create("u", "f", content_type="text/plain", ttl=None, expires_at=None, closed=False, data=b"",
                           forked_from="s")
        held = space._bytes["u"]
        assert held == 2 * (10 + 2 * 64)
        await space.delete("u", "s")
        assert space._bytes["u"] == held, "soft-deleted: its bytes are still held"
        await space.delete("u", "f")
        assert space._bytes["u"] == 0 and space.streams == {("v", "s"): other}


async def test_json_appends_are_kept_as_written(tmp_path):
    async with open_stream_space(str(tmp_path)) as space:
        st, _ = await space.create("", "j", content_type="application/json", ttl=None, expires_at=None,
                                   closed=False, data=b"[1E2, -0]")
        await space.append(st, b'{"a":1,"a":2}', content_type="application/json", close=False, producer=None,
                           stream_seq=None)
        await space.append(st, b"[1e400]", content_type="application/json", close=False, producer=None,
                           stream_seq=None)
        assert st.body(st.units) == b'[1E2,-0,{"a":1,"a":2},1e400]'


def test_an_expired_stream_stays_gone_after_a_sigkill(tmp_path):
    s = serve(tmp_path)
    p = s.port
    text = {"Content-Type": "text/plain"}
    assert call(p, "PUT", "/v1/stream/src", b"data", {**text, "Stream-TTL": "1"})[0] == 201
    assert call(p, "PUT", "/v1/stream/fork", b"", {"Stream-Forked-From": "/v1/stream/src",
                                                     "Stream-TTL": "3600"})[0] == 201
    assert call(p, "PUT", "/v1/stream/brief", b"x", {**text, "Stream-TTL": "1"})[0] == 201
    deadline = time.monotonic() + 30
    while call(p, "HEAD", "/v1/stream/brief")[0] != 404:  # (HEAD does not renew a TTL)
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert call(p, "GET", "/v1/stream/src")[0] == 410  # expired under its fork: soft-deleted
    names = lambda: sorted(json.loads(l.read_bytes().split(b"\n")[0])["name"]  # noqa: E731
                           for l in logs_of(tmp_path).values())
    deadline = time.monotonic() + 30
    while "brief" in names():  # its removal comes at once, not at the next sweep
        assert time.monotonic() < deadline
        time.sleep(0.1)
    src_log = next(log for log in logs_of(tmp_path).values() if b'"name":"src"' in log.read_bytes())
    deadline = time.monotonic() + 30
    while b'"ds_gone"' not in src_log.read_bytes():  # the expiry's soft delete is in the log (then the kill)
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s.kill()
    s = serve(tmp_path, port=p)
    try:
        assert call(p, "GET", "/v1/stream/brief")[0] == 404
        assert call(p, "GET", "/v1/stream/src")[0] == 410
        assert call(p, "GET", "/v1/stream/fork")[2] == b"data"
    finally:
        s.stop()


async def test_a_long_poll_on_a_stream_deleted_under_it_is_told_so(tmp_path):
    from sessionlog_store.server.edge.namespace import Namespace
    async with open_stream_space(str(tmp_path)) as space:
        await space.create("", "s", content_type="text/plain", ttl=None, expires_at=None, closed=False, data=b"a")
        ns = Namespace(space, long_poll=30)
        st = space.find("", "s")
        got: list = []

        async def poll() -> None:
            got.append(await ns._wait(st, st.visible_tail))
        async with trio.open_nursery() as n:
            n.start_soon(poll)
            await trio.testing.wait_all_tasks_blocked()
            await space.delete("", "s")
        assert space.gone(st)
        with pytest.raises(Refused) as gone:
            space.find("", "s")
        assert gone.value.status == 404


# -- a second review's findings ------------------------------------------------

async def test_a_long_fork_chain_is_deleted_and_reloaded_without_recursion(tmp_path):
    n = 1100  # (past Python's default recursion limit of 1,000)
    kw = dict(content_type="text/plain", ttl=None, expires_at=None, closed=False)
    async with open_stream_space(str(tmp_path)) as space:
        await space.create("", "s0", data=b"root", **kw)
        for i in range(1, n):
            await space.create("", f"s{i}", data=b"", forked_from=f"s{i - 1}", **kw)
        for i in range(n - 1):
            await space.delete("", f"s{i}")  # each soft-deleted: a fork reads from it
        assert space.find("", f"s{n - 1}").body(space.find("", f"s{n - 1}").units) == b"root"
    async with open_stream_space(str(tmp_path)) as space:  # a start folds the chain
        last = space.find("", f"s{n - 1}")
        assert last.body(last.units) == b"root"
        await space.delete("", f"s{n - 1}")  # the last fork: the whole chain goes
        assert not space.logs and not space.streams
    assert not list((tmp_path / "streams" / "sessions").iterdir())


def test_a_damaged_source_makes_its_forks_read_only_never_removed(tmp_path):
    s = serve(tmp_path)
    p = s.port
    text = {"Content-Type": "text/plain"}
    assert call(p, "PUT", "/v1/stream/src", b"aaa", text)[0] == 201
    assert call(p, "POST", "/v1/stream/src", b"bbb", text)[0] == 204
    assert call(p, "PUT", "/v1/stream/fork", b"", {"Stream-Forked-From": "/v1/stream/src"})[0] == 201
    assert call(p, "POST", "/v1/stream/fork", b"ddd", text)[0] == 204
    logs = logs_of(tmp_path)
    src = next(i for i, log in logs.items() if b'"name":"src"' in log.read_bytes())
    fork = next(i for i in logs if i != src)
    s.stop()
    damage(logs[src], 2)  # (the source's first append: a good record follows it)
    s = serve(tmp_path, port=p)
    try:
        for name in ("src", "fork"):
            status, _, body = call(p, "GET", f"/v1/stream/{name}")
            assert status == 409 and json.loads(body)["error"]["code"] == "read_only", name
    finally:
        s.stop()
    damage(logs[src], 1)  # (now its first line too: the source cannot be loaded at all)
    s = serve(tmp_path, port=p)
    try:
        assert call(p, "GET", "/v1/stream/fork")[0] == 409
        assert logs[fork].exists(), "the fork's log is kept for a repair of its source"
    finally:
        s.stop()


async def test_a_refusal_for_a_close_is_said_once_the_close_is_durable(tmp_path):
    fs = GateFS()
    async with open_stream_space(str(tmp_path), fs=fs) as space:
        st, _ = await space.create("", "s", content_type="text/plain", ttl=None, expires_at=None, closed=False,
                                   data=b"x")
        told: list[int] = []

        async def close() -> None:
            told.append((await space.append(st, b"", content_type=None, close=True, producer=None,
                                            stream_seq=None)).status)

        async def late() -> None:
            try:
                await space.append(st, b"y", content_type="text/plain", close=False, producer=None, stream_seq=None)
            except Refused as e:
                told.append(e.status)
        fs.gate.clear()
        async with trio.open_nursery() as n:
            n.start_soon(close)
            await trio.testing.wait_all_tasks_blocked()
            n.start_soon(late)
            await trio.testing.wait_all_tasks_blocked()
            assert told == [], "the refusal waits for the close it refuses for"
            fs.gate.set()
        assert sorted(told) == [204, 409]


async def test_json_that_is_not_utf8_is_refused(tmp_path):
    async with open_stream_space(str(tmp_path)) as space:
        st, _ = await space.create("", "j", content_type="application/json", ttl=None, expires_at=None,
                                   closed=False, data=b"")
        with pytest.raises(Refused) as bad:
            await space.append(st, b'{"name":"\xff\xfe"}', content_type="application/json", close=False,
                               producer=None, stream_seq=None)
        assert (bad.value.status, bad.value.code) == (400, "bad_json")
        assert st.units == []
