"""In-flight artifacts (spec/inflight-state.md): placeholders, the throttled
saver, finalize, stop, retry, watchdog, subscriptions with exact resume."""
from __future__ import annotations

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessionlog_store.eventstore.events import MessageProgress
from sessionlog_store.eventstore.local.log import log_path
from sessionlog_store.eventstore.record import scan
from sessionlog_store.projections.lifecycle import MESSAGE_TRANSITIONS, IllegalTransition, can_move
from sessionlog_store.server.domain.errors import BadRequest, Conflict
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.stores import open_session_store


def records(root: str, sid: str):  # type: ignore[no-untyped-def]
    with open(log_path(root, sid), "rb") as f:
        return scan(sid, f.read(), expect_seq=1).records


@pytest.fixture
async def store(root):
    async with open_session_store(root) as s:
        yield s


def test_lifecycle_table():
    assert can_move("pending", "running") and can_move("running", "done")
    assert not can_move("done", "running") and not can_move("aborted", "done")
    assert all(not MESSAGE_TRANSITIONS[t] for t in ("done", "error", "aborted"))


@pytest.mark.parametrize("kind", ["llm_reply", "tool_call", "agentic_fn", "task_spawn", "merge"])
async def test_placeholder_is_durable_before_the_work_starts(store, kind):
    meta, _ = await store.create_session(first_message="go")
    async with store.inflight(meta.id, kind=kind, role="assistant" if kind == "llm_reply" else "tool") as msg:
        assert store.es.durable_seq(meta.id) >= store.es.last_seq(meta.id) - 1
        await store.es.flush()  # a reader of the file waits for the log writer (journal mode)
        recs = records(store.root, meta.id)
        created = [r.event for r in recs if getattr(r.event, "msg_id", None) == msg.msg_id]
        assert created and created[0].status == "running" and created[0].kind == kind
        assert created[0].started_at is not None
        msg.write("partial")
        msg.set_tree({"fn": kind, "children": []})
        msg.add_tokens(input=3, output=5)
    m = (await store.load_session(meta.id)).messages[msg.msg_id]
    assert m.status == "done" and m.content == "partial"
    assert m.metadata["context_tree"] == {"fn": kind, "children": []}
    assert m.metadata["partial_tokens_used"] == {"input": 3, "output": 5} and m.tokens == {"input": 3, "output": 5}
    assert m.last_update_at >= m.started_at


async def test_throttle_writes_about_one_progress_record_per_interval(root, autojump_clock):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="go")
        async with store.inflight(meta.id) as msg:
            for i in range(200):  # 10 s of tokens at 20/s
                assert msg.write(f"t{i} ") is None  # synchronous: never awaits, never blocks
                await trio.sleep(0.05)
    # Virtual time runs ahead of the committer's real worker thread here, so
    # count the records once the store has committed everything and closed.
    progress = [r for r in records(root, meta.id) if isinstance(r.event, MessageProgress)]
    assert 38 <= len(progress) <= 42, len(progress)  # 10 s / 250 ms
    async with open_session_store(root) as store:
        m = (await store.load_session(meta.id)).messages[msg.msg_id]
        assert m.status == "done" and m.content == "".join(f"t{i} " for i in range(200))
    offsets = [p.event.offset for p in progress]
    assert offsets == sorted(offsets) and offsets[0] == 0


async def test_exception_finalizes_error_and_cancellation_aborted(store):
    meta, _ = await store.create_session(first_message="go")
    with pytest.raises(ZeroDivisionError):
        async with store.inflight(meta.id) as msg:
            msg.write("before")
            1 / 0  # noqa: B018
    m = (await store.load_session(meta.id)).messages[msg.msg_id]
    assert m.status == "error" and "ZeroDivisionError" in (m.error or "") and m.content == "before"
    with trio.move_on_after(0.05):
        async with store.inflight(meta.id) as msg2:
            msg2.write("partial")
            await trio.sleep_forever()
    m2 = (await store.load_session(meta.id)).messages[msg2.msg_id]
    assert m2.status == "aborted" and m2.content == "partial"
    assert m2.metadata["aborted_reason"] == "server shutdown"
    assert store.get_meta(meta.id).status == "idle"


async def test_stop_aborts_with_reason_and_retry_makes_a_sibling_branch(store):
    meta, user_id = await store.create_session(first_message="go")
    async with trio.open_nursery() as n:
        started = trio.Event()
        holder = {}

        async def produce() -> None:
            async with store.inflight(meta.id) as msg:
                holder["id"] = msg.msg_id
                msg.write("half an ans")
                started.set()
                await trio.sleep_forever()
        n.start_soon(produce)
        await started.wait()
        assert store.stop(meta.id, holder["id"]) is True
    old = (await store.load_session(meta.id)).messages[holder["id"]]
    assert old.status == "aborted" and old.metadata["aborted_reason"] == "stopped by user"
    assert old.content == "half an ans"
    assert store.stop(meta.id, holder["id"]) is False
    async with store.retry(meta.id, holder["id"]) as again:
        again.write("a full answer")
    state = await store.load_session(meta.id)
    assert state.head == again.msg_id
    assert state.messages[again.msg_id].parent_id == old.parent_id == user_id
    assert [m.msg_id for m in state.branch()] == [user_id, again.msg_id]
    assert state.messages[holder["id"]].content == "half an ans"  # the old branch stays readable
    with pytest.raises(Conflict):
        await store.retry_target(meta.id, user_id)


async def test_watchdog_aborts_a_silent_producer(root, mock_clock):
    mock_clock.autojump_threshold = 0.01  # jump only when the worker threads are idle too
    async with open_session_store(root, config=StoreConfig(stall_timeout=5)) as store:
        meta, _ = await store.create_session(first_message="go")
        async with store.inflight(meta.id) as msg:
            t0 = trio.current_time()
            msg.write("then silence")
            await trio.sleep(3600)
        m = (await store.load_session(meta.id)).messages[msg.msg_id]
        assert m.status == "aborted" and m.metadata["aborted_reason"] == "stalled"
        assert trio.current_time() - t0 < 30, "aborted after the stall timeout, not after the hour"


async def test_illegal_transition_raises_and_changes_nothing(store):
    meta, user_id = await store.create_session(first_message="go")
    async with store.inflight(meta.id) as msg:
        msg.write("x")
    before = records(store.root, meta.id)
    with pytest.raises(IllegalTransition):
        await store.finalize_message(meta.id, msg.msg_id, "aborted")
    assert records(store.root, meta.id) == before


async def test_bad_inflight_kind_is_refused(store):
    meta, _ = await store.create_session(first_message="go")
    with pytest.raises(BadRequest):
        async with store.inflight(meta.id, kind="teleport"):
            pass


# -- subscriptions ----------------------------------------------------------------

async def collect(sub, into: list[str], have: str) -> str:  # type: ignore[no-untyped-def]
    text = have
    async for u in sub:
        assert u.offset == len(text), (u.offset, len(text))
        text += u.content_delta
        into.append(u.status)
    return text


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(deltas=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=30),
       cut=st.integers(0, 30), pick=st.floats(0, 1), use_seq=st.booleans())
def test_resuming_subscriber_gets_exactly_the_missing_part(tmp_path_factory, deltas, cut, pick, use_seq):
    root = str(tmp_path_factory.mktemp("s"))
    cut = min(cut, len(deltas))

    async def main() -> None:
        async with open_session_store(root, config=StoreConfig(progress_interval=0.01)) as store:
            meta, _ = await store.create_session(first_message="go")
            holder = {}
            ready, go_on = trio.Event(), trio.Event()

            async def producer() -> None:
                async with store.inflight(meta.id) as msg:
                    holder["msg"] = msg
                    for i, d in enumerate(deltas[:cut]):
                        msg.write(d)
                        if i % 3 == 0:
                            await trio.sleep(0.012)
                    ready.set()
                    await go_on.wait()
                    for i, d in enumerate(deltas[cut:]):
                        msg.write(d)
                        if i % 2 == 0:
                            await trio.sleep(0.004)

            with trio.fail_after(20):
                async with trio.open_nursery() as n:
                    n.start_soon(producer)
                    await ready.wait()
                    mid = holder["msg"].msg_id
                    await store.es.flush()
                    if use_seq:
                        # "I have the message as of seq S": fold the log to S to know what that is.
                        recs = [r for r in records(root, meta.id) if getattr(r.event, "msg_id", None) == mid]
                        seq = recs[int(pick * (len(recs) - 1))].seq
                        have = ""
                        for r in recs:
                            if r.seq <= seq and isinstance(r.event, MessageProgress):
                                have = have[: r.event.offset] + r.event.content_delta
                        sub = await store.subscribe(meta.id, mid, after_seq=seq)
                    else:
                        live = (await store.load_session(meta.id)).messages[mid].content
                        have = live[: int(len(live) * pick)]
                        sub = await store.subscribe(meta.id, mid, offset=len(have))
                    go_on.set()
                    statuses: list[str] = []
                    text = await collect(sub, statuses, have)
            m = (await store.load_session(meta.id)).messages[mid]
            assert m.status == "done" and statuses[-1] == "done"
            assert text == m.content == "".join(deltas)
    trio.run(main)


async def test_subscription_of_a_finished_message_is_served_from_the_log(root):
    async with open_session_store(root) as store:
        meta, _ = await store.create_session(first_message="go")
        async with store.inflight(meta.id) as msg:
            msg.write("hello world")
    async with open_session_store(root) as store:
        sub = await store.subscribe(meta.id, msg.msg_id, offset=6)
        got = [u async for u in sub]
        assert [(u.offset, u.content_delta, u.status) for u in got] == [(6, "world", "done")]
        assert got[0].durable_seq == store.es.last_seq(meta.id)
        with pytest.raises(BadRequest):
            await store.subscribe(meta.id, msg.msg_id, offset=99)


async def test_a_subscriber_that_falls_behind_is_dropped_not_waited_for(store):
    from sessionlog_store.server.domain.subscriptions import SUBSCRIBER_QUEUE
    meta, _ = await store.create_session(first_message="go")
    async with store.inflight(meta.id) as msg:
        sub = await store.subscribe(meta.id, msg.msg_id, offset=0)
        for i in range(SUBSCRIBER_QUEUE + 5):
            msg.write("x")
            store.saver.flush(msg)  # one update each, never read
        assert sub.dropped
    assert (await store.load_session(meta.id)).messages[msg.msg_id].content == "x" * (SUBSCRIBER_QUEUE + 5)


def test_the_saver_groups_its_slots_while_few_messages_run():
    """A wake-up flushes a group of slots (a divisor of them, so each slot
    keeps its phase) whose running messages number at most the target: from
    10,000 streams on 20 slots (500 a slot) every slot is its own wake-up."""
    from sessionlog_store.server.domain.inflight import ThrottledSaver
    saver = ThrottledSaver(None, slots=20, batch_target=500)  # type: ignore[arg-type]
    groups = {}
    for running in (20000, 10000, 7500, 5000, 3000, 2500, 1000, 100, 0):
        saver.active = {(str(k), "m"): None for k in range(running)}  # type: ignore[misc]
        groups[running] = saver.group()
    assert groups == {20000: 1, 10000: 1, 7500: 1, 5000: 2, 3000: 2, 2500: 4, 1000: 10, 100: 20, 0: 20}
    saver.batch_target = 0
    assert saver.group() == 1


async def test_a_late_group_wake_up_skips_no_slot(root, autojump_clock):
    """Review finding: a group's wake-up that came a little late took the
    next group's first slot along, which then waited almost two intervals
    and counted as late. Each message's records stay an interval apart."""
    from sessionlog_store.eventstore.record import Record
    step = 0.25 / 20
    seen: dict[str, list[float]] = {}
    first = trio.Event()

    def on_record(sid: str, rec: Record, end: int) -> None:
        if isinstance(rec.event, MessageProgress):
            seen.setdefault(rec.event.msg_id, []).append(trio.current_time())
            first.set()
    async with open_session_store(root) as store:
        store.es.listeners.append(on_record)
        metas = [(await store.create_session(first_message=f"go {k}"))[0] for k in range(3)]
        assert store.saver.group() == 20  # (three messages: one wake-up an interval)

        async def produce(sid: str) -> None:
            async with store.inflight(sid) as msg:
                for i in range(60):
                    msg.write(f"t{i} ")
                    await trio.sleep(0.05)

        async def late_wake_up() -> None:
            await first.wait()  # (the saver's first wake-up: its next ones come an interval apart)
            await trio.sleep_until(trio.current_time() + 2 * 0.25 - step / 10)
            autojump_clock.jump(1.5 * step)  # the group's wake-up comes 1.4 slots late
        async with trio.open_nursery() as n:
            for m in metas:
                n.start_soon(produce, m.id)
            n.start_soon(late_wake_up)
        assert store.saver.late_ticks == 0
    gaps = [b - a for times in seen.values() for a, b in zip(times, times[1:])]
    assert len(seen) == 3 and max(gaps) <= 0.25 + 2 * step, max(gaps)


@pytest.mark.parametrize("batch", [500, 0])
async def test_a_spread_saver_keeps_one_record_per_interval_per_message(root, autojump_clock, batch):
    """With the interval cut into slots, each message keeps its own phase:
    still about one record per interval each, never more than one behind.
    While few messages run, the saver wakes once for a group of slots (here
    all 50: each wake-up of the process costs CPU), one per slot with
    `progress_batch` 0; the records are the same."""
    from sessionlog_store.server.config import StoreConfig
    async with open_session_store(root, config=StoreConfig(progress_slots=50, progress_batch=batch)) as store:
        metas = [(await store.create_session(first_message=f"go {k}"))[0] for k in range(5)]
        async with trio.open_nursery() as n:
            async def produce(sid: str) -> None:
                async with store.inflight(sid) as msg:
                    for i in range(200):
                        msg.write(f"t{i} ")
                        await trio.sleep(0.05)
            for m in metas:
                n.start_soon(produce, m.id)
        assert store.saver.late_ticks == 0
        intervals = store.saver.ticks / 50
        assert store.saver.wakes == pytest.approx(intervals if batch == 500 else intervals * 50, abs=2)
    for m in metas:
        progress = [r for r in records(root, m.id) if isinstance(r.event, MessageProgress)]
        assert 38 <= len(progress) <= 42, len(progress)


async def test_running_sessions_do_not_push_idle_ones_out_of_the_state_cache(root):
    """Sessions with a producer here stay loaded and do not count against
    `state_cache` (counting them made each stream's start scan them all): the
    cache keeps `state_cache` idle sessions beside the running ones."""
    from sessionlog_store.server.config import StoreConfig
    async with open_session_store(root, config=StoreConfig(state_cache=1)) as store:
        running = [(await store.create_session(first_message=f"r{k}"))[0].id for k in range(5)]
        idle = [(await store.create_session(first_message=f"i{k}"))[0].id for k in range(3)]
        async with trio.open_nursery() as n:
            started = trio.Semaphore(0)

            async def produce(sid: str) -> None:
                async with store.inflight(sid) as msg:
                    msg.write("x")
                    started.release()
                    await trio.sleep_forever()
            for sid in running:  # one at a time: each running session is cached when it starts
                n.start_soon(produce, sid)
                await started.acquire()
            for sid in idle:
                await store.load_session(sid)
            assert set(store.states) == {*running, idle[-1]}
            n.cancel_scope.cancel()


async def test_a_reply_that_ends_flags_its_session_unread_and_a_users_stop_does_not(store, root):
    meta, _ = await store.create_session(first_message="go")
    assert store.registry.get(meta.id).unread is False
    async with store.inflight(meta.id) as msg:
        msg.write("an answer")
    assert store.registry.get(meta.id).unread is True and store.registry.get(meta.id).status == "idle"
    assert (await store.update_session(meta.id, unread=False)) == {"unread": False}
    async with trio.open_nursery() as n:
        started = trio.Event()

        async def produce() -> None:
            async with store.inflight(meta.id) as m:
                m.write("half")
                started.set()
                await trio.sleep_forever()
        n.start_soon(produce)
        await started.wait()
        (rid,) = store.registry.get(meta.id).open_msgs
        assert store.stop(meta.id, rid) is True
    assert store.registry.get(meta.id).status == "idle" and store.registry.get(meta.id).unread is False, "stopped: seen"
    with pytest.raises(RuntimeError):
        async with store.inflight(meta.id) as msg:  # an error ends it too: news
            msg.write("x")
            raise RuntimeError("the model failed")
    assert store.registry.get(meta.id).unread is True
    # one record carries both flags, as the log holds them (a replay agrees)
    await store.es.flush()  # (the log writer lingers: a reader of the file asks for its lines first)
    flags = [r.event for r in records(root, meta.id) if type(r.event).__name__ == "SessionFlags" and r.event.unread]
    assert flags and all(f.status == "idle" for f in flags)


def test_a_reply_cut_short_by_a_sigkill_leaves_its_session_unread_after_the_restart(tmp_path):
    """The start's sweep ends it `aborted` "worker restart" and the session
    idle: that is news to its user, as any reply's end (the JetStream lease
    sweep says the same)."""
    from .processes import ServeProcess, free_port, wait_for
    s = ServeProcess(str(tmp_path / "store"), free_port(), speed=5.0)
    s.start()
    try:
        api = s.http()
        sid = api.post("/v1/chat", json={"content": "a slow reply"}).json()["session_id"]
        api.patch(f"/v1/sessions/{sid}", json={"unread": False})
        row = api.get(f"/v1/sessions/{sid}").json()["session"]
        assert row["status"] == "running" and row["unread"] is False  # (its placeholder is durable at the answer)
        s.kill()
        s.start()
        # (the start's sweep runs before it serves: the first answer has it)
        wait_for(lambda: api.get(f"/v1/sessions/{sid}").json()["session"]["status"] == "idle", "the session idle")
        row = api.get(f"/v1/sessions/{sid}").json()["session"]
        assert row["status"] == "idle" and row["unread"] is True
    finally:
        s.stop()
