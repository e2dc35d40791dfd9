"""A worker on a shared stream (issue 17): what a session store does when
its event log is a NATS JetStream stream that other `sessionlog serve`
workers write too (docs/SCALEOUT.md).

- Start: the registry is folded from the stream's checkpoint and the
  messages after it (or the whole stream); there is no local recovery or
  abort sweep of everything open: other workers' replies are alive.
- Other workers' records reach the store's listeners through the log's
  tail; `on_remote` tells this worker's clients what they changed (a
  session made, updated or deleted elsewhere) and ends a producer here
  whose reply another worker finalized (a stop sent to that worker).
- A conflict (two workers appending to one session at once) is rebased by
  the log; `on_reset` folds the session's row again and drops its loaded
  state (it is read again from the stream on the next load).
- In-flight ownership: each reply streamed here holds a lease
  (eventstore/jetstream/leases.py), taken before its placeholder is written, renewed
  every third of its time to live, released after its finalize. A lease
  that cannot be renewed (another worker took it) ends the reply here
  without a finalize: the taker writes it. The sweeper finalizes every
  reply whose lease expired (its worker died) `aborted` "worker restart",
  exactly once across workers; and a running reply that has no lease on
  two sweeps in a row (left by a worker that died between its finalize and
  the tail, or copied in by `migrate`) is taken with a lease first.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import trio

from sessionlog_store.eventstore.jetstream.control import StopRequests
from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress, SessionCreated,
                                                SessionDeleted)
from sessionlog_store.eventstore.jetstream.natsio import publisher_of
from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog
from sessionlog_store.eventstore.jetstream.objects import StreamObjects, first_stream_seq, stream_facts, subject_from
from sessionlog_store.eventstore.jetstream.leases import REASON, TURN, LeaseTaken, Leases, lease_key
from sessionlog_store.eventstore.record import Record
from sessionlog_store.eventstore.record import scan, with_ends
from sessionlog_store.projections.lifecycle import TERMINAL_STATUSES
from sessionlog_store.projections.recovery import fold_until
from sessionlog_store.projections.stream_fold import (CheckpointUnusable, RunningIndex, StreamFold, decode_snapshot, encode_snapshot)
from sessionlog_store.projections.session import SessionState
from sessionlog_store.server.domain.errors import Conflict, ServiceError
from sessionlog_store.server.domain.subscriptions import MsgUpdate

if TYPE_CHECKING:
    from sessionlog_store.projections.registry import Registry
    from sessionlog_store.projections.session import SessionMeta
    from sessionlog_store.server.domain.inflight import InflightMessage, ThrottledSaver
    from sessionlog_store.server.domain.states import LoadedStates
    from sessionlog_store.server.domain.subscriptions import SubscriptionHub


class WorkerHost(Protocol):
    """What a worker asks of the session store it shares a stream for (the
    store's module is never imported here: the opener hands the store in)."""
    registry: Registry
    states: LoadedStates
    hub: SubscriptionHub
    saver: ThrottledSaver

    def tell_record(self, sid: str, rec: Record, state: SessionState | None,
                    old_row: SessionMeta | None = None) -> None: ...
    def take_row_before(self, sid: str) -> SessionMeta | None: ...
    def keep_row_before(self, sid: str, row: SessionMeta) -> None: ...
    def after_append(self, sid: str) -> None: ...
    def row_changes(self, old: SessionMeta, new: SessionMeta) -> dict[str, Any]: ...
    def get_row(self, session_id: str) -> dict[str, Any]: ...
    def notify(self, kind: str, data: dict[str, Any], owner: str | None = None) -> None: ...
    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> bool: ...
    def stop(self, session_id: str, msg_id: str) -> bool: ...

log = logging.getLogger("sessionlog.worker")
# How long a new turn waits for an ended reply's worker to give the turn up (seconds).
# (at least; up to the lease's time to live, by which a holder that died has lost it)
TURN_WAIT: Final = 3.0
# How soon a lease renewal that got no answer is tried again (seconds).
RENEW_RETRY: Final = 0.5

CHECKPOINT_NAME = "registry"  # the registry checkpoint's object in the stream's cache bucket
# A session's snapshot is written when its lines grew this much since the
# last one (at a reply's end), and read by a load of a session this long.
SNAPSHOT_BYTES = 64 * 1024


def snapshot_name(sid: str) -> str:
    return f"session.{sid}"


class CheckpointStart(msgspec.Struct):
    """What a start took from the stream's checkpoint."""
    position: int         # the stream sequence it was as of (the replay went on after it)
    sessions: int
    pruned: int           # its sessions deleted (and purged) since it was written
    written_at: float


@dataclass
class Checkpoints:
    """The registry checkpoint's side of a worker: the fold it is written
    from (None: checkpoints off), the bucket, what the start took."""
    fold: StreamFold | None
    objects: StreamObjects | None = None
    start: CheckpointStart | None = None


class Worker:
    """The store's side of sharing the stream (see the module's header)."""

    def __init__(self, store: WorkerHost, es: JetStreamLog, leases: Leases, running: RunningIndex,
                 checkpoints: Checkpoints | None = None, checkpoint_interval: float = 30.0) -> None:
        self.store, self.es, self.leases, self.running = store, es, leases, running
        self.checkpoints = checkpoints or Checkpoints(None)
        self.checkpoint_interval = checkpoint_interval  # the registry checkpoint's period (0: none)
        self.stops = StopRequests(es)
        self._stops_pending: set[tuple[str, str]] = set()
        self._turn_of: dict[str, str] = {}  # session -> the reply holding its turn (a chat's, a retry's)
        self.swept = leases.finalized            # replies this worker's sweeper finalized (as it does)
        self.lost: list[tuple[str, str]] = []    # replies ended here because their lease was taken
        self._leaseless: set[tuple[str, str]] = set()  # running replies seen without a lease by the last sweep
        self._reset_loading: set[str] = set()
        self._checked = trio.Event()
        self._checked.set()
        start = self.checkpoints.start
        self.checkpointed = start.position if start is not None else 0  # the stream sequence last written as of
        self._snapshot_end: dict[str, int] = {}  # a session's lines' length in its last snapshot read or written
        self.snapshot_loads = 0  # loads that read a snapshot and the messages after it
        # This worker's progress updates until the stream acknowledges them
        # (by session): a conflict may renumber or drop them, so a client is
        # told only what the stream holds, at the seq it holds it.
        self._held: dict[str, list[MsgUpdate]] = {}
        es.remote_listeners.append(self.on_remote)
        es.reset_listeners.append(self.on_reset)
        es.batch_listeners.append(self._release_held)
        store.saver.may_write = self.may_write  # (a reply whose lease lapsed writes nothing more)

    # -- other workers' records ---------------------------------------------

    def on_remote(self, sid: str, records: list[Record], applied: bool) -> None:
        store = self.store
        if not applied:
            # Folded by a rebase (on_reset: the row, the state, the row's push):
            # what remains is what the listener would have told.
            state = store.states.get(sid)
            for rec in records:
                store.tell_record(sid, rec, state)
                if isinstance(rec.event, MessageFinalized):
                    self._finished_elsewhere(sid, rec.event)
            return
        before = store.take_row_before(sid)
        kinds = {type(r.event) for r in records}
        for rec in records:
            ev = rec.event
            if isinstance(ev, MessageFinalized):
                self._finished_elsewhere(sid, ev)
        if SessionDeleted in kinds:
            self._gone(sid, before.owner if before is not None else "")
        elif SessionCreated in kinds:
            if sid in store.registry:
                store.notify("session_created", {"session": store.get_row(sid)})
        elif before is not None:
            store.keep_row_before(sid, before)
            store.after_append(sid)

    @property
    def backend(self) -> str:
        return "jetstream"

    @property
    def name(self) -> str:
        return self.es.stream

    @property
    def start_seconds(self) -> float:
        return self.es.replay_seconds

    def figures(self) -> list[tuple[str, str, str, float]]:
        es = self.es
        publisher = publisher_of(es.js)  # (what its refusals taught it: natsio.Publisher._learn)
        return [
            ("counter", "sessionlog_stream_conflicts", "Publishes refused for another worker's, rebased", es.conflicts),
            ("counter", "sessionlog_stream_retries", "Publishes sent again after no answer (leader elections)",
             es.retries),
            ("gauge", "sessionlog_stream_atomic_batches", "1: a batch's messages go out as JetStream atomic batches "
             "(0: one by one: the stream does not take them)", float(es.batched and publisher.batching)),
            ("counter", "sessionlog_stream_batches_refused", "Atomic batches refused whole (a conflict, a retry of "
             "a stored batch, the servers' limits), published again one message at a time", publisher.refused_batches),
            ("gauge", "sessionlog_stream_position", "Stream sequence of the last message the tail delivered",
             es.tail_position),
            ("counter", "sessionlog_replies_swept", "Dead workers' replies this worker aborted", len(self.swept)),
            ("counter", "sessionlog_leases_lost", "Replies ended here because another worker took their lease",
             len(self.lost)),
            ("gauge", "sessionlog_checkpoint_position", "Stream sequence of the registry checkpoint this worker "
             "last wrote or started from (0: none)", self.checkpointed),
            ("gauge", "sessionlog_start_replayed", "Messages the start replayed (after its checkpoint, if one)",
             es.replayed),
            ("counter", "sessionlog_snapshot_loads", "Loads that read a session's snapshot and what followed it",
             self.snapshot_loads),
        ]

    def others_running(self) -> Iterable[tuple[tuple[str, str], dict[str, Any]]]:
        """The replies running on the stream, as the tail brought them (this
        worker's own included: the caller leaves those out)."""
        return self.running.replies.items()

    async def log_bytes(self, sid: str) -> bytes:
        return await self.es.log_bytes(sid)

    def hold(self, update: MsgUpdate) -> None:
        """A progress update of this worker's, told once the stream has it."""
        self._held.setdefault(update.session_id, []).append(update)

    def _release_held(self, records: int, opened: float, acked: float) -> None:
        """After each acknowledged batch: tell what the stream now holds."""
        hub, es = self.store.hub, self.es
        for sid in list(self._held):
            held = self._held[sid]
            durable = es.durable_seq(sid) if sid in es else -1
            ready = 0
            while ready < len(held) and held[ready].seq <= durable:
                hub.publish(msgspec.structs.replace(held[ready], durable_seq=durable))
                ready += 1
            if durable < 0 or ready == len(held):
                del self._held[sid]  # (a session gone: its updates with it)
            elif ready:
                del held[:ready]

    def _finished_elsewhere(self, sid: str, ev: MessageFinalized) -> None:
        """Another worker finalized a reply produced here (a user's stop sent
        there): the producer ends, and writes no finalize of its own."""
        msg = self.store.saver.active.get((sid, ev.msg_id))
        if msg is None or msg.finished:
            return
        self._end_here(msg, ev.aborted_reason or ev.status)
        self.store.spawn(self.reply_ended, sid, ev.msg_id)  # (its lease may be gone: taken by the one that finalized)

    def _end_here(self, msg: InflightMessage, reason: str) -> None:
        """End a producer here without a finalize of its own: another worker
        wrote one (or its sweeper will)."""
        msg.finished = True
        self.store.saver.end(msg)
        msg.abort_reason = reason
        msg.scope.cancel()

    def may_write(self, msg: InflightMessage) -> bool:
        """The saver's question before each write of a reply produced here:
        False (and the producer ended, nothing more of it written, its lease
        left to a sweeper) when the reply's lease lapsed: the worker was
        paused, or its renewals went unanswered, past the lease's deadline."""
        if not self.leases.lapsed(msg.session_id, msg.msg_id):
            return True
        log.error("reply %s: its lease lapsed (this worker was paused or cut off for longer than "
                  "--lease-ttl); it stops here and a sweeper finalizes it", lease_key(msg.session_id, msg.msg_id))
        self.leases.forget(msg.session_id, msg.msg_id)
        self.lost.append((msg.session_id, msg.msg_id))
        self._end_here(msg, "lease expired")
        return False

    def _gone(self, sid: str, owner: str) -> None:
        store = self.store
        for (s, _), msg in list(store.saver.active.items()):
            if s == sid:
                self._end_here(msg, "session deleted")
        store.states.drop(sid)
        store.hub.end(sid, "session deleted")
        store.notify("session_deleted", {"session_id": sid}, owner)

    def on_reset(self, sid: str, records: list[Record], end: int) -> None:
        """A conflict rebased the session: its row and state fold again."""
        store = self.store
        # (the row before this worker's own change that the conflict voided:
        # its own deletion, refused because another worker's came first)
        before = store.take_row_before(sid)
        old = store.registry.get(sid)
        store.registry.put(None, sid)
        state = None if store.states.drop(sid) is None or not records else SessionState()
        for rec in records:
            store.registry.apply(sid, rec, end)
            if state is not None:
                state.apply(rec, end)
        if state is not None:
            store.states.put(sid, state)
        self.running.drop(sid)
        for rec in records:
            self.running.apply(sid, rec, end)
        # This worker's updates held for the ack: as the rebase left them
        # (renumbered; those of a message finalized elsewhere dropped).
        if self._held.pop(sid, None) is not None:
            durable = self.es.durable_seq(sid) if sid in self.es else 0
            for rec in records:
                ev = rec.event
                if rec.seq > durable and type(ev) is MessageProgress and store.hub.wants(sid, ev.msg_id):
                    self.hold(MsgUpdate(session_id=sid, msg_id=ev.msg_id, seq=rec.seq, offset=ev.offset,
                                        content_delta=ev.content_delta, status="running", tree=ev.context_tree,
                                        tokens=ev.partial_tokens_used, durable_seq=durable))
        made = {rec.event.msg_id for rec in records if isinstance(rec.event, MessageCreated)}
        for (s, msg_id), msg in list(store.saver.active.items()):
            if s == sid and msg_id not in made and not msg.finished:
                self._end_here(msg, "session deleted")  # (the id was deleted and made again elsewhere)
        if store.states.loading(sid):
            self._reset_loading.add(sid)
        new = store.registry.get(sid)
        if new is None:
            if old is not None or before is not None:
                self._gone(sid, (old or before).owner)  # type: ignore[union-attr]
            else:  # (its row went with this worker's own tombstone, refused: deleted elsewhere first)
                store.states.drop(sid)
                store.hub.end(sid, "session deleted")
        elif old is None:
            store.notify("session_created", {"session": store.get_row(sid)})
        else:
            changed = store.row_changes(old, new)
            if changed:
                store.notify("session_updated", {"id": sid, **changed})

    async def read_state(self, sid: str) -> SessionState:
        """A session's state as the stream holds it: from its snapshot and the
        messages after it when it has a snapshot of this incarnation, else
        from all of its messages."""
        if self.checkpoints.objects is not None and sid in self.es and self.es.durable_end(sid) >= SNAPSHOT_BYTES:
            state = await self._from_snapshot(sid, self.checkpoints.objects)
            if state is not None:
                return state
        data = await self.es.log_bytes(sid)
        records = scan(sid, data).records
        return fold_until(records, data, records[-1].seq if records else 0)

    async def _from_snapshot(self, sid: str, objects: StreamObjects) -> SessionState | None:
        es = self.es
        await es.flush(sid)  # (what this worker appended to it is in what is read)
        try:
            stored = await objects.get(snapshot_name(sid))
            if stored is None:
                return None
            snap = decode_snapshot(stored[0])
            if await first_stream_seq(es, sid) != snap.first:
                return None  # a snapshot of a deleted session of the id
            data, _ = await subject_from(es, sid, snap.stream_seq + 1)
        except CheckpointUnusable as e:
            log.warning("session %s: its snapshot is unusable (%s); reading all of it", sid, e)
            return None
        except Exception as e:  # noqa: BLE001 - a cache: the stream serves without it
            log.warning("session %s: could not read its snapshot (%s); reading all of it", sid, e)
            return None
        state = snap.state.to_state()
        for rec, end in with_ends(scan(sid, data).records, data, state.end):
            if rec.seq > state.seq:
                state.apply(rec, end)
        self.snapshot_loads += 1
        self._snapshot_end[sid] = snap.state.end
        return state

    async def write_snapshot(self, sid: str) -> bool:
        """Write a loaded session's snapshot, when its messages grew by
        SNAPSHOT_BYTES since the last one and all of it is on the stream."""
        es, objects = self.es, self.checkpoints.objects
        if objects is None or sid not in es or sid not in self.store.states or \
                es.durable_end(sid) - self._snapshot_end.get(sid, 0) < SNAPSHOT_BYTES:
            return False
        first = await first_stream_seq(es, sid)
        for _ in range(3):
            # From the check to the encoding nothing awaits: state, seqs and fence agree.
            state = self.store.states.get(sid)
            if not first or state is None or sid not in es:
                return False
            if first > es.stream_seq(sid):
                return False  # the stream's session is another incarnation of the id (this one's tail lags)
            if state.seq == es.durable_seq(sid) == es.last_seq(sid):
                break
            await es.wait_durable(sid, es.last_seq(sid))  # (its title, a flag: written after the reply)
        else:
            return False  # written to without pause: the next reply's end
        stream_seq, end = es.stream_seq(sid), state.end
        data = encode_snapshot(state, stream_seq, first)
        stored = await objects.put(snapshot_name(sid), data, stream_seq)
        self._snapshot_end[sid] = end
        return stored

    async def _snapshot_soon(self, sid: str) -> None:
        try:
            await self.write_snapshot(sid)
        except Exception as e:  # noqa: BLE001 - a cache: a load reads the whole session
            log.warning("session %s: could not write its snapshot: %s", sid, e)

    # -- the store's keeper (domain/keeping.py) --------------------------------

    @property
    def checked(self) -> trio.Event:
        return self._checked  # (set: a start read the whole stream, nothing was skipped)

    def registry_changed(self) -> None:
        pass  # (the checkpoint follows the fold's position: checkpoint_loop)

    def session_changed(self, sid: str) -> None:
        pass  # (a snapshot follows the log's growth: maybe_snapshot)

    async def before_write(self, sid: str) -> None:
        pass

    async def check_logs(self) -> int:
        return 0

    async def remove(self, sid: str) -> None:
        try:
            await self.es.remove(sid)
        finally:  # (awaited, not spawned: a stop right after, an offboarding's, would cancel it)
            await self.forget_snapshot(sid)

    async def forget_snapshot(self, sid: str) -> None:
        """A deleted session's snapshot goes (a later one of the id would not
        take it: another first message)."""
        self._snapshot_end.pop(sid, None)
        if self.checkpoints.objects is not None:
            try:
                await self.checkpoints.objects.delete(snapshot_name(sid))
            except Exception as e:  # noqa: BLE001 - a cache: left behind, never taken
                log.warning("session %s: could not delete its snapshot: %s", sid, e)

    def stream_end(self, sid: str, update: MsgUpdate) -> MsgUpdate:
        """The terminal update to tell, now that its finalize is durable: the
        message as the stream holds it (the loaded state is the stream's: a
        rebase folded it again). Another worker's finalize may have come
        first and a rebase dropped this one with its last text, with the same
        status or another: what is told is the stream's text, status and seq."""
        state = self.store.states.get(sid)
        m = state.messages.get(update.msg_id) if state is not None else None
        if m is None or m.status not in TERMINAL_STATUSES:
            return update
        return msgspec.structs.replace(update, status=m.status, content_delta=m.content, error=m.error,
                                       tokens=m.tokens, aborted_reason=m.metadata.get("aborted_reason"), seq=m.seq)

    def reload_needed(self, sid: str) -> bool:
        """A reset came while the session was being loaded: load it again."""
        if sid in self._reset_loading:
            self._reset_loading.discard(sid)
            return True
        return False

    def start_background(self, nursery: trio.Nursery) -> None:
        """Renewals, sweeps, other workers' stops, checkpoints."""
        nursery.start_soon(self.renew_loop)
        nursery.start_soon(self.sweep_loop)
        nursery.start_soon(self.serve_stops)
        if self.checkpoints.fold is not None:
            nursery.start_soon(self.checkpoint_loop)

    # -- stops from other workers --------------------------------------------

    async def serve_stops(self) -> None:
        """Stop, when another worker asks, the replies produced here."""
        await self.stops.serve(self._stop_here)
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await self.stops.close()

    def _stop_here(self, sid: str, msg_id: str) -> bool:
        """Stopped here; or starting here (its placeholder being written: it
        stops once live) or ending here (its finalize is this worker's to write)."""
        if self.store.stop(sid, msg_id):
            return True
        if not self.leases.holds(sid, msg_id):
            return False
        self._stops_pending.add((sid, msg_id))  # (dropped when the reply ends, if it never went live)
        return True

    def stop_pending(self, sid: str, msg_id: str) -> bool:
        """Another worker asked to stop this reply before it went live."""
        if (sid, msg_id) in self._stops_pending:
            self._stops_pending.discard((sid, msg_id))
            return True
        return False

    async def stop_elsewhere(self, sid: str, msg_id: str) -> bool:
        """Ask the worker that streams the reply to stop it (it writes the
        finalize); False if none answered."""
        try:
            return await self.stops.request(sid, msg_id)
        except Exception as e:  # noqa: BLE001 - no answer: the asker writes the finalize
            log.warning("could not ask for reply %s to stop: %s", lease_key(sid, msg_id), e)
            return False

    # -- leases -------------------------------------------------------------

    async def reply_starting(self, sid: str, msg_id: str, turn: bool = False) -> None:
        """The reply's lease; with `turn` (a chat's or a retry's reply), the
        session's turn first: one turn at a time across workers, held until
        the reply ends (the tail may not have brought another worker's
        placeholder yet, the bucket's compare-and-set decides)."""
        try:
            if turn:
                await self._take_turn(sid)
                self._turn_of[sid] = msg_id
            try:
                await self.leases.acquire(sid, msg_id)
            except BaseException:
                if turn:
                    await self._end_turn(sid, msg_id)
                raise
        except (LeaseTaken, Conflict):
            raise
        except Exception as e:
            log.warning("could not take the lease of reply %s: %s", lease_key(sid, msg_id), e)
            raise ServiceError("unavailable", "the stream's servers did not answer in time (a leader election, "
                                              "or too few nodes up); nothing was written, try again") from None

    async def _take_turn(self, sid: str) -> None:
        """The session's turn, or Conflict `reply_running`. A turn whose reply
        has ended on the stream (this worker's tail shows nothing running)
        but whose holder has not given it up yet (it does right after its
        finalize is durable) is waited for, up to the lease's time to live
        (a loaded holder may take seconds to give it up; one that died has
        lost it by then): a client told "done" that sends at once is not
        refused for that moment."""
        deadline = trio.current_time() + max(TURN_WAIT, self.leases.ttl)
        while True:
            try:
                await self.leases.acquire(sid, TURN)
                return
            except LeaseTaken:
                meta = self.store.registry.get(sid)
                if (meta is not None and meta.open_msgs) or trio.current_time() > deadline:
                    raise Conflict("reply_running", f"a reply is running in session {sid} (on another worker): "
                                                    "stop it, or send when it has ended") from None
            await trio.sleep(0.05)

    async def _end_turn(self, sid: str, msg_id: str) -> None:
        if self._turn_of.get(sid) == msg_id:
            del self._turn_of[sid]
            try:
                await self.leases.release(sid, TURN)
            except Exception as e:  # noqa: BLE001 - it expires; a sweeper deletes it
                log.warning("could not release the turn of session %s: %s", sid, e)

    async def reply_ended(self, sid: str, msg_id: str) -> None:
        self._stops_pending.discard((sid, msg_id))
        await self._end_turn(sid, msg_id)
        try:
            await self.leases.release(sid, msg_id)
        except Exception as e:  # noqa: BLE001 - it expires; a sweeper finds the finalize and drops it
            log.warning("could not release the lease of reply %s: %s", lease_key(sid, msg_id), e)
        if self.checkpoints.objects is not None:
            self.store.spawn(self._snapshot_soon, sid)

    async def renew_loop(self) -> None:
        """Every third of the leases' time to live, renew all of this worker's
        at once (replies still writing their placeholder included). A round
        that got no answer for some (a leader election, a reconnect) is
        tried again after RENEW_RETRY (half a second), not a third of the
        time to live later: two unanswered rounds at the full pace (each waits for its
        timeouts) were enough to let a live reply's lease lapse during one
        election on a busy machine."""
        pause = self.leases.ttl / 3
        while True:
            await trio.sleep(pause)
            pause = self.leases.ttl / 3
            if self.es.broken is not None:
                # Its replies cannot be finalized here: their leases lapse and
                # other workers' sweepers finalize them.
                log.error("the store is broken: no more lease renewals; other workers sweep its replies")
                return
            try:
                results = await self.leases.renew_all()
            except Exception as e:  # noqa: BLE001 - the stream unavailable: the next round tries again
                log.warning("could not renew the leases: %s", e)
                pause = min(pause, RENEW_RETRY)
                continue
            unknown = sum(1 for held in results.values() if held is None)
            if unknown:
                log.warning("%d lease renewals got no answer (a leader election?); trying again", unknown)
                pause = min(pause, RENEW_RETRY)
            for key, held in results.items():
                if held is not False:
                    continue
                sid, msg_id = key.split(".", 1)
                if msg_id == TURN:  # (a turn's lease swept after a pause: its reply's own lease decides)
                    self._turn_of.pop(sid, None)
                    continue
                msg = self.store.saver.active.get((sid, msg_id))
                log.error("reply %s: its lease was taken by another worker; it stops here", key)
                self.lost.append((sid, msg_id))
                if msg is not None and not msg.finished:
                    self._end_here(msg, "lease lost")

    async def sweep_once(self) -> list[tuple[str, str]]:
        done = await self.leases.sweep()
        done += await self._sweep_leaseless()
        for sid, msg_id in done:
            log.warning("reply %s of a dead worker finalized aborted %r", lease_key(sid, msg_id), REASON)
        return done

    async def _sweep_leaseless(self) -> list[tuple[str, str]]:
        keys = set(await self.leases.keys())
        running = {(sid, m) for sid, meta in self.store.registry.rows.items() for m in meta.open_msgs
                   if (sid, m) not in self.store.saver.active}
        leaseless = {r for r in running if lease_key(*r) not in keys}
        take, self._leaseless = leaseless & self._leaseless, leaseless - self._leaseless
        done = []
        for sid, msg_id in sorted(take):
            try:
                await self.leases.acquire(sid, msg_id)  # of two sweepers, one makes the entry
            except LeaseTaken:
                continue
            try:
                if await self.leases.finalize_orphan(sid, msg_id):
                    done.append((sid, msg_id))
            finally:
                await self.reply_ended(sid, msg_id)
        return done

    async def sweep_loop(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except Exception as e:  # noqa: BLE001 - the stream unavailable for a moment: the next sweep
                log.warning("lease sweep failed: %s", e)
            await trio.sleep(self.leases.ttl / 2)

    # -- the registry checkpoint ----------------------------------------------

    async def write_checkpoint(self) -> bool:
        """Write the fold's checkpoint, if it moved since the stored one (any
        worker's). Returns whether this one was stored."""
        fold, objects = self.checkpoints.fold, self.checkpoints.objects
        if fold is None or objects is None or fold.position <= self.checkpointed:
            return False
        facts = await stream_facts(self.es)
        fold.prune(facts.live, facts.last_seq)  # (their tombstone purged before the tail brought it)
        position, data = fold.position, fold.checkpoint(time.time())
        stored = await objects.put(CHECKPOINT_NAME, data, position, replace=objects.replace)
        self.checkpointed, objects.replace = position, False
        if stored:
            log.info("registry checkpoint written as of stream sequence %d (%d sessions, %d bytes)",
                     position, len(fold.positions), len(data))
        return stored

    async def at_stop(self) -> None:
        """A stop's last checkpoint (what the stop aborted included, once the
        tail brought it), within a few seconds."""
        if self.checkpoints.fold is None:
            return
        with trio.move_on_after(5) as waited:
            await self.es.flush()
            while self.checkpoints.fold.position < max(self.es.written_position, self.es.tail_position):
                await trio.sleep(0.02)
        if waited.cancelled_caught:
            log.warning("the stop's checkpoint: the tail did not bring this worker's last messages in 5 s "
                        "(folded to stream sequence %d of %d)", self.checkpoints.fold.position,
                        max(self.es.written_position, self.es.tail_position))
        try:
            with trio.move_on_after(5):
                await self.write_checkpoint()
        except Exception as e:  # noqa: BLE001 - a cache: the next start replays more
            log.warning("could not write the registry checkpoint at stop: %s", e)

    async def checkpoint_loop(self) -> None:
        interval = self.checkpoint_interval
        while True:
            await trio.sleep(interval)
            try:
                await self.write_checkpoint()
            except Exception as e:  # noqa: BLE001 - a cache: the next round tries again
                log.warning("could not write the registry checkpoint: %s", e)

    def summary(self) -> dict[str, Any]:
        return {"worker": self.es.worker, "stream": self.es.stream, "sessions": len(self.store.registry),
                "conflicts": self.es.conflicts, "retries": self.es.retries, "swept": len(self.swept),
                "lost": len(self.lost)}
