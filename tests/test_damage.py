"""Torn tails are repaired and reported; damage in the middle quarantines one
session and is named by `verify`; the rest of the store keeps working."""
from __future__ import annotations

import glob
import os

import pytest
import trio

from sessionlog_store.eventstore.errors import SessionReadOnly
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.server.stores import open_session_store

from .conftest import run_cli


async def make_store(root: str, n: int = 3) -> list[str]:
    async with open_session_store(root) as store:
        ids = []
        for i in range(n):
            meta, _ = await store.create_session(first_message=f"first {i}")
            await store.append_message(meta.id, f"second {i}")
            ids.append(meta.id)
    os.unlink(os.path.join(root, "index.json"))  # so damage is met by a full replay too
    return ids


TAILS = {
    "no newline": lambda good: good[:-1],
    "half a record": lambda good: good[: len(good) // 2],
    "zeros": lambda good: b"\x00" * 512,
    "garbage line": lambda good: b"not json at all\n",
    "zeros after a half record": lambda good: good[:20] + b"\x00" * 100,
}


@pytest.mark.parametrize("kind", list(TAILS))
async def test_torn_tail_is_truncated_reported_and_kept(root, kind):
    ids = await make_store(root)
    path = log_path(root, ids[0])
    with open(path, "rb") as f:
        good = f.read()
    tail = TAILS[kind](good.splitlines(keepends=True)[-1])
    with open(path, "ab") as f:
        f.write(tail)
    with trio.fail_after(10):
        async with open_session_store(root) as store:
            rep = store.recovery
            assert rep is not None and [t.session_id for t in rep.torn] == [ids[0]]
            assert rep.torn[0].kept_bytes == len(tail)
            with open(rep.torn[0].copy_path, "rb") as f:
                assert f.read() == tail
            with open(path, "rb") as f:
                assert f.read() == good
            msgs = await store.get_messages(ids[0])
            assert [m.content for m in msgs] == ["first 0", "second 0"]
            await store.append_message(ids[0], "after repair")
    assert run_cli("verify", "--root", root).returncode == 0


async def test_flipped_byte_quarantines_one_session_and_verify_names_it(root):
    ids = await make_store(root)
    path = log_path(root, ids[1])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    i = data.index(b"first 1")
    data[i] ^= 0x20
    with open(path, "wb") as f:
        f.write(data)
    v = run_cli("verify", "--root", root)
    assert v.returncode == 1
    assert f"{ids[1]} line 2: corrupt record: checksum mismatch" in v.stdout
    with trio.fail_after(10):
        async with open_session_store(root) as store:
            rep = store.recovery
            assert rep is not None and [(c.session_id, c.line_no) for c in rep.quarantined] == [(ids[1], 2)]
            with open(path, "rb") as f:
                assert f.read() == bytes(data), "a corrupt log is never truncated automatically"
            with pytest.raises(SessionReadOnly):
                await store.append_message(ids[1], "refused")
            assert ids[1] in store.registry  # still listed, readable up to the damage
            await store.append_message(ids[0], "others work")
            await store.append_message(ids[2], "others work")
    r = run_cli("repair", "--root", root, ids[1])
    assert r.returncode == 0 and "line 2" in r.stdout
    assert glob.glob(path + ".corrupt-*")
    assert run_cli("verify", "--root", root).returncode == 0
    async with open_session_store(root) as store:
        await store.append_message(ids[1], "writable again")


async def test_corrupt_checkpoint_falls_back_to_full_replay(root):
    ids = await make_store(root)
    async with open_session_store(root):
        pass
    with open(os.path.join(root, "index.json"), "wb") as f:
        f.write(b'{"version":1,"sessions":{"x": garbage')
    assert "index.json" in run_cli("verify", "--root", root).stdout
    async with open_session_store(root) as store:
        rep = store.recovery
        assert rep is not None and rep.checkpoint.startswith("corrupt")
        assert rep.full_replays == len(ids) and len(store.registry) == len(ids)


async def test_stale_checkpoint_row_is_caught_by_verify_and_ignored_at_start(root):
    ids = await make_store(root)
    async with open_session_store(root):
        pass
    # A checkpoint that claims more than the log holds (e.g. copied from elsewhere).
    import msgspec
    from sessionlog_store.projections.checkpoint import IndexCheckpoint
    path = os.path.join(root, "index.json")
    ck = msgspec.json.decode(open(path, "rb").read(), type=IndexCheckpoint)
    e = ck.sessions[ids[0]]
    e.end += 10_000
    e.seq += 5
    open(path, "wb").write(msgspec.json.encode(ck))
    v = run_cli("verify", "--root", root)
    assert v.returncode == 1 and f"{ids[0]}: index.json is ahead of the log" in v.stdout
    async with open_session_store(root) as store:
        assert store.recovery is not None and store.recovery.full_replays == 1
        assert store.registry.get(ids[0]).message_count == 2
