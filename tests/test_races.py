"""Ordinary races through the public API (issue 11, items 2 and 4): a delete
racing snapshot and checkpoint writes, loads racing appends, a resume by
`after_seq` racing a stream. Real files, real fsync, no injected delay."""
from __future__ import annotations

import os
import random

import msgspec
import trio

from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, read_log
from sessionlog_store.eventstore.record import scan
from sessionlog_store.projections.rebuild import verify
from sessionlog_store.projections.recovery import fold_until
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

ENC = msgspec.json.Encoder()


def replay_at(root: str, sid: str, seq: int):  # type: ignore[no-untyped-def]
    data = read_log(OS_FILES, root, sid)
    return fold_until(scan(sid, data, expect_seq=1).records, data, seq)


async def test_deletes_racing_snapshot_and_checkpoint_writes_never_break_the_store(root):
    config = StoreConfig(snapshot_interval=0.0, checkpoint_interval=0.0, progress_interval=0.001)
    rng = random.Random(7)
    deleted = 0
    async with open_session_store(root, config=config) as store:
        async def one(k: int) -> None:
            nonlocal deleted
            meta, _ = await store.create_session(first_message=f"hello {k}")
            async with store.inflight(meta.id) as msg:
                msg.write("a reply " * rng.randint(1, 50))
                await trio.sleep(rng.choice([0, 0, 0.001, 0.002]))
            # About one snapshot debounce after the reply: the snapshot of the
            # finished reply and the checkpoint are being written right now.
            for _ in range(rng.randint(0, 6)):
                await trio.sleep(0)
            await trio.sleep(rng.choice([0, 0, 0.0005, 0.001, 0.003]))
            assert await store.delete_session(meta.id)
            deleted += 1
        for _ in range(60):
            async with trio.open_nursery() as n:
                for k in range(5):
                    n.start_soon(one, k)
        assert store.es.broken is None
    assert deleted == 300
    assert os.listdir(os.path.join(root, SESSIONS_DIR)) == [], "nothing is left behind"
    n, problems = verify(OS_FILES, root)
    assert (n, problems) == (0, [])


async def test_verify_reports_an_orphan_folder_and_a_start_removes_one_holding_only_temp_files(root):
    async with open_session_store(root) as store:
        keep, _ = await store.create_session(first_message="keep me")
    base = os.path.join(root, SESSIONS_DIR)
    os.mkdir(os.path.join(base, "orphan-cache"))
    with open(os.path.join(base, "orphan-cache", "snapshot.json.tmp"), "w") as f:
        f.write("{}")
    os.mkdir(os.path.join(base, "orphan-snap"))  # a snapshot without its log may be the last copy: kept
    with open(os.path.join(base, "orphan-snap", "snapshot.json"), "w") as f:
        f.write("{}")
    os.mkdir(os.path.join(base, "orphan-kept"))
    with open(os.path.join(base, "orphan-kept", "log.jsonl.corrupt-1"), "w") as f:
        f.write("damaged bytes someone may want")
    _, problems = verify(OS_FILES, root)
    assert sorted(p.session_id for p in problems) == ["orphan-cache", "orphan-kept", "orphan-snap"]
    assert all("orphan folder" in p.what for p in problems)
    async with open_session_store(root) as store:
        assert [r["id"] for r in store.list_sessions()[0]] == [keep.id]
        assert store.recovery is not None and any("orphan-kept" in o for o in store.recovery.orphans)
    assert sorted(os.listdir(base)) == sorted([keep.id, "orphan-kept", "orphan-snap"])
    assert os.path.exists(os.path.join(base, "orphan-kept", "log.jsonl.corrupt-1"))


async def test_every_load_racing_appends_equals_a_replay_of_the_log_at_its_seq(root):
    """Concurrent renames, messages and loads (no state cache: every load reads the
    log): each load holds every record appended before it was called and
    equals a replay of the log at its seq."""
    config = StoreConfig(state_cache=0, checkpoint_interval=3600, snapshot_interval=3600)
    loads: list[tuple[str, int, int, bytes]] = []
    async with open_session_store(root, config=config) as store:
        sids = [(await store.create_session(first_message=f"s{k}"))[0].id for k in range(48)]

        async def writer(k: int) -> None:
            rng = random.Random(k)
            for i in range(40):
                if i % 2:
                    await store.update_session(rng.choice(sids), title=f"title {k}.{i}")
                else:  # a message: a record whose effect no later record hides
                    await store.append_message(rng.choice(sids), f"message {k}.{i}")

        async def loader(k: int) -> None:
            rng = random.Random(100 + k)
            for _ in range(20):
                sid = rng.choice(sids)
                before = store.es.last_seq(sid)
                state = await store.load_session(sid)
                loads.append((sid, before, state.seq, ENC.encode([state.meta, state.head,
                                                                  list(state.messages.values())])))
                await trio.sleep(0)
        async with trio.open_nursery() as n:
            for k in range(24):
                n.start_soon(writer, k)
            for k in range(8):
                n.start_soon(loader, k)
    assert len(loads) == 160
    for sid, before, seq, got in loads:
        assert seq >= before, "a load misses a record appended before it was called"
        st = replay_at(root, sid, seq)
        assert got == ENC.encode([st.meta, st.head, list(st.messages.values())]), \
            f"a load of {sid} at seq {seq} differs from a replay of the log"


async def test_resume_by_after_seq_racing_a_stream_gets_the_right_offset(root):
    config = StoreConfig(progress_interval=0.001, checkpoint_interval=3600, snapshot_interval=3600)
    seen: list[tuple[int, int]] = []
    async with open_session_store(root, config=config) as store:
        meta, _ = await store.create_session(first_message="stream")
        async with store.inflight(meta.id) as msg:
            for i in range(150):
                msg.write(f"<{i}>")
                await trio.sleep(0.0005 * (i % 4))
                seq = store.es.last_seq(meta.id)
                sub = await store.subscribe(meta.id, msg.msg_id, after_seq=seq)
                async with sub:
                    first = sub._recv.receive_nowait()
                seen.append((seq, first.offset))
    for seq, offset in seen:
        m = replay_at(root, meta.id, seq).messages[msg.msg_id]
        assert offset == len(m.content), f"after_seq={seq}: offset {offset}, the log says {len(m.content)}"
