"""DESIGN invariant 2: live state == full replay == checkpoint/snapshot + tail replay."""
from __future__ import annotations

import tempfile

import msgspec
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, MessageProgress
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.recovery import load_session_state, recover_registry
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

ENC = msgspec.json.Encoder()

op = st.one_of(
    st.tuples(st.just("create"), st.booleans()),
    st.tuples(st.just("user"), st.integers(0, 9), st.text(max_size=30)),
    st.tuples(st.just("start"), st.integers(0, 9)),
    st.tuples(st.just("progress"), st.integers(0, 9), st.text(min_size=1, max_size=20)),
    st.tuples(st.just("finish"), st.integers(0, 9), st.sampled_from(["done", "error", "aborted"])),
    st.tuples(st.just("rename"), st.integers(0, 9), st.text(min_size=1, max_size=10)),
    st.tuples(st.just("flags"), st.integers(0, 9), st.booleans(), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 9)),
    st.tuples(st.just("checkpoint"),),
    st.tuples(st.just("snapshot"), st.integers(0, 9)),
)


def state_key(state) -> bytes:  # type: ignore[no-untyped-def]
    return ENC.encode([state.meta, state.head, state.seq, state.end, list(state.messages.values())])


async def run_ops(root: str, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    config = StoreConfig(checkpoint_interval=3600, snapshot_interval=3600)
    async with open_session_store(root, config=config) as store:
        sids: list[str] = []
        running: dict[str, dict[str, int]] = {}
        for o in ops:
            kind = o[0]
            if kind == "create":
                meta, _ = await store.create_session(first_message="hello" if o[1] else None)
                sids.append(meta.id)
                running[meta.id] = {}
                continue
            if kind == "checkpoint":
                await store.write_checkpoint()
                continue
            alive = [s for s in sids if s in store.registry]
            if not alive:
                continue
            sid = alive[o[1] % len(alive)]
            if kind == "user":
                await store.append_message(sid, o[2])
            elif kind == "start":
                mid = f"m{len(running[sid])}x{o[1]}"
                await store.es.append(sid, MessageCreated(msg_id=mid, role="assistant", kind="llm_reply",
                                                          status="running"))
                running[sid][mid] = 0
            elif kind == "progress" and running[sid]:
                mid = sorted(running[sid])[0]
                store.es.append_nowait(sid, MessageProgress(msg_id=mid, content_delta=o[2],
                                                            offset=running[sid][mid]))
                running[sid][mid] += len(o[2])
            elif kind == "finish" and running[sid]:
                mid = sorted(running[sid])[0]
                del running[sid][mid]
                await store.es.append(sid, MessageFinalized(msg_id=mid, status=o[2]))
            elif kind == "rename":
                await store.rename_session(sid, o[2] if o[2].strip() else "t")
            elif kind == "flags":
                await store.update_session(sid, pinned=o[2], archived=o[3])
            elif kind == "delete":
                await store.delete_session(sid)
            elif kind == "snapshot":
                await store.load_session(sid)
                await store.write_snapshot(sid)
        await store.es.flush()
        store.registry.check()

        live_rows = {sid: ENC.encode(m) for sid, m in store.registry.rows.items()}
        full, _, rep_full = recover_registry(OS_FILES, store.root, use_checkpoint=False, repair=False)
        ckpt, _, rep_ckpt = recover_registry(OS_FILES, store.root, use_checkpoint=True, repair=False)
        assert {s: ENC.encode(m) for s, m in full.rows.items()} == live_rows
        assert {s: ENC.encode(m) for s, m in ckpt.rows.items()} == live_rows
        assert rep_full.full_replays == len(live_rows)
        for sid in live_rows:
            live = state_key(await store.load_session(sid))
            replayed, used = load_session_state(OS_FILES, store.root, sid, use_snapshot=False)
            assert state_key(replayed) == live
            from_snap, used = load_session_state(OS_FILES, store.root, sid, use_snapshot=True)
            assert state_key(from_snap) == live


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=40))
def test_live_equals_full_replay_equals_checkpoint_plus_tail(ops):
    with tempfile.TemporaryDirectory() as d:
        trio.run(run_ops, d, [("create", True), *ops])


def test_checkpoint_serves_startup_with_tail_replay_only(tmp_path):
    async def main() -> None:
        root = str(tmp_path)
        async with open_session_store(root) as store:
            for _ in range(5):
                meta, _ = await store.create_session(first_message="x")
        async with open_session_store(root) as store:
            rep = store.recovery
            assert rep is not None and rep.checkpoint == "loaded"
            assert rep.tail_replays == 5 and rep.full_replays == 0 and rep.records == 0
    trio.run(main)
