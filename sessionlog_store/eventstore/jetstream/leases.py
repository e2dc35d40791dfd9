"""In-flight ownership across workers (server/scaleout/worker.py wires it): a
worker holds a lease for each reply it streams, in a JetStream KV bucket;
when a worker dies, another worker's sweeper takes its expired leases and
finalizes their replies `aborted` "worker restart", exactly once.

Theory of operation
-------------------
A lease is a KV entry `<session>.<message>` holding (worker, expires), a
wall-clock deadline `ttl` seconds ahead. Every change is a compare-and-set
on the entry's revision:
- `acquire` creates the entry (refused if it exists);
- `renew` moves the deadline, expecting the revision it last wrote; a CAS
  that fails means another worker took the lease: the holder has lost it
  and must stop writing that reply (`renew` returns False);
- `sweep` looks at every entry; one whose deadline passed (plus `skew`, for
  the workers' clocks) is taken with a CAS on the revision it read, so of
  two sweepers exactly one wins. The winner reads the session from the
  stream and appends the finalize, unless the reply has one already (its
  worker finished it but died before releasing); the append is fenced by
  the stream's expected-last-subject-sequence too. Then it deletes the
  entry, expecting its own revision.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import msgspec
import trio

from ..errors import MessageFinished, UnknownSession
from ..events import Event, MessageCreated, MessageFinalized, SessionCreated, SessionFlags
from .streamlog import JetStreamLog
from ..record import Record
from .natsio import WRONG_LAST_SEQUENCE, bucket_entries, unanswered, until_led

log = logging.getLogger("sessionlog.leases")

# Seconds of clock difference between workers a deadline allows for.
CLOCK_SKEW: Final = 2.0
REASON: Final = "worker restart"
# Delete markers a sweep purges at most, after its expired leases (those older
# releases left: a bucket written by a worker before they were purged drains
# over some sweeps; each is a request).
MARKERS_A_SWEEP: Final = 250


class Lease(msgspec.Struct, frozen=True):
    worker: str
    expires: float


_ENCODE = msgspec.json.Encoder()
_DECODE = msgspec.json.Decoder(Lease)


def bucket_name(stream: str) -> str:
    """The KV bucket of a stream's leases."""
    return f"{stream}-leases"


def lease_key(session_id: str, msg_id: str) -> str:
    return f"{session_id}.{msg_id}"


# A session's turn (a chat's or a retry's reply holds it until it ends): a
# lease like a reply's, under a name no message id has (ids are 22 characters).
TURN: Final = "_turn"


class LeaseTaken(Exception):
    """The reply has a lease already (another worker streams it)."""


def _gone(e: BaseException) -> bool:
    """The entry is not the revision expected, or not there: another worker
    took it (nats-py names the first KeyWrongLastSequenceError, or answers a
    delete with a plain BadRequestError carrying JetStream's code)."""
    return (type(e).__name__ in ("KeyWrongLastSequenceError", "KeyNotFoundError", "KeyDeletedError")
            or getattr(e, "err_code", None) in WRONG_LAST_SEQUENCE)


def renew_timeout(ttl: float) -> float:
    """How long one renewal request waits for its answer: a tenth of the
    time to live (within 0.5-2 s; an answer takes milliseconds), so that
    after a round that got none, tried again half a second later, several
    more tries fit before the lease lapses (the bucket's leader lost: an
    election takes 4-9 s)."""
    return max(0.5, min(2.0, ttl / 10))


class Leases:
    """Use `await Leases.open(log)`."""

    def __init__(self, log: JetStreamLog, kv: Any, ttl: float, skew: float = CLOCK_SKEW,
                 renew_kv: Any = None) -> None:
        self.log, self.kv, self.ttl, self.skew = log, kv, ttl, skew
        # Renewals on a handle whose requests give up soon (a few tries fit in
        # a lease's time to live when the bucket's leader is lost)
        self.renew_kv = renew_kv if renew_kv is not None else kv
        self.worker = log.worker
        self._revisions: dict[str, int] = {}  # the revision of each lease this worker holds
        self._expires: dict[str, float] = {}  # its deadline as last written (wall clock)
        self.finalized: list[tuple[str, str]] = []  # the replies this worker finalized REASON, as it did

    @classmethod
    async def open(cls, log: JetStreamLog, *, ttl: float = 15.0, replicas: int = 3,
                   skew: float = CLOCK_SKEW) -> Leases:
        js = log.js

        name = bucket_name(log.stream)
        kv = await log.bridge.run(lambda: until_led(js, f"KV_{name}", lambda: js.create_key_value(
            bucket=name, history=1, replicas=replicas)))
        # (nats-py's connection behind the log's context: a second context on
        # it, with a timeout of its own, for the renewals)
        fast = js._nc.jetstream(timeout=renew_timeout(ttl))
        renew_kv = await log.bridge.run(lambda: until_led(fast, f"KV_{name}", lambda: fast.key_value(name)))
        return cls(log, kv, ttl, skew, renew_kv)

    @staticmethod
    async def held(log: JetStreamLog) -> list[str]:
        """The keys of every lease on the stream's bucket, making nothing
        (none if the bucket does not exist)."""
        js, bucket = log.js, bucket_name(log.stream)
        return (await log.bridge.run(lambda: bucket_entries(js, bucket)))[0]

    def _value(self) -> tuple[bytes, float]:
        expires = time.time() + self.ttl
        return _ENCODE.encode(Lease(self.worker, expires)), expires

    async def acquire(self, session_id: str, msg_id: str, retry_for: float = 30.0) -> None:
        """Make the reply's lease; LeaseTaken if it exists. A try that gets no
        answer (a leader election) is made again for `retry_for` seconds; if
        the entry then exists with this worker's name, that try made it."""
        key, kv, run = lease_key(session_id, msg_id), self.kv, self.log.bridge.run
        deadline, unanswered_before = time.monotonic() + retry_for, False
        while True:
            value, expires = self._value()  # (a deadline from this try on, not from the first)
            try:
                self._revisions[key] = await run(lambda: kv.create(key, value))
                self._expires[key] = expires
                return
            except Exception as e:
                if type(e).__name__ in ("KeyNotFoundError", "KeyDeletedError") and time.monotonic() < deadline:
                    continue  # (nats-py's create read the key between its two tries: a release emptied it)
                if type(e).__name__ == "KeyWrongLastSequenceError":
                    try:
                        entry = await run(lambda: kv.get(key))
                    except Exception as again:
                        if _gone(again) and time.monotonic() < deadline:
                            continue  # (an old delete marker a sweep purged while it was made)
                        raise
                    if unanswered_before:
                        held = _DECODE.decode(entry.value) if entry.value else None
                        if held is not None and held.worker == self.worker:
                            # An earlier try made it, maybe long ago (an election
                            # outlasted its answer): its deadline moved on first.
                            rev, expires = entry.revision, held.expires
                            if expires < time.time() + self.ttl / 2:
                                value, expires = self._value()
                                rev = await run(lambda: kv.update(key, value, last=entry.revision))
                            self._revisions[key], self._expires[key] = rev, expires
                            return
                    raise LeaseTaken(key) from None
                if not unanswered(e) or time.monotonic() > deadline:
                    raise
                unanswered_before = True
            await trio.sleep(0.2)

    def holds(self, session_id: str, msg_id: str) -> bool:
        """This worker holds the reply's lease (it streams the reply, or is
        writing its finalize)."""
        return lease_key(session_id, msg_id) in self._revisions

    def lapsed(self, session_id: str, msg_id: str) -> bool:
        """This worker holds the reply's lease, but its deadline passed (the
        worker was paused, or its renewals got no answer) by more than half
        the clock skew a sweeper allows: another worker may be taking it
        now, so nothing more of the reply is written here (`forget` it)."""
        key = lease_key(session_id, msg_id)
        expires = self._expires.get(key)
        return key in self._revisions and expires is not None and time.time() > expires + self.skew / 2

    def forget(self, session_id: str, msg_id: str) -> None:
        """Give up a lapsed lease without touching its entry: it is a
        sweeper's (this worker's own included) to take and finalize."""
        key = lease_key(session_id, msg_id)
        self._revisions.pop(key, None)
        self._expires.pop(key, None)

    async def renew(self, session_id: str, msg_id: str) -> bool:
        """Move the deadline on; False: the lease was taken (stop writing the reply)."""
        key = lease_key(session_id, msg_id)
        if key not in self._revisions:
            return False
        held = (await self.renew_all([key]))[key]
        if held is None:
            raise TimeoutError(f"lease {key}: no answer")
        return held

    async def renew_all(self, keys: list[str] | None = None) -> dict[str, bool | None]:
        """Move on the deadline of every lease this worker holds (or of
        `keys`), all at once in one crossing. Each is True (renewed), False
        (taken by another worker: stop writing that reply) or None (no
        answer, or not renewed yet: try again soon). A request that got no
        answer is None at once (the next try's compare-and-set tells whether
        it landed); a refusal is checked against the entry: if it holds this
        worker's name it is still ours, at the entry's revision."""
        kv, (value, expires) = self.renew_kv, self._value()
        todo = [(k, self._revisions[k]) for k in (keys if keys is not None else list(self._revisions))
                if k in self._revisions]

        async def renew() -> list[Any]:
            from nats.js.errors import KeyNotFoundError

            async def one(key: str, last: int) -> Any:
                try:
                    return await kv.update(key, value, last=last), expires, True
                except Exception as e:  # noqa: BLE001 - sorted out below
                    if unanswered(e):
                        # Unknown, at once (no read to wait for as well): the
                        # next try's compare-and-set says whether this one landed.
                        return None
                    try:
                        entry = await kv.get(key)
                    except KeyNotFoundError:  # (deleted too) taken, its reply finalized by the taker
                        return False
                    except Exception:  # noqa: BLE001 - no answer either: unknown
                        return None
                    held = _DECODE.decode(entry.value) if entry.value else None
                    if held is not None and held.worker == self.worker:
                        # Ours, at a revision an earlier try whose answer was
                        # lost wrote: taken as it is; renewed if its deadline
                        # is this round's, else tried again soon from it.
                        return entry.revision, held.expires, held.expires >= expires
                    return False  # the entry answered, and it is another worker's (or a taker's deletion)
            return list(await asyncio.gather(*(one(k, last) for k, last in todo)))
        out: dict[str, bool | None] = {}
        for (key, _), got in zip(todo, await self.log.bridge.run(renew)):
            if got is False:
                self._revisions.pop(key, None)
                self._expires.pop(key, None)
                out[key] = False
            elif got is None:
                out[key] = None
            else:
                if key in self._revisions:  # (released meanwhile: stays released)
                    self._revisions[key], self._expires[key] = int(got[0]), float(got[1])
                out[key] = True if got[2] else None
        return out

    async def release(self, session_id: str, msg_id: str) -> None:
        key = lease_key(session_id, msg_id)
        last = self._revisions.pop(key, None)
        self._expires.pop(key, None)
        if last is not None:
            await self._drop(key, last)  # (taken meanwhile: the taker's entry stays, the taker drops it)

    async def _drop(self, key: str, revision: int) -> None:
        """Remove the entry at `revision` and nothing written after it (a
        lease another worker took meanwhile stays): a purge of the key's
        messages up to it, which leaves no delete marker. `kv.delete` left
        one a reply, for good (history 1), and every sweep's listing of the
        bucket read them all (bench/README.md: ~39 us of CPU a marker, twice
        a sweep, every ttl/2)."""
        js, bucket = self.log.js, bucket_name(self.log.stream)
        await self.log.bridge.run(lambda: js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{key}",
                                                          seq=revision + 1))

    async def sweep(self) -> list[tuple[str, str]]:
        """Take every expired lease of any worker and finalize its reply
        (once, whoever else sweeps). Never one this worker holds: its reply
        is live here (a lapsed one is `forget`-ten first, its producer ended).
        Returns the replies this sweep finalized."""
        kv, run, skew = self.kv, self.log.bridge.run, self.skew
        js, bucket = self.log.js, bucket_name(self.log.stream)
        keys, markers = await run(lambda: bucket_entries(js, bucket))

        async def expired() -> list[tuple[str, int]]:
            from nats.js.errors import KeyDeletedError, KeyNotFoundError
            out = []
            for key in keys:
                if key in self._revisions:
                    continue  # this worker's own live reply (not even read)
                try:
                    entry = await kv.get(key)
                except (KeyNotFoundError, KeyDeletedError):  # (released or swept meanwhile)
                    continue
                if entry.value and _DECODE.decode(entry.value).expires + skew < time.time():
                    out.append((key, entry.revision))
            return out
        done = []
        for key, revision in await run(expired):
            value, _ = self._value()
            try:
                mine = await run(lambda: kv.update(key, value, last=revision))  # exactly one sweeper wins
            except Exception as e:
                if _gone(e):
                    continue
                raise
            session_id, msg_id = key.split(".", 1)
            if msg_id != TURN and await self.finalize_orphan(session_id, msg_id):  # (a turn: deleted only)
                done.append((session_id, msg_id))
            try:
                await self._drop(key, mine)
            except Exception as e:  # noqa: BLE001 - left, it expires: the next sweep finds the finalize and drops it
                log.warning("could not delete the swept lease %s: %s", key, e)
        try:
            for key, seq in markers[:MARKERS_A_SWEEP]:  # (an older worker's releases', or a drop cut short)
                await self._drop(key, seq)
        except Exception as e:  # noqa: BLE001 - the rest, at the next sweep; this one's finalizes stand
            log.warning("could not purge the lease bucket's old delete markers: %s", e)
        return done

    async def finalize_orphan(self, session_id: str, msg_id: str) -> bool:
        """With the reply's lease taken: append its finalize `aborted` REASON,
        unless the stream has one, or no placeholder (or the session is
        gone); and the session's idle flag when it was the session's last
        running reply. True if appended."""
        try:
            records = await self.log.adopt(session_id)
        except UnknownSession:  # the session went (deleted): nothing to finalize
            return False
        if any(isinstance(r.event, MessageFinalized) and r.event.msg_id == msg_id for r in records):
            return False
        if not any(isinstance(r.event, MessageCreated) and r.event.msg_id == msg_id for r in records):
            return False  # its worker died between the lease and the placeholder: no reply to end
        events: list[Event] = [MessageFinalized(msg_id=msg_id, status="aborted", aborted_reason=REASON)]
        if _running_flag_left(records, msg_id):
            events.append(SessionFlags(status="idle", unread=True))  # (news to its user, as any reply's end)
        try:
            await self.log.append_many(session_id, events)
        except (UnknownSession, MessageFinished):  # deleted or finalized meanwhile (by another worker)
            return False
        self.finalized.append((session_id, msg_id))
        return True

    async def keys(self) -> list[str]:
        """Every lease's key, any worker's."""
        js, bucket = self.log.js, bucket_name(self.log.stream)
        return (await self.log.bridge.run(lambda: bucket_entries(js, bucket)))[0]


def _running_flag_left(records: list[Record], msg_id: str) -> bool:
    """The session is flagged running and `msg_id` is its only running
    message: its finalize ends the session's run too."""
    running, status = set(), "idle"
    for r in records:
        ev = r.event
        if isinstance(ev, MessageCreated) and ev.status == "running":
            running.add(ev.msg_id)
        elif isinstance(ev, MessageFinalized):
            running.discard(ev.msg_id)
        elif isinstance(ev, SessionFlags) and ev.status is not None:
            status = ev.status
        elif isinstance(ev, SessionCreated):
            status = "idle"
    return status == "running" and running <= {msg_id}
