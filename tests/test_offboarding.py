"""`sessionlog users list|export|delete|transfer` (docs/SECURITY.md,
"Offboarding a user"): real stores on disk, the command in a subprocess,
and, after a transfer, a real server showing the sessions to their new owner
only."""
from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest
import trio

from sessionlog_store.server.config import StoreConfig

from sessionlog_store.server.stores import open_session_store

from .conftest import read_logs, run_cli

pytestmark = pytest.mark.slow


async def populate(root: str, folder: Path) -> dict[str, list[str]]:
    """Two sessions and a project of alice's, one session of bob's, one of the
    single user's; returns the session ids by owner."""
    made: dict[str, list[str]] = {"alice": [], "bob": [], "": []}
    (folder / "alice-work").mkdir()
    with trio.fail_after(30):
        async with open_session_store(root, config=StoreConfig(many_users=True)) as store:
            project = await store.create_project("alice-work", str(folder / "alice-work"), owner="alice")
            for owner, title in (("alice", "a1"), ("alice", "a2"), ("bob", "b1"), ("", "single")):
                meta, _ = await store.create_session(title=title, owner=owner, first_message=f"{title} secret",
                                                     project_id=project.id if title == "a1" else None)
                await store.append_message(meta.id, f"{title} answer", role="assistant", kind="llm_reply")
                made[owner].append(meta.id)
    return made


def lines_of(out: str) -> dict[str, str]:
    return {line.split("\t", 1)[0]: line for line in out.splitlines()}


async def test_list_names_every_owner_with_its_sessions_and_projects(root, tmp_path):
    await populate(root, tmp_path)
    r = run_cli("users", "list", "--root", root)
    assert r.returncode == 0, r.stderr
    got = lines_of(r.stdout)
    assert set(got) == {'""', '"alice"', '"bob"'}, r.stdout
    assert "\t2 sessions (0 archived)\t1 project\tlast updated 20" in got['"alice"']
    assert "\t1 session (0 archived)\t0 projects\t" in got['"bob"']


async def test_export_is_the_users_logs_byte_for_byte_and_nobody_elses(root, tmp_path):
    made = await populate(root, tmp_path)
    out = tmp_path / "alice.tar"
    r = run_cli("users", "export", "alice", "--root", root, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "exported 2 sessions and 1 project of user 'alice'" in r.stderr
    logs = read_logs(root)
    with tarfile.open(out) as tar:
        names = tar.getnames()
        files = {n: tar.extractfile(n).read() for n in names}  # type: ignore[union-attr]
    assert sorted(names) == sorted(["manifest.json"] + [f"sessions/{sid}/log.jsonl" for sid in made["alice"]])
    for sid in made["alice"]:
        assert files[f"sessions/{sid}/log.jsonl"] == logs[sid]
    manifest = json.loads(files["manifest.json"])
    assert manifest["user"] == "alice" and [s["id"] for s in manifest["sessions"]] == made["alice"]
    assert [p["name"] for p in manifest["projects"]] == ["alice-work"]
    assert b"b1 secret" not in out.read_bytes() and b"single secret" not in out.read_bytes()
    extracted = tmp_path / "extracted"
    with tarfile.open(out) as tar:
        tar.extractall(extracted, filter="data")
    shown = run_cli("inspect", "--root", str(extracted), made["alice"][0])
    assert shown.returncode == 0 and json.loads(shown.stdout.splitlines()[0])["owner"] == "alice", shown.stderr
    again = run_cli("users", "export", "alice", "--root", root, "--out", str(out))
    assert again.returncode == 3 and again.stderr.count("\n") == 1 and "exists" in again.stderr
    # to stdout (not a terminal here), the same members
    import subprocess
    import sys

    from .conftest import ROOT
    piped = subprocess.run([sys.executable, "-m", "sessionlog_store", "users", "export", "bob", "--root", root],
                           capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
    assert piped.returncode == 0, piped.stderr
    with tarfile.open(fileobj=io.BytesIO(piped.stdout)) as tar:
        assert tar.extractfile(f"sessions/{made['bob'][0]}/log.jsonl").read() == logs[made["bob"][0]]  # type: ignore[union-attr]


async def test_transfer_appends_a_record_and_the_server_shows_them_to_the_new_owner_only(root, tmp_path, nursery):
    from .test_users import TOKENS, start_users, user
    made = await populate(root, tmp_path)
    before = read_logs(root)
    assert run_cli("users", "transfer", "alice", "--to", "bob", "--root", root, "--dry-run").returncode == 0
    assert read_logs(root) == before, "a dry run changes nothing"
    r = run_cli("users", "transfer", "alice", "--to", "bob", "--root", root)
    assert r.returncode == 0, r.stderr
    assert "transferred 2 sessions and 1 project of user 'alice' to 'bob'" in r.stdout
    after = read_logs(root)
    for sid in made["alice"]:
        assert after[sid].startswith(before[sid]), "appended, never edited"
        last = json.loads(after[sid].splitlines()[-1])
        assert (last["type"], last["owner"], last["previous"]) == ("owner_changed", "bob", "alice")
    with open(os.path.join(root, "projects", "log.jsonl"), "rb") as f:
        last = json.loads(f.read().splitlines()[-1])
    assert (last["type"], last["owner"]) == ("project_owner_changed", "bob")
    assert run_cli("verify", "--root", root).returncode == 0, "the new records replay as the checkpoint says"
    # the single user's sessions to alice: a store that moves from --auth token to many users
    assert run_cli("users", "transfer", "", "--to", "alice", "--root", root).returncode == 0
    assert TOKENS  # (the tokens file start_users writes)
    server = await start_users(nursery, root, tmp_path)
    async with user(server, "bob") as bob, user(server, "alice") as alice:
        rows = (await bob.request("list_sessions"))["rows"]
        assert sorted(r["id"] for r in rows) == sorted(made["alice"] + made["bob"])
        a1 = next(r for r in rows if r["title"] == "a1")
        assert a1["project"]["name"] == "alice-work"
        assert [p["name"] for p in (await bob.request("list_projects"))["projects"]] == ["Home", "alice-work"]
        loaded = await bob.request("load_session", session_id=a1["id"])
        assert [m["content"] for m in loaded["messages"]] == ["a1 secret", "a1 answer"]
        assert [r["id"] for r in (await alice.request("list_sessions"))["rows"]] == made[""]
        e = await alice.request("list_projects")
        assert [p["name"] for p in e["projects"]] == ["Home"]


async def test_delete_removes_the_users_sessions_and_projects_through_tombstones(root, tmp_path):
    made = await populate(root, tmp_path)
    dry = run_cli("users", "delete", "alice", "--root", root, "--dry-run")
    assert dry.returncode == 0 and "would delete 2 sessions and 1 project" in dry.stdout
    assert set(read_logs(root)) == {*made["alice"], *made["bob"], *made[""]}
    r = run_cli("users", "delete", "alice", "--root", root)
    assert r.returncode == 0, r.stderr
    assert "deleted 2 sessions and 1 project of user 'alice'" in r.stdout
    assert set(read_logs(root)) == {*made["bob"], *made[""]}, "alice's folders are gone"
    assert run_cli("verify", "--root", root).returncode == 0
    listed = lines_of(run_cli("users", "list", "--root", root).stdout)
    assert set(listed) == {'""', '"bob"'}
    gone = run_cli("users", "delete", "alice", "--root", root)
    assert gone.returncode == 3 and gone.stderr.count("\n") == 1 and "owns no session" in gone.stderr
    async with open_session_store(root) as store:
        assert not store.projects.owned("alice") and {m.owner for m in store.registry.rows.values()} == {"bob", ""}


async def test_bad_users_a_locked_store_and_a_damaged_log_are_one_line_each(root, tmp_path):
    made = await populate(root, tmp_path)
    for bad in (" alice", "alice\n", "ali\u200bce"):
        r = run_cli("users", "delete", bad, "--root", root)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not a user id" in r.stderr, (bad, r.stderr)
    same = run_cli("users", "transfer", "alice", "--to", "alice", "--root", root)
    assert same.returncode == 2 and same.stderr.count("\n") == 1
    assert run_cli("users", "list", "--root", str(tmp_path / "nowhere")).returncode == 3
    async with open_session_store(root):  # a running server holds the lock
        r = run_cli("users", "list", "--root", root)
        assert r.returncode == 3 and r.stderr.count("\n") == 1 and "in use" in r.stderr, r.stderr
    # damage in alice's second session's last record: read-only, named, not transferred
    damaged = made["alice"][1]
    path = os.path.join(root, "sessions", damaged, "log.jsonl")
    data = bytearray(Path(path).read_bytes())
    data[-10] ^= 0x01
    Path(path).write_bytes(bytes(data))
    r = run_cli("users", "transfer", "alice", "--to", "bob", "--root", root)
    assert r.returncode == 1, r.stderr
    assert f"session {damaged} not transferred" in r.stderr and "1 session and 1 project" in r.stdout
    async with open_session_store(root) as store:
        assert store.get_meta(made["alice"][0]).owner == "bob" and store.get_meta(damaged).owner == "alice"


async def test_a_users_streams_are_listed_exported_and_deleted_with_them(root, tmp_path):
    """The generic namespace's streams (docs/HTTP.md) are a user's data too:
    `users list` counts them, `export` carries their logs, `delete` removes
    them (a fork and its source both), and another user's stay."""
    from sessionlog_store.server.local.streamspace import open_stream_space
    made = await populate(root, tmp_path)
    async with open_stream_space(root) as space:
        kw = dict(content_type="text/plain", ttl=None, expires_at=None, closed=False)
        await space.create("alice", "notes", data=b"alice's notes", **kw)
        await space.create("alice", "notes-fork", data=b"", forked_from="notes", **kw)
        await space.create("bob", "notes", data=b"bob's notes", **kw)
        alice_logs = {st.log_id for st in space.logs.values() if st.owner == "alice"}
    listed = lines_of(run_cli("users", "list", "--root", root).stdout)
    assert listed['"alice"'].endswith("\t2 streams") and listed['"bob"'].endswith("\t1 stream")
    out = tmp_path / "alice.tar"
    r = run_cli("users", "export", "alice", "--root", root, "--out", str(out))
    assert r.returncode == 0 and "2 sessions, 1 project and 2 streams" in r.stderr, r.stderr
    with tarfile.open(out) as t:
        names = set(t.getnames())
        manifest = json.load(t.extractfile("manifest.json"))  # type: ignore[arg-type]
        logs = {n: t.extractfile(n).read() for n in names if n.startswith("streams/")}  # type: ignore[union-attr]
    assert {f"streams/sessions/{i}/log.jsonl" for i in alice_logs} == set(logs)
    assert sorted(s["name"] for s in manifest["streams"]) == ["notes", "notes-fork"]
    assert any(b"YWxpY2UncyBub3Rlcw==" in data for data in logs.values()), "the data, as logged (base64)"
    r = run_cli("users", "delete", "alice", "--root", root)
    assert r.returncode == 0 and "deleted 2 sessions, 1 project and 2 streams" in r.stdout, r.stdout + r.stderr
    streams_dir = Path(root) / "streams" / "sessions"
    assert not alice_logs & {p.name for p in streams_dir.iterdir()}, "alice's stream logs are gone"
    async with open_stream_space(root) as space:
        assert sorted((st.owner, st.name) for st in space.logs.values()) == [("bob", "notes")]
    assert set(read_logs(root)) == {*made["bob"], *made[""]}
