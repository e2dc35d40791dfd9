"""A running message's progress folds as a length update (issue 29): its
deltas are kept beside its snapshot until something reads `messages`. The
state read after every record (each progress folded into the snapshot at
once, as before) equals the state read only at the end or at random
points: text at the end and rewound, token counts, trees, a finalize, a
delete."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, MessageProgress, SessionCreated
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.session import SessionState
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store

ENC = msgspec.json.Encoder()

step = st.one_of(
    st.tuples(st.just("text"), st.integers(0, 2), st.text(min_size=1, max_size=8)),
    st.tuples(st.just("rewind"), st.integers(0, 2), st.integers(0, 5), st.text(max_size=4)),
    st.tuples(st.just("tokens"), st.integers(0, 2), st.integers(0, 99)),
    st.tuples(st.just("tree"), st.integers(0, 2), st.integers(0, 9)),
    st.tuples(st.just("finish"), st.integers(0, 2)),
    st.tuples(st.just("create"), st.integers(0, 2)),
)


def records(steps: list[tuple]) -> list[Record]:  # type: ignore[type-arg]
    out = [Record(1, 1.0, SessionCreated(session_id="s", title="t"))]
    length: dict[str, int] = {}
    for s in steps:
        mid = f"m{s[1]}"
        seq, ts = len(out) + 1, float(len(out) + 1)
        if s[0] == "create":
            ev: object = MessageCreated(msg_id=mid, role="assistant", kind="llm_reply", status="pending")
            length[mid] = 0
        elif s[0] == "text":
            ev = MessageProgress(msg_id=mid, content_delta=s[2], offset=length.get(mid, 0))
            length[mid] = length.get(mid, 0) + len(s[2])
        elif s[0] == "rewind":
            at = max(0, length.get(mid, 0) - s[2])
            ev = MessageProgress(msg_id=mid, content_delta=s[3], offset=at)
            length[mid] = at + len(s[3])
        elif s[0] == "tokens":
            ev = MessageProgress(msg_id=mid, offset=length.get(mid, 0), partial_tokens_used={"input": 1, "output": s[2]})
        elif s[0] == "tree":
            ev = MessageProgress(msg_id=mid, offset=length.get(mid, 0), context_tree={"n": s[2]})
        else:
            ev = MessageFinalized(msg_id=mid, status="done")
        out.append(Record(seq, ts, ev))  # type: ignore[arg-type]
    return out


def key(state: SessionState) -> bytes:
    return ENC.encode([state.meta, state.seq, sorted(state.messages.values(), key=lambda m: m.msg_id)])


@settings(max_examples=300, deadline=None)
@given(st.lists(step, max_size=60), st.lists(st.booleans(), max_size=60))
def test_progress_read_at_any_point_folds_the_same(steps: list[tuple], reads: list[bool]) -> None:  # type: ignore[type-arg]
    recs = records(steps)
    each, lazy, sometimes = SessionState(), SessionState(), SessionState()
    for i, r in enumerate(recs):
        each.apply(r, i)
        each.messages  # (settled at every record: the fold as it was)
        lazy.apply(r, i)
        sometimes.apply(r, i)
        if i < len(reads) and reads[i]:
            sometimes.messages
    assert key(lazy) == key(each) == key(sometimes)


def test_a_growing_reply_keeps_its_text_tokens_and_tree_until_read() -> None:
    state = SessionState()
    state.apply(Record(1, 1.0, SessionCreated(session_id="s", title="t")))
    state.apply(Record(2, 2.0, MessageCreated(msg_id="m", role="assistant", kind="llm_reply", status="pending")))
    state.apply(Record(3, 3.0, MessageProgress(msg_id="m", content_delta="ab", offset=0)))
    state.apply(Record(4, 4.0, MessageProgress(msg_id="m", content_delta="cd", offset=2,
                                               partial_tokens_used={"input": 1, "output": 2})))
    state.apply(Record(5, 5.0, MessageProgress(msg_id="m", content_delta="e", offset=4, context_tree={"a": 1})))
    m = state.messages["m"]
    assert (m.content, m.status, m.seq, m.last_update_at) == ("abcde", "running", 5, 5.0)
    assert m.metadata == {"partial_tokens_used": {"input": 1, "output": 2}, "context_tree": {"a": 1}}



@asynccontextmanager
async def running(store: Any, sids: list[str]) -> AsyncIterator[tuple[dict[str, Any], dict[str, str | None]]]:
    """A running message in each session (their handles), ended when the
    block is left; then how each ended (its abort reason, None if not)."""
    msgs: dict[str, Any] = {}
    ended: dict[str, str | None] = {}
    done = trio.Event()

    async def one(sid: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with store.inflight(sid) as msg:
            msgs[sid] = msg
            task_status.started()
            await done.wait()
        ended[sid] = msg.abort_reason

    async with trio.open_nursery() as n:
        for sid in sids:
            await n.start(one, sid)
        try:
            yield msgs, ended
        finally:
            done.set()


ONE_SLOT = StoreConfig(progress_slots=1, progress_interval=3600, stall_timeout=3600)  # (ticks by hand)


async def test_one_tick_appends_every_message_and_a_refused_one_stops_only_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The saver's tick is one append of all its messages' records
    (append_progress): a lone surrogate in one is written scrubbed, a
    message of a session deleted meanwhile ends "session deleted", and the
    others of the same tick are all written, each in order."""
    root = str(tmp_path / "s")
    async with open_session_store(root, config=ONE_SLOT) as store:
        sids = [(await store.create_session(first_message="go"))[0].id for _ in range(4)]
        async with running(store, sids) as (msgs, ended):
            for i, sid in enumerate(sids):
                msgs[sid].write(f"first {i} ")
            msgs[sids[1]].write(json.loads('"\\ud83d"') + " half")
            store.saver.flush_slot(0)
            await store.delete_session(sids[2])
            for i, sid in enumerate(sids):
                msgs[sid].write(f"then {i}")
            store.saver.flush_slot(0)
        assert ended[sids[2]] == "session deleted"
    async with open_session_store(root) as store:
        texts = {sid: (await store.load_session(sid)).messages[msgs[sid].msg_id].content
                 for sid in sids if sid != sids[2]}
    assert texts == {sids[0]: "first 0 then 0", sids[1]: "first 1 \ufffd halfthen 1", sids[3]: "first 3 then 3"}


async def test_a_listener_that_raises_ends_only_its_message(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A listener's bug on one message's record ends that message
    ("unwritable progress", as one append each did); the tick's other
    messages are appended and told, and the saver goes on."""
    async with open_session_store(str(tmp_path / "s"), config=ONE_SLOT) as store:
        sids = [(await store.create_session(first_message="go"))[0].id for _ in range(3)]
        told: list[str] = []

        def bad(sid: str, rec: Record, end: int) -> None:
            if sid == sids[1] and type(rec.event) is MessageProgress:
                raise RuntimeError("a listener's bug")
            told.append(sid)

        async with running(store, sids) as (msgs, ended):
            store.es.listeners.append(bad)
            for sid in sids:
                msgs[sid].write("text")
            store.saver.flush_slot(0)
            store.es.listeners.remove(bad)
        assert ended == {sids[0]: None, sids[1]: "unwritable progress", sids[2]: None}
        assert told == [sids[0], sids[2]] and store.saver.failed is None
