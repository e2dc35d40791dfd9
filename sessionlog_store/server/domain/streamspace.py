"""The generic namespace of the Durable Streams protocol: the streams an app
creates under /v1/stream/ (PUT, POST, GET, HEAD, DELETE: edge/namespace.py
speaks the HTTP), on the store's engine. Each stream is a log of its own in
an event log (the local engine's: a data root `streams/` beside the
sessions', with its journal and group commit, server/local/streamspace.py),
folded into a StreamState (projections/dstream.py).

Theory of operation
-------------------
- Durable before acknowledged: a create is its log's creation (its first
  records, fsynced); an append is one record, answered once its batch is
  durable. Readers see a unit only once it is durable (`StreamState.durable`),
  so nothing a reader was shown is lost by a crash.
- Ordered without a lock per append: an append is checked (closure, content
  type, producer, Stream-Seq) and applied to the state before the first
  await, then enqueued in the same step; its producer's next request, even if
  it arrives first, sees the state after it. A create or delete holds the
  space's lifecycle lock (they create and remove logs).
- A stream belongs to one owner (the user that made it; anonymous streams,
  edge/namespace.py, are an owner of their own): another owner's name is a
  different stream.
- Expiry (Stream-TTL, sliding on reads and writes; Stream-Expires-At) is
  checked on every access and swept every SWEEP_SECONDS; an expired stream
  with forks is soft-deleted (gone to clients, kept for the forks). The TTL's
  window restarts when the server starts (last accesses are not logged).
- A deleted stream's log gets a tombstone, then is removed; a start that
  finds a tombstone (or a soft-deleted stream no fork reads) finishes that.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, NamedTuple

import trio

from sessionlog_store.eventstore.backend import EventLog
from sessionlog_store.eventstore.errors import EventStoreError, SeqConflict, SessionExists, UnknownSession
from sessionlog_store.eventstore.events import SessionDeleted, StreamAppended, StreamOpened, StreamSoftDeleted
from sessionlog_store.eventstore.ids import new_session_id
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.dstream import (UNIT_COST, Refused, StreamState, creation, encode_offset,
                                                  expiry_of, json_unit, media_type, stream_log_id)

log = logging.getLogger("sessionlog.streams")

SWEEP_SECONDS: Final = 10.0
DEFAULT_TYPE: Final = "application/octet-stream"
# What one owner may keep (429 limit_streams past it): every stream's bytes
# are held in memory while the server runs and read back at each start.
MAX_OWNER_BYTES: Final = 256 * 1024 * 1024
MAX_OWNER_STREAMS: Final = 10_000
# On a shared backend: an append refused this many times for other workers'
# appends coming first is answered 503 (the next try is the client's).
MAX_CONFLICTS: Final = 20
# (shared) How long a request waits to know what other workers acknowledged
# before it (a leader election): then it is answered from what is known.
CATCH_UP_SECONDS: Final = 5.0


class Appended(NamedTuple):
    status: int                  # 200 (a producer's new append), 204
    headers: dict[str, str]


class StreamSpace:
    """Every generic stream of one server."""

    def __init__(self, es: EventLog, *, max_owner_bytes: int = MAX_OWNER_BYTES,
                 max_owner_streams: int = MAX_OWNER_STREAMS, shared: bool = False,
                 catch_up: Callable[[], Awaitable[None]] | None = None,
                 purge_tombstoned: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.es = es
        # (shared) Returns once every other worker's record acknowledged before is folded here.
        self.catch_up = catch_up
        # (shared) Purges a log that ends with its tombstone.
        self.purge_tombstoned = purge_tombstoned
        # Workers share the log (JetStream: SharedStreamSpace, in
        # server/scaleout/streamspace.py, folds the other workers' records
        # in); a stream's appends go one at a time.
        self.shared = shared
        self._writing: dict[str, trio.Lock] = {}  # (shared) a stream's append in flight
        self._shared_access: dict[str, float] = {}  # (shared) the last access every worker knows of
        self._touch: set[str] = set()  # (shared) streams read here since: their touch to write
        self.streams: dict[tuple[str, str], StreamState] = {}   # (owner, name): live and soft-deleted
        self.logs: dict[str, StreamState] = {}                  # log id: live and soft-deleted
        self.damaged: dict[str, str] = {}                       # log id: what is wrong (read-only)
        self.unreadable: dict[str, str] = {}                    # damaged before their first record: not loaded
        self.max_owner_bytes, self.max_owner_streams = max_owner_bytes, max_owner_streams
        self._bytes: dict[str, int] = {}   # owner: its streams' own bytes
        self._count: dict[str, int] = {}   # owner: its streams
        self._access: dict[str, float] = {}
        self._changed: dict[str, trio.Event] = {}
        self._lifecycle = trio.Lock()
        self._doomed: set[str] = set()  # logs to remove (expired, deleted, left over)
        # A fork's log id: its source (the object: on a shared backend a
        # name's log id is the same for a stream made again under it).
        self._source_of: dict[str, StreamState] = {}
        self._soft: set[str] = set()    # expired under forks (shared: every expiry): their soft delete to write
        # (shared) Soft-deleted streams no fork here reads: removed once this
        # worker has caught up with the others (a fork made elsewhere before
        # the soft delete is then known: its source stays).
        self._unread: set[str] = set()
        self._wake = trio.Event()       # the sweeper has work

    # -- start -------------------------------------------------------------

    def load(self, logs: dict[str, list[Record]], damaged: dict[str, str] | None = None) -> list[str]:
        """Fold the logs a start found (tombstoned ones left out by the
        caller; `damaged`: logs read-only for damage, with what is wrong);
        returns the ids of logs to remove: a name's older log (a crash
        between an expiry and its removal), a fork whose source is gone, a
        soft-deleted stream no fork reads, an expired one. A damaged log is
        never removed: its stream answers 409 read_only until it is repaired
        (`sessionlog repair --root <data root>/streams <log id>`)."""
        damaged = damaged or {}
        states: dict[str, StreamState] = {}
        for log_id, records in logs.items():
            if not records or not isinstance(records[0].event, StreamOpened):
                if log_id in damaged:
                    log.error("stream log %s is damaged before its first record (%s): not loaded; "
                              "`sessionlog repair --root <data root>/streams %s`", log_id, damaged[log_id], log_id)
                    self.unreadable[log_id] = damaged[log_id]
                    continue
                log.warning("stream log %s does not start with its creation: removed", log_id)
                self._doomed.add(log_id)
                continue
            if log_id in damaged:
                self.damaged[log_id] = damaged[log_id]
            st = StreamState.opened(log_id, records[0].event)
            for rec in records[1:]:
                st.apply(rec)
            st.durable, st.ended = len(st.units), st.closed
            states[log_id] = st
        done: set[str] = set()
        # A source is created before its forks: in creation order each fork
        # finds its source resolved (no recursion: a chain may be long).
        for st in sorted(states.values(), key=lambda s: s.created_at):
            src = states.get(st.forked_from) if st.forked_from is not None else None
            if st.forked_from is not None:
                if st.forked_from in self.unreadable or st.forked_from in self.damaged:
                    self.damaged[st.log_id] = f"its fork source's log {st.forked_from} is damaged"
                if src is None or st.forked_from not in done:
                    if st.log_id in self.damaged:  # (kept for a repair of its source, read-only meanwhile)
                        self.logs[st.log_id] = st
                        self.streams.setdefault((st.owner, st.name), st)
                        continue
                    log.warning("stream %r: its fork source is gone: removed", st.name)
                    self._doomed.add(st.log_id)
                    continue
                st.inherit(src)
                self._forked(st, src)
            done.add(st.log_id)
            key = (st.owner, st.name)
            old = self.streams.get(key)
            if old is not None and not old.soft_deleted:  # the newer one is the stream
                self._doomed.add(old.log_id)
            self.streams[key] = st
            self.logs[st.log_id] = st
        now = time.time()
        for st in self.logs.values():
            self._access[st.log_id] = now
        for st in list(self.logs.values()):
            if st.log_id in self._doomed:
                self.logs.pop(st.log_id, None)
                continue
            self._counted(st, +1)
            if st.soft_deleted and st.refcount == 0:
                self._forget(st)
        for st in list(self.streams.values()):
            self._expired(st)  # (one past its Stream-Expires-At goes now)
        return sorted(self._doomed)

    def _counted(self, st: StreamState, sign: int) -> None:
        """A stream counts against its owner's quota from its creation until
        it is forgotten (a soft-deleted one still holds its bytes)."""
        self._bytes[st.owner] = self._bytes.get(st.owner, 0) + sign * st.cost
        self._count[st.owner] = self._count.get(st.owner, 0) + sign

    # -- lookups -----------------------------------------------------------

    def find(self, owner: str, name: str, *, touch: bool = True) -> StreamState:
        """The stream, or Refused 404 (none, or expired) / 410 (soft-deleted)."""
        st = self.streams.get((owner, name))
        if st is not None and self._expired(st):
            st = self.streams.get((owner, name))
        if st is None or (st.soft_deleted and st.refcount <= 0):  # (shared: its removal under way)
            raise Refused(404, "unknown_stream", f"no stream {name!r}")
        if st.soft_deleted:
            raise Refused(410, "stream_gone", f"stream {name!r} was deleted (forks still read from it)")
        if st.log_id in self.damaged:
            raise Refused(409, "read_only", f"stream {name!r}'s log is damaged ({self.damaged[st.log_id]}): "
                          f"read-only until `sessionlog repair --root <data root>/streams {st.log_id}`")
        if touch:
            now = self._access[st.log_id] = time.time()
            if self.shared and st.ttl is not None and now - self._shared_access.get(st.log_id, 0.0) > st.ttl / 4:
                self._touch.add(st.log_id)  # (the sweeper writes it: other workers' expiry sees the read)
                self._wake.set()
        return st

    def _expired(self, st: StreamState) -> bool:
        """Whether the stream expired (and is now gone or soft-deleted)."""
        if st.log_id in self.damaged or \
                expiry_of(st, self._access.get(st.log_id, 0.0), shared=self.shared) > time.time():
            return False  # (a damaged stream stays as it is until its repair)
        if st.soft_deleted:
            return True
        if st.refcount > 0 or self.shared:  # (shared: a fork made elsewhere may not be known here yet)
            st.soft_deleted = True
            self._soft.add(st.log_id)  # (its record: the sweeper's, at once)
            self._wake.set()
        else:
            self._forget(st)
        self._notify(st)
        return True

    def _forget(self, st: StreamState, *, doom: bool = True) -> None:
        """Drop a stream with no forks (its log removed later, by the sweeper;
        not `doom`: removed by another worker), and up its fork chain each
        soft-deleted source whose last fork it was, removed here (a loop: a
        chain may be long; another worker removing it too finds it gone)."""
        cur: StreamState | None = st
        while cur is not None:
            if self.logs.pop(cur.log_id, None) is cur:
                self._counted(cur, -1)
            if self.streams.get((cur.owner, cur.name)) is cur:
                del self.streams[(cur.owner, cur.name)]
            self._access.pop(cur.log_id, None)
            self._shared_access.pop(cur.log_id, None)
            self._writing.pop(cur.log_id, None)
            self._notify(cur)
            if doom or cur is not st:
                self._doomed.add(cur.log_id)
            src = self._source_of.pop(cur.log_id, None)
            cur = None
            if src is not None:
                src.refcount -= 1
                if src.refcount <= 0 and src.soft_deleted and self.logs.get(src.log_id) is src:
                    if self.shared:
                        self._unread.add(src.log_id)  # (removed by the sweeper, once it is sure no fork came)
                    else:
                        cur = src
        self._wake.set()

    def _forked(self, fork: StreamState, source: StreamState) -> None:
        source.refcount += 1
        self._source_of[fork.log_id] = source

    def _notify(self, st: StreamState) -> None:
        ev = self._changed.pop(st.log_id, None)
        if ev is not None:
            ev.set()

    async def synced(self) -> None:
        """(Shared) Before a request is decided: what other workers
        acknowledged before it is known here (a write on one worker, then a
        read on another, reads it)."""
        why = await self.caught_up()
        if why is not None:
            log.warning("could not catch up with the other workers (%s): answered from what is known here", why)

    async def caught_up(self) -> str | None:
        """(Shared) Wait, at most CATCH_UP_SECONDS, until what the other
        workers acknowledged before is folded here; None once it is, else
        why not (an election, a node lost). At once without other workers."""
        if self.catch_up is None:
            return None
        try:
            with trio.fail_after(CATCH_UP_SECONDS):
                await self.catch_up()
        except Exception as e:  # noqa: BLE001 - (told to the caller, which decides from memory or later)
            return str(e) or "no answer"
        return None

    def wake_all(self) -> None:
        """Wake every reader waiting on a stream (a stop: they look again)."""
        for ev in self._changed.values():
            ev.set()
        self._changed.clear()

    def changed(self, st: StreamState) -> trio.Event:
        """Set at the stream's next change (a durable append, its close, its end)."""
        if self.logs.get(st.log_id) is not st:
            done = trio.Event()
            done.set()  # (gone: nothing more will change)
            return done
        ev = self._changed.get(st.log_id)
        if ev is None:
            ev = self._changed[st.log_id] = trio.Event()
        return ev

    async def log_bytes(self, log_id: str) -> bytes:
        """A stream's log as it stands, what was appended here acknowledged
        first (what only a journal holds included): an export's copy."""
        await self.es.flush(log_id)
        return await self.es.log_bytes(log_id)

    def gone(self, st: StreamState) -> bool:
        return self.logs.get(st.log_id) is not st or st.soft_deleted or self._expired(st)

    # -- create ------------------------------------------------------------

    async def create(self, owner: str, name: str, *, content_type: str | None, ttl: int | None,
                     expires_at: str | None, closed: bool, data: bytes, forked_from: str | None = None,
                     fork_offset: int | None = None, fork_sub: int = 0) -> tuple[StreamState, bool]:
        """Create the stream (True), or find it made alike (False); Refused
        409 if it exists otherwise, 404/409/400 for a fork's source. (Shared:
        another worker that made it first makes this a find.)"""
        for _ in range(MAX_CONFLICTS):
            try:
                return await self._create(owner, name, content_type=content_type, ttl=ttl, expires_at=expires_at,
                                          closed=closed, data=data, forked_from=forked_from,
                                          fork_offset=fork_offset, fork_sub=fork_sub)
            except (SessionExists, SeqConflict):
                if not self.shared:
                    raise
                # (another worker made its log meanwhile: on_reset folded it)
            except UnknownSession:
                if not self.shared or self.purge_tombstoned is None:
                    raise
                # The name's last log ends with its tombstone, not purged yet
                # (its deleter is about to, or died first): purged here.
                await self.purge_tombstoned(stream_log_id(owner, name))
        raise Refused(503, "busy", f"stream {name!r} is being made and removed by other servers: try again")

    async def _create(self, owner: str, name: str, *, content_type: str | None, ttl: int | None,
                      expires_at: str | None, closed: bool, data: bytes, forked_from: str | None,
                      fork_offset: int | None, fork_sub: int) -> tuple[StreamState, bool]:
        async with self._lifecycle:
            existing = self.streams.get((owner, name))
            if existing is not None and self._expired(existing):
                existing = self.streams.get((owner, name))
            if existing is not None and existing.soft_deleted and existing.refcount <= 0:
                if not await self._remove_unread(existing):  # (shared: its removal under way: done now)
                    self._unread.add(existing.log_id)
                existing = self.streams.get((owner, name))
                if existing is not None and existing.soft_deleted and existing.refcount <= 0:
                    raise Refused(503, "busy", f"stream {name!r} is being removed: try again")
            if existing is not None and existing.soft_deleted:
                raise Refused(409, "stream_exists", f"stream {name!r} was deleted but forks still read from it: "
                              "its name is not free until they are gone")
            source: StreamState | None = None
            if forked_from is not None:
                source = self._source(owner, forked_from)
            ctype = content_type or (source.content_type if source is not None else DEFAULT_TYPE)
            if source is not None and media_type(ctype) != media_type(source.content_type):
                raise Refused(409, "content_type_mismatch",
                              f"a fork's content type is its source's ({source.content_type})")
            if source is not None and ttl is None and expires_at is None:
                ttl, expires_at = source.ttl, source.expires_at
            if existing is not None:
                if not existing.made_alike(ctype, ttl=ttl, expires_at=expires_at, closed=closed, source=source,
                                           fork_offset=fork_offset, fork_sub=fork_sub):
                    raise Refused(409, "stream_exists", f"stream {name!r} exists with another configuration")
                self._access[existing.log_id] = time.time()
                return existing, False
            opened, events, size = creation(owner, name, ctype, ttl=ttl, expires_at=expires_at, closed=closed,
                                            data=data, source=source, fork_offset=fork_offset, fork_sub=fork_sub,
                                            now=time.time())
            self._room(owner, size, new_stream=True)
            log_id = stream_log_id(owner, name) if self.shared else new_session_id()
            if log_id in self.logs:  # (shared: a fork made on another worker, not linked yet)
                raise Refused(503, "busy", f"stream {name!r} is being made by another server: try again")
            if log_id in self._doomed:  # (shared: this name's last stream, expired, its removal still to write)
                await self._remove_doomed()
            appended = await self.es.create(log_id, events)
            st = StreamState.opened(log_id, opened)
            if source is not None:
                st.inherit(source)
                self._forked(st, source)
            for a in appended[1:]:
                st.apply(a.record)
            st.durable, st.ended = len(st.units), st.closed
            self.logs[log_id] = st
            self._access[log_id] = self._shared_access[log_id] = time.time()
            self._counted(st, +1)
            if source is not None:
                await self._fork_made(st, source)
            self.streams[(owner, name)] = st
            return st, True

    async def _fork_made(self, fork: StreamState, source: StreamState) -> None:
        """A fork's log is made (shared: it is linked to its source, or
        removed and Refused)."""

    def _room(self, owner: str, size: int, *, new_stream: bool = False) -> None:
        """Refuse (429 limit_streams) what would take the owner past its share."""
        if new_stream and self._count.get(owner, 0) >= self.max_owner_streams:
            raise Refused(429, "limit_streams", f"at most {self.max_owner_streams} streams a user")
        if self._bytes.get(owner, 0) + size > self.max_owner_bytes:
            raise Refused(429, "limit_streams", f"at most {self.max_owner_bytes // 2**20} MiB of streams a user: "
                          "delete some first")

    def _source(self, owner: str, name: str) -> StreamState:
        st = self.streams.get((owner, name))
        if st is not None and self._expired(st):
            st = None
        if st is None or (st.soft_deleted and st.refcount <= 0):
            raise Refused(404, "unknown_stream", f"no source stream {name!r}")
        if st.soft_deleted:
            raise Refused(409, "stream_gone", f"source stream {name!r} was deleted")
        return st

    # -- append ------------------------------------------------------------

    async def append(self, st: StreamState, body: bytes, *, content_type: str | None, close: bool,
                     producer: tuple[str, int, int] | None, stream_seq: str | None) -> Appended:
        """One POST (section 5.2): checked and applied before any await, then
        answered once durable. (Shared: one at a time a stream; one that
        another worker's append beat to the log is checked again against the
        log as it now stands, and made again.)"""
        if not self.shared:
            return await self._append(st, body, content_type=content_type, close=close, producer=producer,
                                      stream_seq=stream_seq)
        async with self._writing.setdefault(st.log_id, trio.Lock()):
            for _ in range(MAX_CONFLICTS):
                if self.logs.get(st.log_id) is not st or st.soft_deleted:  # (deleted while this one waited)
                    raise Refused(404, "unknown_stream", f"no stream {st.name!r}")
                try:
                    return await self._append(st, body, content_type=content_type, close=close,
                                              producer=producer, stream_seq=stream_seq)
                except SeqConflict:
                    continue  # (on_reset folded the log again: decided anew)
                except UnknownSession:
                    raise Refused(404, "unknown_stream", f"no stream {st.name!r} (deleted meanwhile)") from None
        raise Refused(503, "busy", f"stream {st.name!r}: other servers' appends came first {MAX_CONFLICTS} "
                      "times: try again")

    async def _append(self, st: StreamState, body: bytes, *, content_type: str | None, close: bool,
                      producer: tuple[str, int, int] | None, stream_seq: str | None) -> Appended:
        if self.es.broken is not None:
            raise Refused(503, "store_broken", f"the streams' store failed: {self.es.broken}")
        if st.closed:
            if close and not body and producer is None:
                await self._settled(st)
                return Appended(204, self._tail(st, closed=True))
            if producer is not None and st.closed_by == producer:
                await self._settled(st)
                return Appended(204, {**self._tail(st, closed=True), "Producer-Epoch": str(producer[1]),
                                      "Producer-Seq": str(producer[2])})
            await self._settled(st)  # (the close it refuses for is durable before it is said)
            raise Refused(409, "stream_closed", "the stream is closed", self._tail(st, closed=True))
        if body:
            if not content_type:
                raise Refused(400, "bad_request", "an append needs a Content-Type")
            if media_type(content_type) != media_type(st.content_type):
                raise Refused(409, "content_type_mismatch",
                              f"this stream is {st.content_type}, not {content_type[:60]!r}")
        elif not close:
            raise Refused(400, "bad_request", "an empty append (no body and no Stream-Closed: true)")
        if producer is not None:
            pid, epoch, seq = producer
            try:
                verdict = st.check_producer(pid, epoch, seq)
            except Refused:
                await self._settled(st)  # (a refusal is said of durable state only)
                raise
            if verdict == "duplicate":
                await self._settled(st)  # (what it duplicates is durable before it is said to be stored)
                return Appended(204, {**self._tail(st, closed=st.closed), "Producer-Epoch": str(epoch),
                                      "Producer-Seq": str(st.producers[pid].seq)})
        if stream_seq is not None and st.stream_seq is not None and stream_seq <= st.stream_seq:
            raise Refused(409, "stream_seq_conflict",
                          f"Stream-Seq {stream_seq[:40]!r} is not after {st.stream_seq[:40]!r}")
        unit = json_unit(body) if body and st.json else body
        self._room(st.owner, len(unit) + UNIT_COST)
        ev = StreamAppended(data=unit, producer=producer[0] if producer else None,
                            epoch=producer[1] if producer else 0, pseq=producer[2] if producer else 0,
                            stream_seq=stream_seq, close=close)
        st.apply(Record(0, 0.0, ev))
        self._bytes[st.owner] = self._bytes.get(st.owner, 0) + (len(unit) + UNIT_COST if unit else 0)
        count = len(st.units)
        self._access[st.log_id] = self._shared_access[st.log_id] = time.time()
        # (append_many enqueues before its first await: the record's place in
        # the log is this step's, as the state's change is)
        await self.es.append_many(st.log_id, [ev])
        st.durable = max(st.durable, count)
        st.ended |= close
        self._notify(st)
        headers = self._tail(st, closed=close, at=st.ends[count - 1] if count else st.fork_offset)
        if producer is not None:
            headers.update({"Producer-Epoch": str(producer[1]), "Producer-Seq": str(producer[2])})
            return Appended(200 if body else 204, headers)
        return Appended(204, headers)

    async def _settled(self, st: StreamState) -> None:
        """Wait until every record of the stream enqueued so far is durable."""
        if st.log_id in self.es:
            await self.es.wait_durable(st.log_id, self.es.last_seq(st.log_id))

    def _tail(self, st: StreamState, *, closed: bool, at: int | None = None) -> dict[str, str]:
        h = {"Stream-Next-Offset": encode_offset(st.tail if at is None else at)}
        if closed:
            h["Stream-Closed"] = "true"
        return h

    # -- delete ------------------------------------------------------------

    async def delete(self, owner: str, name: str) -> None:
        for _ in range(MAX_CONFLICTS):
            try:
                return await self._delete(owner, name)
            except SeqConflict:  # (shared: another worker's append came first; on_reset folded it)
                continue
            except UnknownSession:  # (shared: another worker removed it meanwhile)
                raise Refused(404, "unknown_stream", f"no stream {name!r}") from None
        raise Refused(503, "busy", f"stream {name!r}: other servers' appends came first: try again")

    async def _delete(self, owner: str, name: str) -> None:
        async with self._lifecycle:
            st = self.find(owner, name, touch=False)
            if self.shared:
                await self._withdraw(st)
            elif st.refcount > 0:
                await self.es.append_many(st.log_id, [StreamSoftDeleted()])
                st.soft_deleted = True
                if st.refcount == 0:  # (its last fork went meanwhile: an expiry)
                    self._forget(st)
                    await self._remove_doomed()
            else:
                self._forget(st)
                await self._remove_doomed()
            self._notify(st)

    async def _remove_doomed(self) -> None:
        """Remove the doomed logs (a tombstone, then the log) and write the
        soft deletes of expiries. A damaged log is left as it is (logged);
        a failure is logged, never the server's end."""
        for log_id in sorted(self._soft):
            st = self.logs.get(log_id)
            if st is None or not st.soft_deleted:  # (shared: another worker's record took it back)
                self._soft.discard(log_id)
                if st is not None:
                    self._expired(st)  # (decided again, from the access it brought)
            elif log_id not in self.damaged and self.es.broken is None:
                try:
                    async with self._writing.setdefault(log_id, trio.Lock()):
                        if log_id not in self._soft:  # (shared: another worker's record came meanwhile)
                            continue
                        self._soft.discard(log_id)  # (and enqueued in the same step: the fence is this state's)
                        await self.es.append_many(log_id, [StreamSoftDeleted()])
                except SeqConflict:  # (shared: another worker's record came first, its refold took the flag back)
                    if self.logs.get(log_id) is st and not st.soft_deleted:
                        self._expired(st)  # (decided again: the other worker's access may have kept it)
                except UnknownSession:
                    pass  # (shared: another worker removed it; its tombstone reached on_remote)
                if self.shared and self.logs.get(log_id) is st and st.soft_deleted and st.refcount <= 0:
                    self._unread.add(log_id)
            else:
                self._soft.discard(log_id)  # (a damaged log stays as it is; a broken store writes nothing)
        for log_id in sorted(self._unread):
            st = self.logs.get(log_id)
            if st is None or await self._remove_unread(st):
                self._unread.discard(log_id)
        # (a log stays doomed until its removal is done: a conflict's refold,
        # on_reset, must not bring it back meanwhile)
        for log_id in sorted(self._doomed):
            if log_id not in self.es:
                self._doomed.discard(log_id)
                continue
            if log_id in self.damaged or self.es.corruption(log_id) is not None:
                log.error("stream log %s is damaged: left for `sessionlog repair --root <data root>/streams %s`",
                          log_id, log_id)
                self._doomed.discard(log_id)
                continue
            try:
                await self.es.append_many(log_id, [SessionDeleted()])
                if self.shared and self.purge_tombstoned is not None:
                    await self.purge_tombstoned(log_id)  # (up to its tombstone: the name may be made again)
                else:
                    await self.es.remove(log_id)
            except SeqConflict:  # (shared: another worker's append came first: again at once)
                self._wake.set()
                continue
            except UnknownSession:
                pass  # (shared: another worker removed it)
            except (EventStoreError, OSError) as e:
                log.error("removing stream log %s failed: %s", log_id, e)
            self._doomed.discard(log_id)

    async def _withdraw(self, st: StreamState) -> None:
        """(Shared) A delete: its soft-delete record (fenced: SeqConflict if
        another worker's record came first, which on_reset folded), then the
        removal if no fork reads it once this worker has caught up (a fork
        made elsewhere meanwhile keeps it: _remove_unread)."""
        async with self._writing.setdefault(st.log_id, trio.Lock()):
            await self.es.append_many(st.log_id, [StreamSoftDeleted()])
        st.soft_deleted = True
        self._notify(st)
        if st.refcount <= 0 and not await self._remove_unread(st):
            self._unread.add(st.log_id)  # (the sweeper's)

    async def _remove_unread(self, st: StreamState) -> bool:
        """(Shared) Remove a soft-deleted stream that no fork reads, once
        every record the others acknowledged before is folded here. A fork
        is made (its log) before it is linked (a touch of its source's log,
        fenced: refused after the source's soft delete), so a fork that
        holds is known by then, and keeps its source. The tombstone is
        fenced too: refused (a record came first), it is decided again at
        the next sweep; a catch-up that fails waits for it as well. False:
        not decided yet (for the sweeper)."""
        why = await self.caught_up()
        if why is not None:  # (an election): decided at the next sweep
            log.info("stream %r: its removal waits to catch up with the other workers (%s)", st.name, why)
            return False
        if self.logs.get(st.log_id) is not st or not st.soft_deleted or st.refcount > 0:
            return True
        try:
            async with self._writing.setdefault(st.log_id, trio.Lock()):
                await self.es.append_many(st.log_id, [SessionDeleted()])
        except SeqConflict:  # (on_reset folded what came first)
            self._wake.set()
            return False
        except UnknownSession:
            pass  # (another worker removed it)
        self._forget(st, doom=False)
        try:
            if self.purge_tombstoned is not None:
                await self.purge_tombstoned(st.log_id)
        except Exception as e:  # noqa: BLE001 - (the name's next creation purges it: `create`)
            log.warning("stream log %s: its purge failed (%s): done at the name's next creation", st.log_id, e)
        return True

    # -- the sweeper -------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Remove what a start doomed, then, every SWEEP_SECONDS, the streams
        that expired unread. Runs until cancelled."""
        task_status.started()
        while True:
            try:
                await self._write_touches()  # (first: a removal may wait to catch up)
                await self._look_again()
                async with self._lifecycle:
                    for st in list(self.streams.values()):
                        self._expired(st)
                    self._wake = trio.Event()
                    await self._remove_doomed()
                    await self._sweep_forks()
            except (EventStoreError, OSError, RecursionError, ValueError) as e:  # never the server's end
                log.error("the streams' sweep failed: %s (again at the next)", e)
            with trio.move_on_after(SWEEP_SECONDS):
                await self._wake.wait()

    async def _sweep_forks(self) -> None:
        """(Shared: forks made elsewhere and never linked are dropped.)"""

    async def _look_again(self) -> None:
        """(Shared: forks read ahead of the tail are looked at again.)"""

    async def _write_touches(self) -> None:
        """(Shared) Write a touch (an empty append) for each TTL stream read
        here a quarter of its TTL after the last access every worker knows
        of: their expiry counts it. A failure is tried at the next read."""
        touch, self._touch = self._touch, set()
        for log_id in sorted(touch):
            st = self.logs.get(log_id)
            if st is None or st.soft_deleted or log_id in self.damaged:
                continue  # (a closed stream takes a touch too: it changes nothing but its last access)
            try:
                async with self._writing.setdefault(log_id, trio.Lock()):
                    await self.es.append_many(log_id, [StreamAppended(data=b"")])
                self._shared_access[log_id] = time.time()
            except (EventStoreError, OSError) as e:
                log.info("stream %r: its touch was not written (%s)", st.name, e)

    async def settle_removals(self) -> None:
        """Write what an expiry decided (soft deletes, removals) before an
        answer says the stream is gone: a crash does not bring it back."""
        if self._soft or self._doomed:
            async with self._lifecycle:
                await self._remove_doomed()

    def names(self, owner: str) -> Sequence[str]:
        return sorted(n for (o, n) in self.streams if o == owner)
