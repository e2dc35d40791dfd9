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
duplicate)."""
from __future__ import annotations

from collections.abc import AsyncIterator
import logging
from contextlib import asynccontextmanager

import trio

from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog, open_jetstream_log
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.eventstore.events import SessionDeleted, StreamOpened
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.dstream import StreamState
from sessionlog_store.server.domain.streamspace import StreamSpace

log = logging.getLogger("sessionlog.streams")


class SharedStreamSpace(StreamSpace):
    """The space of one worker among several: the others' records folded in
    as the tail or a conflict brings them."""

    def __init__(self, es: JetStreamLog) -> None:
        super().__init__(es, shared=True, catch_up=es.caught_up, purge_tombstoned=es.purge_tombstoned)
        self._orphans: dict[str, float] = {}  # log id: the creation time of the orphan fork doomed there
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
            if isinstance(ev, StreamOpened):
                if st is not None:  # (deleted and made again, the tombstone unseen)
                    self._forget(st, doom=False)
                self._adopt(log_id, [rec])
            elif st is None:
                continue
            elif isinstance(ev, SessionDeleted):
                self._forget(st, doom=False)
            else:
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
        st = self.logs.get(log_id)
        first = records[0].event if records else None
        if log_id in self._doomed:
            if not (isinstance(first, StreamOpened) and first.created_at != self._orphans.get(log_id)):
                return  # (removed here: its tombstone is tried again)
            self._doomed.discard(log_id)  # (an orphan's name made again: the new stream is folded)
        if not records or isinstance(records[-1].event, SessionDeleted):
            if st is not None:
                self._forget(st, doom=False)
            return
        if st is not None and isinstance(first, StreamOpened) and first.created_at != st.created_at:
            self._forget(st, doom=False)  # (deleted and made again elsewhere: another stream, maybe another fork)
            st = None
        if st is None or not isinstance(first, StreamOpened):
            self._adopt(log_id, records)  # (or says why it cannot)
            return
        before = st.cost
        st.refold(first, records, self._source_of.get(log_id))
        self._bytes[st.owner] = self._bytes.get(st.owner, 0) + st.cost - before
        last = max(r.ts for r in records)  # (another worker's access, for the expiry)
        self._access[log_id] = max(self._access.get(log_id, 0.0), last)
        self._shared_access[log_id] = max(self._shared_access.get(log_id, 0.0), last)
        self._notify(st)
        self._unread_if_so(st)

    def _adopt(self, log_id: str, records: list[Record]) -> None:
        """A stream another worker made (its log's records so far)."""
        first = records[0].event
        if not isinstance(first, StreamOpened):
            log.warning("stream log %s does not start with its creation: not served", log_id)
            return
        src = self.logs.get(first.forked_from) if first.forked_from is not None else None
        if first.forked_from is not None and src is None:
            # (the tail brings a source's creation before its forks': its
            # removal came before this fork's creation, whose link then fails)
            log.warning("stream %r: its fork source's log %s is gone: removed", first.name, first.forked_from)
            self._doomed.add(log_id)
            self._orphans[log_id] = first.created_at
            self._wake.set()
            return
        st = StreamState.folded(log_id, first, records, src)
        if src is not None:
            self._forked(st, src)
        old = self.streams.get((st.owner, st.name))
        if old is not None and old is not st and not old.soft_deleted:
            self._forget(old, doom=False)
        self.streams[(st.owner, st.name)] = st
        self.logs[log_id] = st
        self._access[log_id] = self._shared_access[log_id] = max(r.ts for r in records)
        self._counted(st, +1)
        self._doomed.discard(log_id)  # (made again after an orphan's removal was decided)
        self._orphans.pop(log_id, None)
        self._unread_if_so(st)


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
    async with open_jetstream_log(list(config.backend), stream=stream, prefix=prefix, replicas=config.replicas,
                                  replay=True, seed=attach, retry_for=config.publish_retry,
                                  refuse_conflicts=True):
        space = spaces[0]
        async with trio.open_nursery() as nursery:
            await nursery.start(space.run)
            yield space
            nursery.cancel_scope.cancel()
