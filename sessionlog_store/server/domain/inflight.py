"""In-flight messages and the throttled saver.

A producer (an LLM stream, a tool, an agentic function) holds an
`InflightMessage` and calls `write()`, `set_tree()` and `add_tokens()`: plain
synchronous calls that only touch memory and mark the message dirty. One
saver task per store turns each dirty message's pending changes into a single
`message_progress` record once per interval (250 ms by default), queued with
`append_nowait` for the next commit batch: the producer never waits on a
disk, there is no sleeping task per message, and a message is at most one
interval (plus one batch) behind.

With `slots` > 1 each message has its own phase: messages are spread over
the slots of the interval (round robin as they start), and the saver wakes
once per slot for the dirty messages of that slot only (with 50 slots and
10,000 streams, ~200 records per wake-up instead of one burst of 10,000 per
tick). While few messages run it wakes once for a group of slots
(BATCH_TARGET). See SLOTS for why the direct modes use one slot.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from sessionlog_store.eventstore.errors import (MessageFinished, RecordTooLarge, SessionReadOnly, StoreBroken,
                                               StoreClosed, UnknownSession)
from sessionlog_store.eventstore.events import EVENT_ENCODER, MessageProgress
from sessionlog_store.eventstore.record import MAX_RECORD_BYTES

log = logging.getLogger("sessionlog.inflight")

if TYPE_CHECKING:
    from sessionlog_store.eventstore.backend import EventLog as EventStore

# spec/inflight-state.md: "throttled at ~250ms".
PROGRESS_INTERVAL: Final = 0.250
# The interval is cut into slots (the saver wakes once per slot, each message
# in its own), so a commit batch holds ~1/SLOTS of the streams instead of one
# burst of all of them per tick. Measured (bench throttle, 10,000 streams):
# with the write-ahead journal, 20 slots make append->durable p50 8 ms, p99
# 31 ms, against 135/160 ms with one slot (the burst: all records wait for
# the whole flush). With the direct sync modes many smaller batches each pay
# syncfs's per-file cost (5,000 streams, 50 slots: p99 945 ms against 234 ms
# with one slot): the store uses one slot there (StoreConfig.progress_slots).
SLOTS: Final = 20
# The saver wakes for several slots at once (a group: a divisor of the slots)
# holding at most about this many running messages, so a commit batch holds
# up to about this many records: each wake-up of the trio thread costs ~0.25
# ms of CPU on a 2-core VM (its caches cold after the sleep), and a batch
# several more (the journal's and the log writer's thread hand-offs), a fixed
# cost that 80 batches a second made ~21 us of every record at 1,000 streams
# and ~6 at 5,000 (bench/README.md, issue 29 sixth round). On 20 slots
# groups form at 5,000 running messages or fewer; above, every slot is its
# own wake-up, as before. Each message is still flushed once an interval: a
# group's slots are flushed when its last slot is due (a fixed phase); only
# when the group changes is one gap shorter, or up to a group longer.
BATCH_TARGET: Final = 500
# spec/inflight-state.md: a running message silent this long is stalled.
STALL_TIMEOUT: Final = 300.0
# A producer may write any amount within one interval: its pending text goes
# into as many records as needed, each with at most this many characters (a
# character is at most 6 bytes of JSON, so a chunk stays well under the record
# limit, with room for the envelope).
MAX_DELTA_CHARS: Final = (MAX_RECORD_BYTES - 64 * 1024) // 6 // 2
# Lone UTF-16 surrogates (half of an emoji split across two streamed chunks,
# each decoded on its own) cannot be written as UTF-8: each becomes U+FFFD,
# one character for one, so offsets stay exact.
_SURROGATE = re.compile("[\ud800-\udfff]")


def scrub_surrogates(text: str) -> str:
    return _SURROGATE.sub("\ufffd", text)


# A context tree must fit in a record of its own, beside the envelope.
MAX_TREE_BYTES: Final = MAX_RECORD_BYTES - 64 * 1024


class InflightMessage:
    """The live handle of one running message."""

    __slots__ = ("session_id", "msg_id", "kind", "role", "parent_id", "caller", "started_at", "length", "_dirty",
                 "_pending",
                 "_pending_offset", "_tree", "_tree_bytes", "_tree_dirty", "tokens", "_tokens_dirty",
                 "last_activity", "scope", "abort_reason", "finished", "_saver")

    def __init__(self, saver: ThrottledSaver, session_id: str, msg_id: str, kind: str, role: str,
                 parent_id: str | None, caller: str | None = None, started_at: float = 0.0) -> None:
        self._saver = saver
        self._dirty = saver.slot_for_new()  # the dict of this message's slot: write() marks it there
        self.session_id = session_id
        self.msg_id = msg_id
        self.kind = kind
        self.role = role
        self.parent_id = parent_id
        self.caller = caller
        self.started_at = started_at
        self.length = 0                 # characters written so far
        self._pending: list[str] = []   # written, not yet in a record
        self._pending_offset = 0        # where _pending starts
        self._tree: Any = None
        self._tree_bytes = 0
        self._tree_dirty = False
        self.tokens = {"input": 0, "output": 0}
        self._tokens_dirty = False
        self.last_activity = trio.current_time()
        self.scope = trio.CancelScope()
        self.abort_reason: str | None = None
        self.finished = False

    def write(self, delta: str) -> None:
        """Append text to the message's content (cheap; never waits)."""
        if not delta or self.finished:
            return
        self._pending.append(delta)
        self.length += len(delta)
        self._dirty[self] = None  # (its last_activity is stamped when the saver takes it: no clock read per delta)

    def set_tree(self, tree: Any) -> None:
        """Replace the message's context_tree (an agentic function's DAG). Pass a
        fresh object each time, not one you keep mutating: it is logged as is."""
        if self.finished:
            return
        size = len(EVENT_ENCODER.encode(tree))
        if size > MAX_TREE_BYTES:
            raise RecordTooLarge(f"a context tree of {size} bytes is over the {MAX_TREE_BYTES}-byte limit "
                                 "(it is logged whole in one record); keep trees smaller")
        self._tree = tree
        self._tree_bytes = size
        self._tree_dirty = True
        self.last_activity = trio.current_time()
        self._dirty[self] = None

    def set_tokens(self, input: int, output: int) -> None:  # noqa: A002 - the spec's names
        """Set the cumulative token counts (an external producer's totals)."""
        if self.finished:
            return
        self.tokens = {"input": input, "output": output}
        self._tokens_dirty = True
        self.last_activity = trio.current_time()
        self._dirty[self] = None

    def add_tokens(self, input: int = 0, output: int = 0) -> None:  # noqa: A002 - the spec's names
        """Add to the cumulative token counts (partial_tokens_used)."""
        if self.finished:
            return
        for n in (input, output):
            if type(n) is not int:
                raise TypeError(f"token counts are integers, not {n!r} ({type(n).__name__}); round them first")
        self.tokens["input"] += input
        self.tokens["output"] += output
        self._tokens_dirty = True
        self.last_activity = trio.current_time()
        self._dirty[self] = None

    def take_progress(self) -> list[MessageProgress]:
        """The pending changes as records (and forget them): one, or several
        when more text was written in one interval than a record holds.
        Nothing once finished (its finalize written, or another worker's taken:
        nothing of a message follows its finalize)."""
        if self.finished or not (self._pending or self._tree_dirty or self._tokens_dirty):
            return []
        delta = self._pending[0] if len(self._pending) == 1 else "".join(self._pending)
        offset = self._pending_offset
        out = []
        while len(delta) > MAX_DELTA_CHARS:
            out.append(MessageProgress(msg_id=self.msg_id, content_delta=delta[:MAX_DELTA_CHARS], offset=offset))
            delta = delta[MAX_DELTA_CHARS:]
            offset += MAX_DELTA_CHARS
        if self._tree_dirty and delta and self._tree_bytes + 6 * len(delta) > MAX_TREE_BYTES:
            # A large tree goes in a record of its own.
            out.append(MessageProgress(msg_id=self.msg_id, content_delta=delta, offset=offset))
            offset += len(delta)
            delta = ""
        out.append(MessageProgress(msg_id=self.msg_id, content_delta=delta, offset=offset,
                                   context_tree=self._tree if self._tree_dirty else None,
                                   partial_tokens_used=dict(self.tokens) if self._tokens_dirty else None))
        self._pending = []
        self._pending_offset = self.length
        self._tree_dirty = self._tokens_dirty = False
        return out


class ThrottledSaver:
    """One ticking task for every in-flight message of a store."""

    def __init__(self, es: EventStore, interval: float = PROGRESS_INTERVAL,
                 stall_timeout: float = STALL_TIMEOUT, slots: int = SLOTS, batch_target: int = BATCH_TARGET) -> None:
        self.es = es
        self.interval = interval
        self.stall_timeout = stall_timeout
        self.batch_target = batch_target  # a group of slots holds at most about this many messages (BATCH_TARGET)
        self.wakes = 0  # the saver's wake-ups (a slot, or a group of them)
        # Dirty messages, per slot of the interval (insertion-ordered sets).
        self.slots: list[dict[InflightMessage, None]] = [{} for _ in range(max(1, slots))]
        self._next_slot = 0
        self.active: dict[tuple[str, str], InflightMessage] = {}
        self.sessions: dict[str, int] = {}  # session -> how many of its messages run here
        self.ticks = 0
        self.late_ticks = 0
        self.failed: BaseException | None = None
        # On a shared stream (scaleout.py): may this message's progress still be
        # written? Asked before each write; False ends its producer unwritten.
        self.may_write: Callable[[InflightMessage], bool] | None = None
        self._work = trio.Event()  # set when a message starts (the saver sleeps while none runs)

    def start(self, msg: InflightMessage) -> None:
        """A message is live: stoppable, watched, counted."""
        self._work.set()
        self.active[(msg.session_id, msg.msg_id)] = msg
        self.sessions[msg.session_id] = self.sessions.get(msg.session_id, 0) + 1

    def end(self, msg: InflightMessage) -> None:
        if self.active.pop((msg.session_id, msg.msg_id), None) is not None:
            n = self.sessions.pop(msg.session_id, 1) - 1
            if n:
                self.sessions[msg.session_id] = n

    def slot_for_new(self) -> dict[InflightMessage, None]:
        """The slot of a message that starts now (round robin)."""
        slot = self.slots[self._next_slot]
        self._next_slot = (self._next_slot + 1) % len(self.slots)
        return slot

    def flush(self, msg: InflightMessage) -> None:
        """Queue the message's pending changes now (before a finalize)."""
        msg._dirty.pop(msg, None)
        self._queue(msg)

    def flush_slot(self, *ks: int) -> None:
        """The slots' dirty messages' progress records, in one append of them
        all (issue 29: per wake-up, not per record: one clock reading, one
        batch)."""
        dirty: list[InflightMessage] = []
        for k in ks:
            slot = self.slots[k]  # cleared in place: each message keeps a reference to its slot
            dirty += slot
            slot.clear()
        items: list[tuple[str, list[MessageProgress]]] = []
        owners: list[InflightMessage] = []
        now = trio.current_time()
        for msg in dirty:
            events = self._take(msg, now)
            if events:
                items.append((msg.session_id, events))
                owners.append(msg)
        if not items:
            return
        try:
            failed = self.es.append_progress(items)
        except (StoreBroken, StoreClosed) as e:
            self.store_failed(e)
            return
        for i, appended, error in failed:
            self._refused(owners[i], items[i][1][appended:], error)

    def _queue(self, msg: InflightMessage) -> None:
        """Append the message's progress records now."""
        events = self._take(msg, trio.current_time())
        if events:
            self._append_each(msg, events)

    def _take(self, msg: InflightMessage, now: float) -> list[MessageProgress]:
        """The message's pending records (stamping its activity), or none:
        ended by may_write, its pending text is never written nor told."""
        if self.may_write is not None and not msg.finished and not self.may_write(msg):
            return []
        events = msg.take_progress()
        if events:
            msg.last_activity = now
        return events

    def _refused(self, msg: InflightMessage, rest: list[MessageProgress], error: BaseException) -> None:
        """An append of the message's records refused `error` at `rest[0]`:
        text that cannot be encoded is written scrubbed; any other error
        ends the message's producer."""
        if isinstance(error, UnicodeEncodeError):
            self._append_each(msg, rest)
        else:
            self._ended_by(msg, error)

    def _append_each(self, msg: InflightMessage, events: list[MessageProgress]) -> None:
        """Append the message's progress records one by one."""
        try:
            for i, ev in enumerate(events):
                try:
                    self.es.append_nowait(msg.session_id, ev)
                except UnicodeEncodeError:
                    events[i] = ev = msgspec.structs.replace(ev, content_delta=scrub_surrogates(ev.content_delta))
                    self.es.append_nowait(msg.session_id, ev)
        except Exception as e:
            self._ended_by(msg, e)

    def _ended_by(self, msg: InflightMessage, error: BaseException) -> None:
        """A store error ends the message's producer (never the saver, never
        the process)."""
        if isinstance(error, UnknownSession):
            self._end(msg, "session deleted")
        elif isinstance(error, MessageFinished):  # stopped or swept elsewhere: its finalize is written
            msg.finished = True
            self.end(msg)
            self._end(msg, "finalized elsewhere")
        elif isinstance(error, SessionReadOnly):
            self._end(msg, "session quarantined")
        elif isinstance(error, StoreBroken | StoreClosed):
            self.store_failed(error)
        else:  # one producer's bad data never stops the saver (nor the process)
            log.error("message %s: its progress could not be written; ending it", msg.msg_id,
                      exc_info=(type(error), error, error.__traceback__))
            self._end(msg, "unwritable progress")

    def _end(self, msg: InflightMessage, reason: str) -> None:
        msg.abort_reason = msg.abort_reason or reason
        msg.scope.cancel()

    def quarantined(self, session_id: str) -> None:
        """The session's log was found damaged: end its producers."""
        for (sid, _), msg in list(self.active.items()):
            if sid == session_id:
                self._end(msg, "session quarantined")

    def store_failed(self, error: BaseException) -> None:
        """The store accepts no more writes: end every producer (their finalizes
        cannot be written; the next start's abort sweep marks them aborted)."""
        if self.failed is None:
            self.failed = error
            log.error("the store failed (%s): ending %d running message(s); reads keep working, "
                      "writes are refused until a restart", error, len(self.active))
        for msg in list(self.active.values()):
            self._end(msg, "store failure")

    def check_stalled(self) -> None:
        now = trio.current_time()
        for msg in list(self.active.values()):
            if now - msg.last_activity > self.stall_timeout and not msg.finished:
                msg.abort_reason = msg.abort_reason or "stalled"
                msg.scope.cancel()

    def group(self) -> int:
        """How many slots a wake-up flushes: the largest divisor of the slots
        whose messages number at most `batch_target` (1 at least; 1 with a
        target of 0)."""
        n = len(self.slots)
        running = len(self.active)
        best = 1
        if self.batch_target <= 0:
            return best
        for g in range(2, n + 1):
            if n % g == 0 and g * running <= self.batch_target * n:
                best = g
        return best

    async def run(self) -> None:
        """Forever: wake once per slot, or per group of slots (`group`), and
        flush the dirty messages of every slot due by then, in one append.
        A wake-up that comes late flushes every slot it passed. `ticks` counts
        slot flushes, `late_ticks` those that came more than one interval
        after they were due (their messages were that far behind)."""
        n = len(self.slots)
        step = self.interval / n
        start = trio.current_time()
        done = 0  # slots flushed since start
        stall_every = max(1, int(1.0 / step))
        while True:
            if not self.active and not any(self.slots):
                # Nothing runs: no wake-ups until a message starts (its first
                # flush is still within one interval of the new start).
                self._work = trio.Event()
                await self._work.wait()
                start, done = trio.current_time(), 0
            g = self.group()
            wake_at = (done // g + 1) * g  # the next group's last slot (groups start at multiples of g)
            await trio.sleep_until(start + wake_at * step)
            self.wakes += 1
            now = trio.current_time()
            # Woken: at least the slots it slept for, and the whole groups due
            # since (a late wake-up must not take the next group's first slots).
            due = max(wake_at, int((now - start) / step + 1e-6) // g * g)
            if due - done > n:  # fell behind: flush each slot once, no burst of catching up
                skipped = due - done - n
                self.ticks += skipped
                self.late_ticks += skipped
                done = due - n
            ks = []
            stall_check = False
            while done < due:
                done += 1
                self.ticks += 1
                if now - (start + -(-done // g) * g * step) > self.interval:  # (from its group's wake-up)
                    self.late_ticks += 1  # this slot's messages are more than one interval behind
                ks.append(done % n)
                stall_check = stall_check or self.ticks % stall_every == 0
            self.flush_slot(*ks)
            if stall_check and self.active:
                self.check_stalled()
