"""The generic streams' space on the JetStream backend: a stream of its own
beside the sessions' (`<stream>-DS`, one subject a stream's log:
`ds.<stream>.<log id>`), shared by every worker.

Each worker folds every worker's records from its tail (`on_remote`), so any
worker serves any stream, live readers included. A stream's log id is the
same on every worker (a hash of its owner and name): two workers making one
name race for one log, and the loser finds the winner's stream. The log
refuses an append that another worker's beat to it (`refuse_conflicts`)
instead of rebasing it: the space folds the log again (`on_reset`) and
checks the append anew, so that a producer's sequence, Stream-Seq and a
closure hold across workers as on one (an append after another worker's
close is refused, a producer's retry through another worker is a
duplicate).

A fork is served once it is linked: its maker writes a record naming it
(`StreamForkLinked`) to its source's log, fenced, after the fork's own log.
A delete of the source is a soft-delete record in the same log first, and
its removal waits until the deleter has caught up and counts the forks it
finds, linked or not (domain/streamspace.py: _withdraw, _remove_unread):
so a link that came first keeps the source, and a link that comes after
the soft delete is refused (the fork is removed, its creation refused). A
fork that other workers see made but never linked (its maker died or
stalled) is not served, counts for its source, and is dropped after
LINK_SECONDS by a record of its own in the source's log (fenced against a
late link)."""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final

import trio

from sessionlog_store.eventstore.errors import EventStoreError, SeqConflict, UnknownSession
from sessionlog_store.eventstore.events import SessionDeleted, StreamForkLinked, StreamOpened
from sessionlog_store.eventstore.jetstream.natsio import enter_answered
from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog, open_jetstream_log
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.dstream import Refused, StreamState
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.streamspace import MAX_CONFLICTS, StreamSpace

log = logging.getLogger("sessionlog.streams")

# A fork seen made and not linked for this long is dropped (its maker died
# or stalled; a maker that comes back finds its link refused).
LINK_SECONDS: Final = 30.0


class SharedStreamSpace(StreamSpace):
    """The space of one worker among several: the others' records folded in
    as the tail or a conflict brings them."""

    def __init__(self, es: JetStreamLog) -> None:
        super().__init__(es, shared=True, catch_up=es.caught_up, purge_tombstoned=es.purge_tombstoned)
        self._orphans: dict[str, float] = {}  # log id: the creation time of the orphan fork doomed there
        self._pending: dict[str, float] = {}  # forks made, not linked yet: when this worker first saw them
        # Links (or drops) seen before their fork's creation (a conflict's
        # refold reads a source's log ahead of the tail): fork log id ->
        # (its created_at, dropped, when seen).
        self._early: dict[str, tuple[float, bool, float]] = {}
        self._unsure: set[str] = set()  # forks a refold read ahead of the tail, their source unknown here
        es.remote_listeners.append(self.on_remote)
        es.reset_listeners.append(self.on_reset)

    def on_remote(self, log_id: str, records: list[Record], told: bool) -> None:
        """Another worker's records of a stream's log, as the tail brings them
        (durable: readers see them at once). `told` False: a conflict's
        refold had them (on_reset)."""
        if not told:
            return
        for rec in records:
            ev = rec.event
            st = self.logs.get(log_id)
            if isinstance(ev, StreamForkLinked):
                self._on_link(ev)
            if isinstance(ev, StreamOpened):
                if st is not None:  # (deleted and made again, the tombstone unseen)
                    self._forget(st, doom=False)
                self._adopt(log_id, [rec])
            elif st is None:
                continue
            elif isinstance(ev, SessionDeleted):
                self._forget(st, doom=False)
            else:
                if log_id in self._soft:  # (its expiry decided here, not written yet: decided again)
                    self._soft.discard(log_id)
                    st.soft_deleted = False
                before = st.cost
                st.apply(rec)
                self._bytes[st.owner] = self._bytes.get(st.owner, 0) + st.cost - before
                st.durable, st.ended = len(st.units), st.closed
                self._access[log_id] = max(self._access.get(log_id, 0.0), rec.ts)
                self._shared_access[log_id] = max(self._shared_access.get(log_id, 0.0), rec.ts)
                self._notify(st)
                self._unread_if_so(st)

    def _unread_if_so(self, st: StreamState) -> None:
        """(Shared) A soft-deleted stream no fork here reads is for removal
        (by every worker that sees it so: their fenced tombstones make one)."""
        if st.soft_deleted and st.refcount <= 0:
            self._unread.add(st.log_id)
            self._wake.set()

    def on_reset(self, log_id: str, records: list[Record], end: int) -> None:
        """A conflict: this worker's appends to the log were refused (another
        worker's came first); the stream is folded again from `records`, the
        log as it now stands (none: it is gone)."""
        first = records[0].event if records else None
        if log_id in self._doomed:
            if not (isinstance(first, StreamOpened) and first.created_at != self._orphans.get(log_id)):
                return  # (removed here: its tombstone is tried again)
            self._doomed.discard(log_id)  # (an orphan's name made again: the new stream is folded)
        self._refold(log_id, records)
        for rec in records:  # (its forks' links, ahead of the tail)
            if isinstance(rec.event, StreamForkLinked):
                self._on_link(rec.event)

    def _refold(self, log_id: str, records: list[Record]) -> None:
        st = self.logs.get(log_id)
        first = records[0].event if records else None
        if not records or isinstance(records[-1].event, SessionDeleted):
            if st is not None:
                self._forget(st, doom=False)
            return
        if st is not None and isinstance(first, StreamOpened) and first.created_at != st.created_at:
            self._forget(st, doom=False)  # (deleted and made again elsewhere: another stream, maybe another fork)
            st = None
        if st is None or not isinstance(first, StreamOpened):
            self._adopt(log_id, records, ordered=False)  # (or says why it cannot)
            return
        before = st.cost
        st.refold(first, records, self._source_of.get(log_id))
        self._bytes[st.owner] = self._bytes.get(st.owner, 0) + st.cost - before
        last = max(r.ts for r in records)  # (another worker's access, for the expiry)
        self._access[log_id] = max(self._access.get(log_id, 0.0), last)
        self._shared_access[log_id] = max(self._shared_access.get(log_id, 0.0), last)
        self._notify(st)
        self._unread_if_so(st)

    def _adopt(self, log_id: str, records: list[Record], *, ordered: bool = True) -> None:
        """A stream another worker made (its log's records so far). Not
        `ordered` (a conflict's refold, read ahead of the tail): a fork whose
        source is not known here yet is left for after a catch-up."""
        first = records[0].event
        if not isinstance(first, StreamOpened):
            log.warning("stream log %s does not start with its creation: not served", log_id)
            return
        src = self.logs.get(first.forked_from) if first.forked_from is not None else None
        if src is not None and first.source_created is not None and src.created_at != first.source_created:
            src = None  # (a fork of the name's earlier stream)
        if first.forked_from is not None and src is None:
            if not ordered:
                self._unsure.add(log_id)
                self._wake.set()
                return
            # (the tail brings a source's creation before its forks': its
            # removal came before this fork's creation, whose link then fails)
            log.warning("stream %r: its fork source's log %s is gone: removed", first.name, first.forked_from)
            self._doom(log_id, first.created_at)
            return
        st = StreamState.folded(log_id, first, records, src)
        if src is not None:
            self._forked(st, src)
        self.logs[log_id] = st
        self._access[log_id] = self._shared_access[log_id] = max(r.ts for r in records)
        self._counted(st, +1)
        self._doomed.discard(log_id)  # (made again after an orphan's removal was decided)
        self._orphans.pop(log_id, None)
        if src is None:
            self._serve(st)
            self._unread_if_so(st)
            return
        self._pending[log_id] = time.time()  # (served once its link is seen)
        early = self._early.pop(log_id, None)
        if early is not None and early[0] == st.created_at:
            self._on_link(StreamForkLinked(fork=log_id, created_at=st.created_at, dropped=early[1]))

    def _serve(self, st: StreamState) -> None:
        old = self.streams.get((st.owner, st.name))
        if old is not None and old is not st and not old.soft_deleted:
            self._forget(old, doom=False)
        self.streams[(st.owner, st.name)] = st
        self._notify(st)

    def _on_link(self, ev: StreamForkLinked) -> None:
        """A fork's link (it is served from now on) or its drop (it never
        will be: forgotten here, its log removed by the dropper)."""
        fork = self.logs.get(ev.fork)
        if fork is None or fork.created_at != ev.created_at:
            self._early[ev.fork] = (ev.created_at, ev.dropped, time.time())  # (its creation not here yet)
            return
        self._pending.pop(ev.fork, None)
        if self.streams.get((fork.owner, fork.name)) is fork:
            return  # (served already)
        # (a fork of this worker's own, its link not written yet, is not
        # pending until its link starts: a drop before then counts too)
        if ev.dropped:
            self._forget(fork, doom=False)
            self._doom(fork.log_id, fork.created_at)  # (by every worker: its dropper may die first)
        else:
            self._serve(fork)

    def _doom(self, log_id: str, created_at: float) -> None:
        """A log for removal (its tombstone, fenced, and its purge) by the
        sweeper, unless the name is made again meanwhile (on_reset)."""
        self._doomed.add(log_id)
        self._orphans[log_id] = created_at
        self._wake.set()

    # -- a fork made here: its link ------------------------------------------

    async def _fork_made(self, fork: StreamState, source: StreamState) -> None:
        """Link the fork (a record naming it in its source's log, fenced):
        refused if the source's soft delete or removal, or another worker's
        drop of this fork, came first; then the fork's log is removed and
        the creation Refused. Another worker that deletes the source after
        the link finds the fork (it catches up first) and keeps the source."""
        self._pending[fork.log_id] = time.time()
        early = self._early.pop(fork.log_id, None)
        if early is not None and early[0] == fork.created_at:  # (its drop folded before its log was here)
            self._on_link(StreamForkLinked(fork=fork.log_id, created_at=fork.created_at, dropped=early[1]))
        link = StreamForkLinked(fork=fork.log_id, created_at=fork.created_at)
        refused = Refused(503, "busy", f"stream {source.name!r}: other servers' appends came first: try again")
        dropped = Refused(503, "busy", "the fork was dropped by another server (its link came too late): try again")
        for _ in range(MAX_CONFLICTS):
            if self.logs.get(fork.log_id) is not fork:
                raise dropped  # (its log is doomed by every worker that folds the drop)
            if self.logs.get(source.log_id) is not source:
                refused = Refused(404, "unknown_stream", f"no source stream {source.name!r} (deleted meanwhile)")
                break
            if source.soft_deleted:
                refused = Refused(409, "stream_gone", f"source stream {source.name!r} was deleted")
                break
            try:
                # (shielded: a link that landed unseen, its request cancelled,
                # would be dropped by this worker's own sweeper later)
                with trio.CancelScope(shield=True):
                    async with self._writing.setdefault(source.log_id, trio.Lock()):
                        await self.es.append_many(source.log_id, [link])
            except SeqConflict:
                continue  # (on_reset folded what came first: looked at again)
            except UnknownSession:
                continue  # (removed meanwhile: on_reset forgot it)
            if self.logs.get(fork.log_id) is not fork:
                # Another worker's drop came first and was folded while the
                # link was written (its fence then included the drop): the
                # link landed after it, and every worker forgets the fork.
                raise dropped
            self._pending.pop(fork.log_id, None)
            self._shared_access[source.log_id] = time.time()
            return
        await self._discard(fork)
        raise refused

    async def _discard(self, fork: StreamState) -> None:
        """Remove a fork that was never served (not linked): its tombstone,
        then its log purged."""
        self._pending.pop(fork.log_id, None)
        if self.logs.get(fork.log_id) is fork:
            self._forget(fork, doom=False)
        try:
            async with self._writing.setdefault(fork.log_id, trio.Lock()):
                await self.es.append_many(fork.log_id, [SessionDeleted()])
            if self.purge_tombstoned is not None:
                await self.purge_tombstoned(fork.log_id)
        except (SeqConflict, UnknownSession):
            pass  # (removed by another worker, or the name made again)
        except (EventStoreError, OSError) as e:
            log.error("removing the unlinked fork %r failed: %s (tried again by the sweeper)", fork.name, e)
            self._doom(fork.log_id, fork.created_at)

    async def _look_again(self) -> None:
        """The forks a refold read ahead of the tail, their source unknown
        there: after a catch-up (outside the lifecycle lock: creates and
        deletes go on) their source is known, or gone (an orphan)."""
        if not self._unsure:
            return
        why = await self.caught_up()
        if why is not None:  # (an election): at the next sweep
            log.info("forks to look at again wait to catch up with the other workers (%s)", why)
            self._wake.set()  # (again at once: each try waits CATCH_UP_SECONDS)
            return
        for fid in sorted(self._unsure):
            self._unsure.discard(fid)
            if fid in self.logs:
                continue
            try:
                records = await self.es.read(fid)
            except (UnknownSession, EventStoreError):
                continue  # (gone meanwhile)
            if records and fid not in self.logs:
                self._adopt(fid, records)

    async def _sweep_forks(self) -> None:
        """Drop the forks seen made and not linked for LINK_SECONDS: a drop
        record in the source's log (fenced: refused if the link came
        first), then the fork's log removed."""
        now = time.time()
        for fid, seen in sorted(self._pending.items()):
            fork = self.logs.get(fid)
            if fork is None:
                del self._pending[fid]
                continue
            if now - seen < LINK_SECONDS:
                continue
            src = self._source_of.get(fid)
            if src is not None and self.logs.get(src.log_id) is src:
                try:
                    async with self._writing.setdefault(src.log_id, trio.Lock()):
                        await self.es.append_many(src.log_id, [StreamForkLinked(fork=fid, created_at=fork.created_at,
                                                                                dropped=True)])
                except SeqConflict:
                    continue  # (on_reset folded what came first, its link maybe: looked at again)
                except UnknownSession:
                    pass
            if self.logs.get(fid) is fork and fid in self._pending:
                log.warning("stream %r: a fork not linked %d s after it was made (its maker died or stalled): "
                            "dropped", fork.name, int(now - seen))
                await self._discard(fork)
        for fid, (_, _, seen) in list(self._early.items()):
            if now - seen > LINK_SECONDS:
                del self._early[fid]


def space_stream(config: StoreConfig) -> tuple[str, str]:
    """The JetStream stream of a worker's generic streams, and its subjects' prefix."""
    return f"{config.stream}-DS", f"ds.{config.stream}"


@asynccontextmanager
async def open_shared_stream_space(config: StoreConfig) -> AsyncIterator[SharedStreamSpace]:
    """The space every worker on `config.stream` shares (its stream made if
    missing), every stream on it folded when the block starts, its sweeper
    running until the block exits."""
    spaces: list[SharedStreamSpace] = []

    async def attach(es: JetStreamLog) -> int:  # (before the replay: it reaches the space)
        spaces.append(SharedStreamSpace(es))
        return 0
    stream, prefix = space_stream(config)
    async with AsyncExitStack() as stack:
        # (like the worker's store: a start the cluster does not answer is made again)
        await enter_answered(stack, lambda: open_jetstream_log(
            list(config.backend), stream=stream, prefix=prefix, replicas=config.replicas, replay=True, seed=attach,
            retry_for=config.publish_retry, refuse_conflicts=True, create=config.make_stream),
            retry_for=config.publish_retry, what="the stream space")
        space = spaces[-1]  # (the start that was answered)
        async with trio.open_nursery() as nursery:
            await nursery.start(space.run)
            yield space
            nursery.cancel_scope.cancel()
