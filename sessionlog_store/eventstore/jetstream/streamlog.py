"""An event log on NATS JetStream: the contract of backend.py, kept by a
replicated stream instead of files, shared by several workers
(`sessionlog serve --backend nats://…`, server/scaleout/worker.py,
docs/SCALEOUT.md). The NATS plumbing is natsio.py.

Theory of operation
-------------------
One stream holds every session, one subject a session (`<prefix>.<id>`).
Appends run on the trio thread as in local/commit.py: each record gets the
session's next seq, is encoded to its exact log line and goes into the
filling batch; the listeners see it at once. The committer takes the batch
and makes it durable in one crossing into nats-py's asyncio loop (a thread
of its own; nats-py is asyncio-only): per session, one message holding its
new lines, all sessions' messages published at once (pipelined), in
JetStream atomic batches of up to 1,000 where the stream allows them
(`batched`; natsio.Publisher.publish_batched: one answer a batch, and a
batch refused whole goes out again one message at a time, so every
message still gets its own answer). Each carries
- `Nats-Msg-Id` `<id>:<incarnation>:<first seq>-<last seq>`: a retry is
  stored once, a session made again under a deleted id is not a retry;
- `Nats-Expected-Last-Subject-Sequence`: the stream sequence of the
  session's last message, so that a second writer of the session (another
  worker) is refused rather than interleaved (JetStream compares the
  subject's last *stream* sequence: there is no per-subject counter, so the
  records carry their own seq and the stream sequence is only the fence).
A batch is acknowledged when every message is (the servers fsync before
they ack: `sync_interval: always`, checked by the operator's setup). A
publish that gets no answer (a leader election) is sent again, same id, for
`retry_for` seconds (a rebase's read too); one that fails otherwise is
fatal, as a failed sync is for the files.

A publish refused by the fence (another writer appended to the session
since) is a conflict, not a failure: the log reads the session again, while
the other sessions' batches go on, and puts its unacknowledged records after
the other writer's, renumbered (a waiter's seq follows them); if that one
created or deleted the session, they are refused (SessionExists,
UnknownSession). What the listeners saw of that session is void: the
`reset_listeners` fold its records again as they now stand. While this log
has records of a session in flight, the tail's messages of it wait
(`deferred`): applied after the ack, read again by a rebase if before it.
Reading a session walks its subject with direct gets; removing one purges
its subject (after its tombstone record was appended and acknowledged); the
log's own tombstone refuses anything after it (a producer's last text).

Every log tails the stream from when it opened with an ordered consumer
(never a core subscription: those also receive publishes the stream
refused): another writer's messages (a header names it) reach this log's
listeners in order and move the session's seq and fence here, so any worker
can show, and append to, a session another wrote (tail.py). `caught_up`
waits until it has brought all the stream held when called.
"""
from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from ..backend import Appended, CommitStatistics, EventLog, Failed, RecordListener, append_each
from ..errors import (CorruptRecord, EventStoreError, RecordTooLarge, SeqConflict, SessionExists, StoreBroken,
                     StoreClosed, UnknownSession)
from ..events import Event, MessageFinalized, SessionDeleted
from ..ids import validate_session_id
from .natsio import (DIRECT_GETS, WRITER_HEADER, WRONG_LAST_SEQUENCE, AsyncioThread, connect, ensure_stream,
                     publish_answered, read_subject, send_again_at_elections, split_by_size,
                     unanswered)
from ..record import Record, encode_record, scan, with_ends
from .session import StreamSession
from .tail import Tail


log = logging.getLogger("sessionlog.jetstream")

class JetStreamLog:
    """Use `open_jetstream_log()`."""

    def __init__(self, bridge: AsyncioThread, js: Any, stream: str, prefix: str, *, retry_for: float = 60.0,
                 refuse_conflicts: bool = False) -> None:
        self.bridge, self.js, self.stream, self.prefix = bridge, js, stream, prefix
        self.retry_for = retry_for
        self.retries = 0  # publishes sent again after no answer (a leader election: a metric)
        self.listeners: list[RecordListener] = []
        self.quarantined: set[str] = set()  # stays empty: the servers checksum and replicate each message
        # Told (session id, its records as the stream now holds them plus this
        # log's rebased ones, their end) after a conflict: what the listeners
        # saw of the session is void; projections fold it again from these.
        # An empty list: the session is gone (deleted by another writer).
        self.reset_listeners: list[Callable[[str, list[Record], int], None]] = []
        self.conflicts = 0  # publishes refused for another writer's (rebased: a metric)
        # A conflict refuses this log's unacknowledged records of the session
        # (SeqConflict: their writer reads the log again, from the reset
        # listeners' fold, and decides anew) instead of rebasing them: for
        # logs whose appends are checked against all that precedes them
        # (the generic streams' producers and closure).
        self.refuse_conflicts = refuse_conflicts
        # A batch's messages go out in atomic batches (the stream allows them:
        # set by open_jetstream_log), else one by one (natsio.publish_answered).
        self.batched = False
        # As EventStore's: after the listeners saw one append's records (session id);
        # after each durable batch (records, perf_counter() of its first record, of its ack).
        self.append_listeners: list[Callable[[str], None]] = []
        self.batch_listeners: list[Callable[[int, float, float], None]] = []
        # Another writer's records (session id, the records, whether the
        # listeners saw them): True from the tail; False after a rebase, when
        # only the reset listeners did (the fold is theirs; the rest is not).
        self.remote_listeners: list[Callable[[str, list[Record], bool], None]] = []
        # Every message the tail delivers, this log's own included, in stream
        # order (session id, data, its records, stream sequence): the checkpoint's fold.
        self.stream_listeners: list[Callable[[str, bytes, list[Record], int], None]] = []
        self._unacked: dict[str, dict[int, Record]] = {}  # this log's records in flight, for them
        self._own_records: dict[int, list[Record]] = {}   # acked: by stream sequence, till the tail brings it
        # Another writer's messages of a subject that is not a session's
        # (`<prefix>._<name>`: no session id starts with "_"), by name.
        self.subject_listeners: dict[str, Callable[[bytes, int], None]] = {}
        self._purged: dict[str, int] = {}  # a session removed here: the stream sequence its purge covered
        self.journal = None  # (no write-ahead journal: the stream is the log)
        self._stats = [0, 0, 0, 0]  # batches, records, largest batch, messages published
        self.bytes_appended = 0
        self._opened = 0.0  # perf_counter() of the filling batch's first record
        # The most bytes one message may hold: the servers' max_payload less
        # room for the headers (set from the connection by open_jetstream_log).
        self.max_message = 1024 * 1024 - 4096
        self.failure_listeners: list[Callable[[BaseException], None]] = []
        self._sessions: dict[str, StreamSession] = {}
        self._filling: dict[str, list[tuple[int, bytes]]] = {}
        self._rebasing: set[str] = set()  # sessions whose conflict is being rebased: their lines wait
        self._rebase_slots = trio.CapacityLimiter(8)  # (each reads a whole session)
        self._wake = trio.Event()
        self._durable = trio.Event()  # set (and replaced) after each batch
        self._broken: BaseException | None = None
        self._closed = False
        self.worker = secrets.token_hex(6)  # names this writer on its messages (the tail skips its own)
        self.tail_position = 0  # the stream sequence of the last message the tail delivered
        self.tail: Tail | None = None  # (made by open_jetstream_log)
        self.written_position = 0  # the stream sequence of the last message this log stored
        self.replayed = 0  # messages the opening replay delivered
        self.replay_seconds = 0.0  # how long the opening replay took (set by its opener)

    def retried(self, n: int) -> None:
        self.retries += n

    def subject(self, session_id: str) -> str:
        return f"{self.prefix}.{validate_session_id(session_id)}"

    # -- sessions ---------------------------------------------------------

    def __contains__(self, session_id: str) -> bool:
        s = self._sessions.get(session_id)
        return s is not None and not s.deleted

    def session_ids(self) -> list[str]:
        return [sid for sid, s in self._sessions.items() if not s.deleted]

    def _session(self, session_id: str) -> StreamSession:
        s = self._sessions.get(session_id)
        if s is None or s.deleted:
            raise UnknownSession(session_id)
        return s

    def last_seq(self, session_id: str) -> int:
        return self._session(session_id).last_seq

    def durable_seq(self, session_id: str) -> int:
        return self._session(session_id).durable_seq

    def corruption(self, session_id: str) -> CorruptRecord | None:
        self._session(session_id)
        return None  # a stream's messages are checksummed and replicated by the servers

    @property
    def broken(self) -> BaseException | None:
        return self._broken

    def check_open(self) -> None:
        if self._broken is not None:
            raise StoreBroken("the stream refused or failed a write; restart to recover") from self._broken
        if self._closed:
            raise StoreClosed("the event log is closed")

    def _fail(self, error: BaseException) -> None:
        if self._broken is None:
            self._broken = error
            for listener in self.failure_listeners:
                listener(error)
        self._durable.set()
        self._durable = trio.Event()

    def _refuse(self, session_id: str, error: EventStoreError) -> None:
        """A session's rebase failed on it (gone): its waiting and later appends get `error`."""
        log.warning("session %s: its appends after a conflict are refused: %s", session_id, error)
        sess = self._sessions.get(session_id)
        if sess is not None:
            sess.refused = error
            self._filling.pop(session_id, None)
            self._unacked.pop(session_id, None)
        self._durable.set()
        self._durable = trio.Event()

    # -- writes -------------------------------------------------------------

    def _add(self, session_id: str, sess: StreamSession, events: Sequence[Event]) -> list[Appended]:
        ts = time.time()
        out = []
        sess.check_writable(session_id, events)
        # Encode everything first: a record over the servers' message size
        # leaves the session unchanged.
        lines = [encode_record(sess.last_seq + i, ts, ev) for i, ev in enumerate(events, 1)]
        big = max((len(line) for line in lines), default=0)
        if big > self.max_message:
            raise RecordTooLarge(f"a record of {big} bytes is over what the NATS servers take in one message "
                                 f"({self.max_message} bytes: raise max_payload on the servers)")
        if not self._filling or self._rebasing and self._filling.keys() <= self._rebasing:
            self._opened = time.perf_counter()  # (the first record of a batch: held sessions' wait apart)
        pending = self._filling.setdefault(session_id, [])
        for ev, line in zip(events, lines):
            sess.last_seq += 1
            sess.end += len(line)
            pending.append((sess.last_seq, line))
            sess.took(ev)
            rec = Record(sess.last_seq, ts, ev)
            if self.stream_listeners:  # (handed to them when the tail brings the message)
                self._unacked.setdefault(session_id, {})[sess.last_seq] = rec
            for listener in self.listeners:
                listener(session_id, rec, sess.end)
            out.append(Appended(rec, sess.end))
        for al in self.append_listeners:
            al(session_id)
        self._wake.set()
        return out

    async def create(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        """A new session's first records, durable on return; an id in use is SessionExists."""
        self.check_open()
        subject = self.subject(session_id)
        if session_id in self:
            raise SessionExists(f"session {session_id!r} already exists")
        self._sessions[session_id] = sess = StreamSession()
        out = self._add(session_id, sess, events)
        try:
            await self.wait_durable(session_id, sess.last_seq)
        except SessionExists:
            raise SessionExists(f"session {session_id!r} already exists on {subject}") from None
        return out

    async def append_many(self, session_id: str, events: Sequence[Event]) -> list[Appended]:
        self.check_open()
        sess = self._session(session_id)
        out = self._add(session_id, sess, events)
        await self.wait_durable(session_id, sess.last_seq)
        return out

    def append_nowait(self, session_id: str, event: Event) -> Appended:
        self.check_open()
        return self._add(session_id, self._session(session_id), [event])[0]

    def append_progress(self, items: Sequence[tuple[str, Sequence[Event]]]) -> list[Failed]:
        return append_each(self, items)

    def wait_durable(self, session_id: str, seq: int) -> Awaitable[int]:
        """Wait until the session's record `seq` is on the stream; returns its seq
        there (a conflict's rebase renumbers this log's records). The session
        is taken at the call: a listener's wait follows a rebase before its await."""
        return self._durable_from(self._sessions.get(session_id), session_id, seq)

    async def _durable_from(self, sess: StreamSession | None, session_id: str, seq: int) -> int:
        if sess is None:
            raise UnknownSession(session_id)
        while True:
            while sess.moved_to is not None:  # rebased after a conflict
                if sess.refused is not None:
                    raise sess.refused
                seq, sess = sess.renumber.get(seq, seq), sess.moved_to
            if sess.refused is not None:
                raise sess.refused
            if sess.durable_seq >= seq:
                return seq
            self.check_open()
            await self._durable.wait()

    async def flush(self, session_id: str | None = None) -> None:
        if session_id is not None:  # (one session's records: what a reader of it needs)
            one = self._sessions.get(session_id)
            if one is not None and not one.deleted:
                await self.wait_durable(session_id, one.last_seq)
            return
        for sid, sess in list(self._sessions.items()):
            if not sess.deleted:
                try:
                    await self.wait_durable(sid, sess.last_seq)
                except (StoreBroken, StoreClosed):
                    raise
                except EventStoreError:  # refused (its rebase failed): nothing more of it will be durable
                    continue

    async def _commit(self) -> None:
        """The committer: one crossing and one pipelined publish a batch; a
        conflict is rebased beside it (`_rebase_beside`)."""
        async with trio.open_nursery() as rebases:
            while True:
                await self._commit_batch(rebases)

    async def _commit_batch(self, rebases: trio.Nursery) -> None:
        await self._wake.wait()
        self._wake = trio.Event()
        batch, self._filling = self._filling, {}
        opened = self._opened
        for sid in self._rebasing & batch.keys():
            self._filling[sid] = batch.pop(sid)
        if not batch or self._broken is not None:
            return
        js, retry_for = self.js, self.retry_for
        # Each session's lines in messages of at most max_message bytes: the
        # first message of every session at once, then the second of those
        # that have one (fenced on the first's ack), and so on.
        chunks = {sid: split_by_size(items, self.max_message) for sid, items in batch.items()}
        fence = {sid: self._sessions[sid].stream_seq for sid in batch}
        conflicted: list[tuple[str, list[tuple[int, bytes]]]] = []
        failed: BaseException | None = None
        published = 0
        rnd = 0
        while failed is None:
            live = [sid for sid in batch if len(chunks[sid]) > rnd and sid not in {c for c, _ in conflicted}]
            if not live:
                break
            messages = [(self.subject(sid), b"".join(line for _, line in chunks[sid][rnd]), {
                "Nats-Msg-Id": f"{sid}:{self._sessions[sid].born}:{chunks[sid][rnd][0][0]}-{chunks[sid][rnd][-1][0]}",
                "Nats-Expected-Last-Subject-Sequence": str(fence[sid]),
                WRITER_HEADER: self.worker}) for sid in live]
            published += sum(len(m[1]) for m in messages)
            try:
                acks = await self.bridge.run(lambda: publish_answered(js, messages, retry_for, self.retried,
                                                                      batched=self.batched))
            except Exception as e:  # the crossing itself failed
                acks = [e] * len(live)
            for sid, ack in zip(live, acks):
                sess = self._sessions[sid]
                if not isinstance(ack, BaseException):
                    fence[sid] = ack.seq
                    unacked = self._unacked.get(sid)
                    if unacked:
                        recs = [unacked.pop(seq) for seq, _ in chunks[sid][rnd] if seq in unacked]
                        if len(recs) == len(chunks[sid][rnd]):
                            self._own_records[ack.seq] = recs
                    sess.stream_seq = max(sess.stream_seq, ack.seq)
                    self.written_position = max(self.written_position, ack.seq)
                    sess.durable_seq = max(sess.durable_seq, chunks[sid][rnd][-1][0])
                elif getattr(ack, "err_code", None) in WRONG_LAST_SEQUENCE:
                    conflicted.append((sid, [item for chunk in chunks[sid][rnd:] for item in chunk]))
                    self._unacked.pop(sid, None)  # (renumbered by the rebase: decoded from the tail's)
                else:
                    failed = ack
            rnd += 1
        if failed is not None:
            self._fail(failed)
            return
        for sid in batch:
            sess = self._sessions[sid]
            if sess.deferred and not sess.pending:  # others' messages stored after ours
                deferred, sess.deferred = sess.deferred, []
                for data, stream_seq in deferred:
                    self._take_foreign(self.subject(sid), data, stream_seq)
        refused = {sid for sid, _ in conflicted}
        records = sum(len(items) for sid, items in batch.items() if sid not in refused)
        st = self._stats
        st[0], st[1], st[2], st[3] = st[0] + 1, st[1] + records, max(st[2], records), st[3] + len(batch)
        self.bytes_appended += published
        now = time.perf_counter()
        for bl in self.batch_listeners:
            bl(records, opened, now)
        self._durable.set()
        self._durable = trio.Event()
        for sid, items in conflicted:
            self._rebasing.add(sid)
            rebases.start_soon(self._rebase_beside, sid, items, opened)

    async def _rebase_beside(self, session_id: str, refused: list[tuple[int, bytes]], opened: float) -> None:
        """A conflict is its session's business: rebased while the committer
        goes on with the others (a long session's read holds no one else
        back); the session's appends wait meanwhile, or are refused."""
        try:
            async with self._rebase_slots:
                await self._rebase(session_id, refused, opened)
        except EventStoreError as e:
            self._refuse(session_id, e)
        except Exception as e:  # noqa: BLE001 - the stream could not be read: as a failed write
            self._fail(e)
        finally:
            self._rebasing.discard(session_id)
            self._wake.set()  # (its lines: in the next batch)

    async def _rebase(self, session_id: str, refused: list[tuple[int, bytes]], opened: float) -> None:
        """Another writer appended to the session since this log's last
        message of it (the fence refused ours): read the session again and
        put this log's unacknowledged records after the other's, renumbered
        (waiters follow), or refuse them if the other writer created or
        deleted the session. The reset listeners fold it again. (`opened`:
        the refused batch's, the age of the records put back.)"""
        self.conflicts += 1
        old = self._sessions[session_id]
        deadline = trio.current_time() + 2.0
        while True:  # the refusal can come before the message that caused it can be read
            data, last, marks = await self._read_answered(session_id)
            if last > old.stream_seq or trio.current_time() > deadline:  # (none by then: purged, deleted)
                break
            await trio.sleep(0.02)
        with_end = list(with_ends(scan(session_id, data).records, data, 0))
        records = [rec for rec, _ in with_end]
        # what the other writer(s) appended since this log's last look: never told the listeners
        seen_to = max([end for seq, end in marks if seq <= old.stream_seq], default=0)
        foreign = [rec for rec, end in with_end if end > seen_to]
        finalized = {r.event.msg_id for r in records if isinstance(r.event, MessageFinalized)}
        pending = refused + self._filling.pop(session_id, [])
        new = self._sessions[session_id] = StreamSession()
        new.born = old.born
        new.stream_seq, new.end = last, len(data)
        new.last_seq = new.durable_seq = records[-1].seq if records else 0
        new.finished = finalized
        old.moved_to = new
        new.deferred = [d for d in old.deferred if d[1] > last]  # the tail's, after the read
        self._unacked.pop(session_id, None)  # (renumbered: the tail's copies are decoded)
        gone = not records or isinstance(records[-1].event, SessionDeleted)
        # Nothing this log knew of the session is left: deleted, purged and made again.
        again = old.stream_seq > 0 and bool(marks) and marks[0][0] > old.stream_seq
        made = pending[0][0] == 1  # (this log's records made the session: its first is seq 1)
        if gone or again or made or self.refuse_conflicts:
            old.refused = (UnknownSession(session_id) if gone or again else
                           SessionExists(f"session {session_id!r} was created by another writer") if made else
                           SeqConflict(f"log {session_id}: another writer appended to it first"))
            if gone:
                new.deleted = True
                records = []
        else:
            rebased, mine = new.put_after(old, pending, finalized)
            records += mine
            if rebased:
                self._opened = min(self._opened, opened) if self._filling.keys() - self._rebasing else opened
                self._filling[session_id] = rebased
            self._wake.set()
        for listener in self.reset_listeners:
            listener(session_id, records, new.end)
        if foreign:
            for rl in self.remote_listeners:
                rl(session_id, foreign, False)
        if new.deferred and not new.pending:  # (refused: nothing of ours in flight)
            deferred, new.deferred = new.deferred, []
            for chunk, stream_seq in deferred:
                self._take_foreign(self.subject(session_id), chunk, stream_seq)
        self._durable.set()
        self._durable = trio.Event()

    # -- the tail: other writers' records -------------------------------------

    def _tailed(self, subject: str, data: bytes, stream_seq: int, own: bool) -> None:
        """A message the tail delivered (on the trio thread, in stream order)."""
        sid = subject[len(self.prefix) + 1:]
        records = None
        if self.stream_listeners:  # decoded once for them and the tail (this log's own: at their append)
            own_records = self._own_records
            while own_records and (first := next(iter(own_records))) < stream_seq:
                del own_records[first]  # (purged before the tail brought it)
            records = own_records.pop(stream_seq, None) if own else None
            if records is None:
                records = scan(sid, data).records
            for sl in self.stream_listeners:
                sl(sid, data, records, stream_seq)
        if own:
            return
        if sid.startswith("_"):  # not a session's (streamprojects.py)
            if sid in self.subject_listeners:
                self.subject_listeners[sid](data, stream_seq)
            return
        self._take_foreign(subject, data, stream_seq, records)

    def seed(self, session_id: str, seq: int, end: int, stream_seq: int) -> None:
        """Know a session as a checkpoint has it (before the tail starts
        after the checkpoint's position)."""
        sess = self._sessions[validate_session_id(session_id)] = StreamSession()
        sess.last_seq = sess.durable_seq = seq
        sess.end, sess.stream_seq = end, stream_seq

    def _take_foreign(self, subject: str, data: bytes, stream_seq: int, records: list[Record] | None = None) -> None:
        """Another writer's message (on the trio thread, in stream order)."""
        self.tail_position = max(self.tail_position, stream_seq)
        sid = subject[len(self.prefix) + 1:]
        sess = self._sessions.get(sid)
        if sess is not None and stream_seq <= sess.stream_seq:
            return  # read already (by a rebase or an adopt)
        if sess is None and stream_seq <= self._purged.get(sid, 0):
            return  # a message of a session removed here, the tail late with it
        if sess is not None and sess.pending:
            # its seqs may be the ones this log gave its own records: after the
            # ack (stored after ours), or read again by the rebase (before)
            sess.deferred.append((data, stream_seq))
            return
        records = scan(sid, data).records if records is None else records
        if sess is not None and not sess.deleted and records and records[0].seq == 1 <= sess.last_seq:
            # The id made again by another writer after a deletion whose
            # tombstone was purged before the tail brought it: the old is gone.
            sess.deleted = True
            for reset in self.reset_listeners:
                reset(sid, [], 0)
        if sess is None or sess.deleted:
            sess = self._sessions[sid] = StreamSession()
        sess.stream_seq = stream_seq
        taken = []
        for rec, end in with_ends(records, data, sess.end):
            if rec.seq <= sess.last_seq:
                continue  # known already
            sess.last_seq = sess.durable_seq = rec.seq
            sess.took(rec.event)
            for listener in self.listeners:
                listener(sid, rec, end)
            taken.append(rec)
            if isinstance(rec.event, SessionDeleted):
                sess.deleted = True
        sess.end += len(data)
        if taken:
            for rl in self.remote_listeners:
                rl(sid, taken, True)
        self._durable.set()
        self._durable = trio.Event()

    async def caught_up(self) -> None:
        """Return once the tail has brought (and the listeners folded) every
        message the stream held when called: what another worker acknowledged
        before is known here (read-your-writes behind a load balancer)."""
        self.check_open()
        assert self.tail is not None, "the tail has not started"
        await self.tail.caught_up()

    # -- what the session store asks of a backend besides the contract -------

    def durable_end(self, session_id: str) -> int:
        """The length of the session's lines so far, as its log file would be."""
        return self._session(session_id).end

    def written_seq(self, session_id: str) -> int:
        return self._session(session_id).durable_seq

    def stream_seq(self, session_id: str) -> int:
        return self._session(session_id).stream_seq  # of the session's last message (its fence)

    def unwritten(self, session_id: str) -> bytes:
        return b""  # (acknowledged is on the stream: nothing waits in a journal)

    def quarantine(self, session_id: str, corrupt: CorruptRecord) -> None:
        raise StoreBroken(f"{corrupt}: a stream's messages are not repaired here")

    def statistics(self) -> CommitStatistics:
        b, r, largest, published = self._stats
        waiting = sum(1 for s in self._sessions.values() if s.pending)
        return CommitStatistics(b, r, largest, published, waiting, "jetstream")

    async def log_bytes(self, session_id: str) -> bytes:
        """The session's lines, acknowledged ones, as its log file would hold
        them. A known session whose subject is empty was deleted by another
        writer and purged before the tail brought its tombstone: it is
        forgotten (the reset listeners told) and UnknownSession."""
        sess = self._session(session_id)
        await self.flush(session_id)  # (its own appends: another session's refusal is not this read's)
        data, _, _ = await self._messages(session_id)
        if not data and not sess.pending and self._sessions.get(session_id) is sess:
            sess.deleted = True
            for listener in self.reset_listeners:
                listener(session_id, [], 0)
            raise UnknownSession(session_id)
        return data

    # -- reads and removal --------------------------------------------------

    async def _read_answered(self, session_id: str) -> tuple[bytes, int, list[tuple[int, int]]]:
        """`_messages`, read again while unanswered (a leader paused or elected) as long as a publish is."""
        deadline = trio.current_time() + self.retry_for
        while True:
            try:
                return await self._messages(session_id)
            except Exception as e:
                if not unanswered(e) or trio.current_time() > deadline:
                    raise
                self.retries += 1
            await trio.sleep(0.2)

    async def _messages(self, session_id: str) -> tuple[bytes, int, list[tuple[int, int]]]:
        """The session's lines as the stream holds them, the stream sequence
        of its last message (0: none), and each message's (stream sequence,
        offset just past it in the lines)."""
        subject, js, stream = self.subject(session_id), self.js, self.stream
        return await self.bridge.run(lambda: read_subject(js, stream, subject, DIRECT_GETS))

    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]:
        """The session's acknowledged records with seq > after_seq."""
        return [r for r in scan(session_id, await self.log_bytes(session_id)).records if r.seq > after_seq]

    async def adopt(self, session_id: str) -> list[Record]:
        """The session's records as the stream holds them now (UnknownSession
        if it has none). The messages this log had not seen yet go the tail's
        way (the listeners, or deferred while records of ours are in flight),
        so that what the listeners fold stays the stream's."""
        data, _, marks = await self._messages(session_id)
        records = scan(session_id, data).records
        if not records:
            raise UnknownSession(session_id)
        start = 0
        for stream_seq, end in marks:
            self._take_foreign(self.subject(session_id), data[start:end], stream_seq)
            start = end
        return records

    async def purge_tombstoned(self, session_id: str) -> bool:
        """Purge a log whose last record is its tombstone (its deleter died,
        or is still about to, before purging it): its id is free to be made
        again. Only up to the tombstone (a log made anew meanwhile stays).
        True if it was."""
        data, last, _ = await self._read_answered(session_id)
        records = scan(session_id, data).records
        if not records or not isinstance(records[-1].event, SessionDeleted):
            return False
        subject, js, stream = self.subject(session_id), self.js, self.stream
        await self.bridge.run(lambda: js.purge_stream(stream, seq=last + 1, subject=subject))
        self._purged[session_id] = max(self._purged.get(session_id, 0), last)
        sess = self._sessions.get(session_id)
        if sess is not None and (sess.deleted or (not sess.pending and sess.last_seq <= records[-1].seq)):
            del self._sessions[session_id]  # (its tombstone ours, or the tail's)
        return True

    async def remove(self, session_id: str) -> None:
        """Purge the session's subject (its tombstone is durable already) and forget it."""
        self.check_open()
        sess = self._session(session_id)
        await self.wait_durable(session_id, sess.last_seq)
        subject, js, stream = self.subject(session_id), self.js, self.stream
        try:
            await self.bridge.run(lambda: js.purge_stream(stream, subject=subject))
        except Exception as e:
            self._fail(e)
            raise StoreBroken(f"purging {subject} failed: {e}") from e
        self._purged[session_id] = sess.stream_seq
        del self._sessions[session_id]
        self._unacked.pop(session_id, None)


@asynccontextmanager
async def open_jetstream_log(servers: list[str], *, stream: str = "SESSIONLOG", prefix: str = "sl.s",
                             replicas: int = 3, timeout: float = 10.0, retry_for: float = 60.0,
                             replay: bool = False, create: bool = True,
                             listeners: Sequence[RecordListener] = (),
                             seed: Callable[[JetStreamLog], Awaitable[int]] | None = None,
                             refuse_conflicts: bool = False) -> AsyncIterator[JetStreamLog]:
    """Connect, create the stream if needed (`replicas` copies), run the
    committer until the block exits; everything appended inside the block is
    committed before it does. With `replay`, every session on the stream is
    known, and every record of it has reached `listeners`, when the block
    starts (a worker's start); `seed`, given the log before its tail starts,
    may make it know sessions as of a checkpoint and return the stream
    sequence the replay resumes after. Without `create`, a stream that does not
    exist is StoreBroken (nothing is made). A publish that gets no answer (a leader
    being elected, a node lost) is retried for `retry_for` s before the log breaks."""
    bridge = AsyncioThread()
    bridge.start()
    try:
        nc, js = await bridge.run(lambda: connect(servers, timeout))
        try:
            await bridge.run(lambda: send_again_at_elections(nc, js, stream))
            atomic = await bridge.run(lambda: ensure_stream(js, stream, prefix, replicas, create))
            log = JetStreamLog(bridge, js, stream, prefix, retry_for=retry_for, refuse_conflicts=refuse_conflicts)
            log.batched = atomic
            log.max_message = int(nc.max_payload) - 4096
            log.listeners.extend(listeners)
            start = await seed(log) + 1 if seed is not None and replay else 0
            with trio.fail_after(max(60.0, 6 * timeout)):
                log.tail = Tail(bridge, js, stream, f"{prefix}.>", log.worker,
                                lambda subject, data, seq, own: log._tailed(subject, data, seq, own),
                                lambda: bool(log.stream_listeners))  # (looked up at each: tests hold it)
                log.replayed = await log.tail.start(replay, start)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(log._commit)
                try:
                    yield log
                    if log.broken is None:  # (broken: what was acknowledged is on the stream already)
                        with trio.move_on_after(30):
                            await log.flush()
                finally:
                    log._closed = True
                    nursery.cancel_scope.cancel()
        finally:
            try:
                await bridge.run(nc.close)
            except Exception:  # noqa: BLE001 - a connection already lost: nothing to close cleanly
                pass
    finally:
        bridge.stop()


if TYPE_CHECKING:
    def _the_stream_is_an_event_log(log: JetStreamLog) -> EventLog:
        return log  # mypy checks that JetStreamLog keeps the contract (eventstore/backend.py)
