"""The NATS side of the JetStream backend (jetstream.py, leases.py): nats-py
is asyncio-only, so it runs on an asyncio loop in a thread of its own that
trio code crosses into, one crossing per batch (`AsyncioThread`); and
streams are made and waited for until they have a leader (`until_led`), a
cluster just started being a moment away from taking a publish.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any, Final, TypeVar

import msgspec
import trio

from ..errors import StoreBroken, leaf_errors


# The header naming a message's writer (a log: a worker's connection).
WRITER_HEADER = "Sessionlog-Writer"
# JetStream's error codes for a failed expected-last-subject-sequence check
# (JSStreamWrongLastSequenceErrF, and the constant form 2.11+ answers).
WRONG_LAST_SEQUENCE = (10071, 10164)


# Reading a session: this many messages one direct get each, the rest from
# an ordered consumer (thousands of gets took seconds; a consumer costs a
# few round trips to make and delivers ~100k messages/s).
DIRECT_GETS: Final = 16

# The most messages of one JetStream atomic batch (the servers' default cap;
# a lower cap refuses a larger batch, whose messages are then published one
# by one and the batches halved: `Publisher.publish_batched`), and its most
# bytes (a batch is answered once all of it is stored: 1,000 messages of
# 1 MB missed the answer's timeout).
ATOMIC_MAX: Final = 1000
ATOMIC_MAX_BYTES: Final = 8 << 20

# How long the servers remember a message id (s): a publish sent again within
# it (no answer came: `publish_answered`) is stored once.
DUPLICATE_WINDOW: Final = 120.0

T = TypeVar("T")
_log = logging.getLogger("sessionlog.worker")


class AsyncioThread:
    """An asyncio loop in a thread of its own; trio awaits coroutines on it,
    one crossing each (the thread is joined when its `open_` block exits)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sessionlog-nats", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def run(self, make: Callable[[], Awaitable[T]]) -> T:
        async def wrapped() -> T:
            return await make()
        fut = asyncio.run_coroutine_threadsafe(wrapped(), self.loop)
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()
        fut.add_done_callback(lambda _: token.run_sync_soon(done.set))
        try:
            await done.wait()
        except trio.Cancelled:
            fut.cancel()
            raise
        return fut.result()

    def stop(self) -> None:
        """End every task left on the loop (the client's readers and pingers),
        then the loop and its thread."""
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(10)
        except Exception:  # noqa: BLE001 - stopping regardless
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


# A stream's config refused for good: its subjects overlap another stream's;
# the name is in use with another config. (10005, "no suitable peers for
# placement", is a cluster still forming: retried.)
_CONFIG_REFUSED: Final = (10065, 10058)


async def until_led(js: Any, stream: str, create: Callable[[], Awaitable[T]], within: float = 30.0) -> T:
    """Run `create` (an idempotent add_stream or create_key_value of
    `stream`) until the cluster has taken it and the stream has a leader: a
    cluster just started elects its meta leader first, a new stream its own
    a moment later, and a publish before that finds no responder."""
    deadline = time.monotonic() + within
    while True:
        try:
            made = await create()
            cluster = (await js.stream_info(stream)).cluster
            if cluster is None or cluster.leader:
                return made
            error: Exception = TimeoutError(f"stream {stream} has no leader after {within:.0f} s")
        except Exception as e:  # noqa: BLE001 - retried until the deadline, then raised
            if getattr(e, "err_code", None) in _CONFIG_REFUSED:  # no retry mends these
                raise
            error = e
        if time.monotonic() > deadline:
            raise error
        await asyncio.sleep(0.2)


# How often a connection pings its server (seconds): a server that stops
# answering (paused: a VM stall) is left for another of the cluster after two
# unanswered pings, not nats-py's minutes, so a worker's leases outlive it.
PING_INTERVAL: Final = 2.0

# JetStream's answers that say "not now" rather than "no": a message of that
# id is still being stored (a retry overtook the first send to a leader that
# was paused: JSStreamDuplicateMessageConflict, 409) and the cluster has no
# leader for the request yet (JSClusterNotAvailErr 10008, JSClusterNotLeaderErr 10009).
_NOT_NOW: Final = (10158, 10008, 10009)


async def enter_answered(stack: AsyncExitStack, opener: Callable[[], AbstractAsyncContextManager[T]], *,
                         retry_for: float, what: str) -> T:
    """`opener()` entered on `stack`, made again from the start while its
    requests get no answer (the cluster electing a leader: a node was just
    lost), for `retry_for` seconds: for a start, whose every step is
    idempotent and which has served nothing yet."""
    deadline = trio.current_time() + retry_for
    while True:
        try:
            return await stack.enter_async_context(opener())
        except Exception as e:  # noqa: BLE001 - sorted: only "no answer" is tried again
            if not all(unanswered(x) or (x.__cause__ is not None and unanswered(x.__cause__))
                       for x in leaf_errors(e)) or trio.current_time() > deadline:
                raise
            _log.warning("the NATS servers did not answer the start of %s (%s); starting it again", what, e)
            await trio.sleep(1.0)


class SendAgain(Exception):
    """A publish that waited for its answer when the stream's leader changed,
    or the connection was made again: the answer may never come (a leader
    that died with it), so it is sent again now, same id (stored once),
    instead of after the answer's whole timeout (`Publisher.send_again`)."""


def unanswered(error: BaseException) -> bool:
    """A publish that may not have reached a leader, or whose ack was lost, or
    that the cluster cannot take yet: retried with the same message id, it
    is stored once."""
    import nats.errors
    import nats.js.errors
    return (isinstance(error, (SendAgain, nats.errors.TimeoutError, asyncio.TimeoutError, nats.errors.NoRespondersError,
                               nats.js.errors.NoStreamResponseError, nats.errors.ConnectionReconnectingError,
                               nats.js.errors.ServiceUnavailableError,
                               # (a reconnect's buffer full: not sent, so sent again safely)
                               nats.errors.OutboundBufferLimitError))
            or getattr(error, "err_code", None) in _NOT_NOW)


async def ensure_stream(js: Any, stream: str, prefix: str, replicas: int, create: bool) -> bool:
    """The stream, made if missing (`create`), else only looked up; whether
    it takes atomic batches (`allow_atomic`, `Publisher.publish_batched`).
    A stream is made taking them; one of ours made before they were (what
    an older worker asks for, exactly: the same subjects, copies and
    duplicate window) is used as it is, its messages published one by one
    (an operator may set `allow_atomic` on it, a stream edit that changes
    nothing else: the next start batches). Any other config is refused,
    naming what differs."""
    from nats.js.errors import NotFoundError
    if not create:  # (read only: verify, migrate from it)
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            raise StoreBroken(f"there is no stream {stream} on the NATS servers") from None
        return bool(info.config.allow_atomic)

    def add(atomic: bool) -> Awaitable[Any]:
        return js.add_stream(name=stream, subjects=[f"{prefix}.>"], num_replicas=replicas,
                             duplicate_window=DUPLICATE_WINDOW, **({"allow_atomic": True} if atomic else {}))
    try:
        made = await until_led(js, stream, lambda: add(True))
        return bool(made.config.allow_atomic)  # (servers before 2.12 make it without: not batched)
    except Exception as e:
        if getattr(e, "err_code", None) == 10065:  # JSStreamSubjectOverlapErr
            raise StoreBroken(f"stream {stream}: its subjects {prefix}.> overlap with another stream's "
                              "on the NATS servers; choose another stream name") from None
        if getattr(e, "err_code", None) == 10005:  # no suitable peers for placement
            raise StoreBroken(f"stream {stream} does not exist yet, and making it needs all {replicas} of its "
                              "servers up (fewer are): start it with every node up once") from None
        if getattr(e, "err_code", None) != 10058:  # (JSStreamNameExistErr: there, with another config)
            raise StoreBroken(f"stream {stream}: the NATS servers did not make or find it: "
                              f"{type(e).__name__}: {e}") from e
    try:  # ours as a worker made it before atomic batches: the same request without them
        made = await until_led(js, stream, lambda: add(False))
        return bool(made.config.allow_atomic)
    except Exception as e:
        if getattr(e, "err_code", None) != 10058:
            raise StoreBroken(f"stream {stream}: the NATS servers did not make or find it: "
                              f"{type(e).__name__}: {e}") from e
    config = (await until_led(js, stream, lambda: js.stream_info(stream))).config
    differs = [f"{what} {have} (a worker's: {want})" for what, have, want in (
        ("subjects", config.subjects, [f"{prefix}.>"]), ("copies", config.num_replicas, replicas),
        ("duplicate window", config.duplicate_window, DUPLICATE_WINDOW)) if have != want]
    raise StoreBroken(f"stream {stream} is on the NATS servers with another config than a worker makes: "
                      f"{'; '.join(differs) or 'another setting (its limits, retention or storage: nats stream info)'}; "
                      "choose another stream name, or make it as a worker does")


def default_prefix(stream: str) -> str:
    """The subjects' prefix of a worker's stream (a session's: <prefix>.<id>)."""
    return f"sl.{stream}"


class _AckError(msgspec.Struct):
    code: int = 0
    err_code: int = 0
    description: str = ""


class _PubAck(msgspec.Struct):
    """A publish's answer (nats-py's api.PubAck's fields that are read:
    `seq`; an atomic batch's commit also has `count`, its messages)."""
    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    count: int = 0
    error: _AckError | None = None


_ACK = msgspec.json.Decoder(_PubAck)


def _api_error(err: _AckError) -> Exception:
    """nats-py's exception for an error answer (its from_error raises it)."""
    import nats.js.errors
    try:
        nats.js.errors.APIError.from_error(msgspec.structs.asdict(err))
    except nats.js.errors.APIError as e:
        return e
    raise AssertionError("unreachable")


class Publisher:
    """JetStream publishes whose answers come to one reply subscription of
    the connection (issue 29 item 4): a publish is a core publish with a
    reply subject of this publisher's, and a batch waits for its answers
    with one timeout. nats-py's `js.publish` is a request a message (a
    timer each, its answer decoded into a dict, then a dataclass: ~60 us of
    the worker's CPU a message where this takes ~20, measured in bench/README.md),
    and its `publish_async` leaves a
    future unresolved on an error answer. One per JetStream context
    (`publisher_of`), on the asyncio loop."""

    def __init__(self, nc: Any, timeout: float) -> None:
        self.nc, self.timeout = nc, timeout
        self._prefix = ""
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._n = 0
        self._batch_prefix, self._batches = secrets.token_hex(8) + ".", 0  # (atomic batches' ids: <= 64 chars)
        self.refused_batches = 0  # atomic batches refused whole, published again one by one
        self.batching, self.chunk_max = True, ATOMIC_MAX  # (what refusals taught: `_learn`)

    async def _on_answer(self, msg: Any) -> None:
        fut = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if fut is None or fut.done():
            return
        if not msg.data and msg.headers and msg.headers.get("Status") == "503":  # no stream took it
            import nats.js.errors
            fut.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            ack = _ACK.decode(msg.data)
        except msgspec.DecodeError as e:
            fut.set_exception(StoreBroken(f"a JetStream answer that does not decode: {e}: {msg.data[:200]!r}"))
            return
        if ack.error is not None:
            fut.set_exception(_api_error(ack.error))
        elif ack.seq <= 0 or not ack.stream:  # (no server answers so: not taken for a stored message)
            fut.set_exception(StoreBroken(f"a JetStream answer with no stream sequence: {msg.data[:200]!r}"))
        else:
            fut.set_result(ack)

    def send_again(self, why: str) -> None:
        """Every publish waiting for its answer gets SendAgain (on the
        asyncio loop): the stream's leader was elected anew or the connection
        made again, and an answer the old leader owed is lost with it."""
        waiting = [fut for fut in self._waiting.values() if not fut.done()]
        for fut in waiting:
            fut.set_exception(SendAgain(why))
        if waiting:
            _log.info("%s: %d publishes waiting for their answers are sent again", why, len(waiting))

    async def publish_all(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> list[Any]:
        """Publish every (subject, data, headers) in order; each one's answer
        or exception (nats.errors.TimeoutError: none within the timeout)."""
        return await self._publish([(subject, data, headers, True) for subject, data, headers in messages])

    async def publish_batched(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> list[Any]:
        """As `publish_all`, in JetStream atomic batches (a stream that allows
        them: ADR-50) of up to ATOMIC_MAX messages and ATOMIC_MAX_BYTES: a
        batch is stored whole or not at all, and answered once, at its last
        message, with that one's stream sequence (the others precede it, in
        order). No answer a message: half the worker's CPU a message and a
        quarter of the servers' (bench/README.md, issue 29 item 4).

        Each message's answer is as `publish_all`'s would be:
        - a batch stored: each message's sequence, counted back from the last;
        - a batch refused whole by an error answer (a fence refused, a message
          id stored already (a retry of a batch stored), the stream not
          allowing batches, the servers' limits), or answered as no atomic
          batch is: its messages published again one by one, whose answers
          say which message it was about and store the rest (a stored id
          is a duplicate's ack); what the refusal says about the next
          batches is learnt (`_learn`: fewer messages a batch, or none);
        - a batch not answered (or answered "not now"): that error for each
          of its messages, for `publish_answered` to send again.
        Every message must have a `Nats-Msg-Id` (else all go one by one): a
        message sent again is stored once by it.
        """
        if not self.batching or len(messages) < 2 or not all("Nats-Msg-Id" in h for _, _, h in messages):
            return await self.publish_all(messages)  # (one published again must be known by its id)
        chunks: list[list[tuple[str, bytes, dict[str, str]]]] = [[]]
        size = 0
        for message in messages:  # (at most chunk_max messages and ATOMIC_MAX_BYTES a batch)
            if chunks[-1] and (len(chunks[-1]) >= self.chunk_max or size + len(message[1]) > ATOMIC_MAX_BYTES):
                chunks.append([])
                size = 0
            chunks[-1].append(message)
            size += len(message[1])
        items: list[tuple[str, bytes, dict[str, str], bool]] = []
        for chunk in chunks:
            self._batches += 1
            batch_id = f"{self._batch_prefix}{self._batches}"
            last = len(chunk) - 1
            for j, (subject, data, headers) in enumerate(chunk):
                marks = {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(j + 1)}
                if j == last:
                    marks["Nats-Batch-Commit"] = "1"
                items.append((subject, data, {**headers, **marks}, j == last))
        answers = await self._publish(items)
        out: list[Any] = []
        alone: list[int] = []  # (positions in `messages` published again one by one)
        for chunk, answer in zip(chunks, answers):
            if isinstance(answer, BaseException) and (unanswered(answer) or getattr(answer, "err_code", None) is None):
                out.extend([answer] * len(chunk))
                continue
            if isinstance(answer, BaseException) or answer.count != len(chunk):
                # refused whole, or not an atomic batch's answer (a server that
                # stored them one by one: sent again, each is a duplicate of its id)
                self.refused_batches += 1
                self._learn(answer)
                alone.extend(range(len(out), len(out) + len(chunk)))
                out.extend([None] * len(chunk))
            else:
                first = answer.seq - len(chunk) + 1
                out.extend(_PubAck(stream=answer.stream, seq=first + j) for j in range(len(chunk)))
        if alone:
            for i, answer in zip(alone, await self.publish_all([messages[i] for i in alone])):
                out[i] = answer
        return out

    def _learn(self, refusal: Any) -> None:
        """What a batch refused whole says about the next ones: the stream
        takes none (10174: allow_atomic unset since), the servers cap a
        batch below chunk_max (10199: half as many), or answers as no atomic
        batch (a server before 2.12): batching stops, or shrinks, once,
        logged; anything else (a conflict, a retry's stored ids, the servers'
        batches in flight, 10210) is about that batch only."""
        code = getattr(refusal, "err_code", None)
        if code == 10199 and self.chunk_max > 2:
            self.chunk_max //= 2
            _log.warning("the NATS servers refuse atomic batches of this size (%s); batches of %d messages from now on",
                         refusal, self.chunk_max)
        elif code in (10174, 10199) or not isinstance(refusal, BaseException):
            self.batching = False
            _log.warning("the NATS servers take no atomic batches on this stream (%s); publishing one message at a "
                         "time from now on (sessionlog_stream_atomic_batches 0)", refusal)

    async def _publish(self, items: list[tuple[str, bytes, dict[str, str], bool]]) -> list[Any]:
        """Publish every (subject, data, headers, answered) in order; the
        answer or exception of each one sent `answered` (with a reply subject
        of this publisher's), in order."""
        import nats.errors
        nc = self.nc
        if not self._prefix:  # (unset again if the subscribe fails: tried anew by the next batch)
            prefix = nc.new_inbox() + "."
            self._prefix = prefix
            try:
                await nc.subscribe(prefix + "*", cb=self._on_answer, pending_msgs_limit=10_000_000,
                                   pending_bytes_limit=1 << 30)
            except BaseException:
                self._prefix = ""
                raise
        loop = asyncio.get_running_loop()
        keys: list[str] = []
        futures: list[asyncio.Future[Any]] = []
        try:
            for subject, data, headers, answered in items:
                if not answered:
                    try:
                        await nc.publish(subject, data, headers=headers)
                    except Exception:  # noqa: BLE001 - its batch is not committed: the commit's answer says so
                        pass
                    continue
                self._n += 1
                key = str(self._n)
                fut = loop.create_future()
                self._waiting[key] = fut
                keys.append(key)
                futures.append(fut)
                try:
                    await nc.publish(subject, data, reply=self._prefix + key, headers=headers)
                except Exception as e:  # noqa: BLE001 - that message's answer (a reconnect: sent again)
                    self._waiting.pop(key, None)
                    fut.set_exception(e)
            if futures:
                await asyncio.wait(futures, timeout=self.timeout)
            return [(fut.exception() or fut.result()) if fut.done() else nats.errors.TimeoutError()
                    for fut in futures]
        finally:  # (answered, timed out or cancelled: nothing of this batch is waited for any more)
            for key, fut in zip(keys, futures):
                self._waiting.pop(key, None)
                if fut.done() and not fut.cancelled():
                    fut.exception()  # (retrieved: no "never retrieved" warning on a cancel)
                fut.cancel()


async def connect(servers: list[str], timeout: float) -> tuple[Any, Any]:
    """A log's connection and its JetStream context (`timeout`: a request's
    answer time): reconnecting for ever, pinging its server every
    PING_INTERVAL; when the connection is made again, the publishes that
    waited for answers are sent again at once (`Publisher.send_again`: an
    answer may be lost with the server). On the asyncio loop."""
    import nats
    made: list[Any] = []

    async def reconnected() -> None:
        if made:
            publisher_of(made[0]).send_again("the connection to the NATS servers was made again")
    nc = await nats.connect(servers=servers, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
                            ping_interval=PING_INTERVAL, max_outstanding_pings=2, reconnected_cb=reconnected)
    made.append(nc.jetstream(timeout=timeout))
    return nc, made[0]


async def send_again_at_elections(nc: Any, js: Any, stream: str) -> None:
    """When the servers announce a new leader of `stream`, the publishes that
    waited for answers are sent again at once (same ids: stored once): an
    answer the old leader owed is lost with it, and the write stall of its
    loss is then the election's, not the election's plus `timeout`."""
    async def elected(msg: Any) -> None:
        publisher_of(js).send_again(f"stream {stream} has a new leader")
    await nc.subscribe(f"$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED.{stream}", cb=elected)


def publisher_of(js: Any) -> Publisher:
    """The JetStream context's Publisher (made on first use, with the
    context's connection and request timeout)."""
    pub = getattr(js, "_sessionlog_publisher", None)
    if pub is None:
        pub = Publisher(js._nc, js._timeout)
        js._sessionlog_publisher = pub
    return pub


async def publish_answered(js: Any, messages: list[tuple[str, bytes, dict[str, str]]], retry_for: float,
                           retried: Callable[[int], None], batched: bool = False) -> list[Any]:
    """Publish every (subject, data, headers) at once (`batched`: in atomic
    batches, `Publisher.publish_batched`); those not answered, again with the
    same headers (the message id makes a retry of a stored one a duplicate
    ack, checked before the fence), until `retry_for` seconds have passed.
    Returns each one's ack or exception (on the asyncio loop)."""
    acks: list[Any] = [None] * len(messages)
    todo, deadline = list(range(len(messages))), time.monotonic() + retry_for
    publisher = publisher_of(js)
    publish = publisher.publish_batched if batched else publisher.publish_all
    while True:
        got = await publish([messages[i] for i in todo])
        for i, ack in zip(todo, got):
            acks[i] = ack
        todo = [i for i in todo if isinstance(acks[i], BaseException) and unanswered(acks[i])]
        if not todo or time.monotonic() > deadline:
            return acks
        retried(len(todo))
        await asyncio.sleep(0.1)


def split_by_size(items: list[tuple[int, bytes]], limit: int) -> list[list[tuple[int, bytes]]]:
    """(seq, line)s in runs of at most `limit` bytes, one message each (no
    line is over it: JetStreamLog refuses such a record)."""
    out: list[list[tuple[int, bytes]]] = [[]]
    size = 0
    for item in items:
        if out[-1] and size + len(item[1]) > limit:
            out.append([])
            size = 0
        out[-1].append(item)
        size += len(item[1])
    return out


async def unsubscribe_quietly(sub: Any) -> None:
    """End a read's consumer. A read given up (its crossing cancelled: the
    command or the worker stopping) may find the connection closed: nothing
    to end then, and no "Task exception was never retrieved" traceback."""
    try:
        await sub.unsubscribe()
    except Exception:  # noqa: BLE001 - the connection closed under it
        pass


async def read_subject(js: Any, stream: str, subject: str, direct_gets: int,
                       start: int = 1) -> tuple[bytes, int, list[tuple[int, int]]]:
    """A subject's messages from stream sequence `start` on, joined, the
    stream sequence of its last one (0: none), and each message's (stream
    sequence, offset just past it in the joined bytes)."""
    from nats.js.api import ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError
    parts: list[bytes] = []
    marks: list[tuple[int, int]] = []
    seq, end = start, 0

    def take(data: bytes | None, stream_seq: int) -> None:
        nonlocal end
        parts.append(data or b"")
        end += len(data or b"")
        marks.append((stream_seq, end))
    # A short session: one get a message. A long one (a rebase or load
    # of thousands) from an ordered consumer, up to its last message now;
    # by gets again if no consumer can be made (the meta leader lost).
    async def by_gets(limit: float) -> bool:
        nonlocal seq
        while len(marks) < limit:
            try:
                msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
            except NotFoundError:
                return True
            take(msg.data, msg.seq)
            seq = msg.seq + 1
        return False
    if await by_gets(direct_gets):
        return b"".join(parts), (marks[-1][0] if marks else 0), marks
    try:
        last = (await js.get_last_msg(stream, subject)).seq
    except NotFoundError:  # purged meanwhile
        return b"", 0, []
    try:
        sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq))
    except Exception:  # noqa: BLE001 - no consumer now: the slow way
        await by_gets(float("inf"))
        return b"".join(parts), (marks[-1][0] if marks else 0), marks
    try:
        while seq <= last:
            msg = await sub.next_msg(timeout=30)
            take(msg.data, msg.metadata.sequence.stream)
            seq = msg.metadata.sequence.stream + 1
    finally:
        await unsubscribe_quietly(sub)
    return b"".join(parts), marks[-1][0], marks


async def bucket_entries(js: Any, bucket: str, chase_for: float = 10.0) -> tuple[list[str], list[tuple[str, int]]]:
    """The keys of a KV bucket that hold a value (none if the bucket does not
    exist), and the keys whose last message is a delete or purge marker,
    each with that marker's stream sequence (what `kv.delete` leaves
    behind: Leases purges them). nats-py's `kv.keys()` can
    answer none for a bucket that has some: it takes "nothing pending,
    nothing received" for the end while the consumer's first message is
    still on its way to the client (a busy machine).

    Here the read goes on to the stream's last message, asked for after the
    consumer was made (or, that one purged, until the consumer has sent all
    it had and all of it came), and then to the newest one as long as more came
    meanwhile: a key updated during the read (history 1: its message read
    from the first pass removed before it was delivered) is delivered as
    new, before an end that found nothing new. After `chase_for` seconds of
    updates arriving faster than they are read, it answers what it read: a
    key missed then was being written to (a lease being renewed)."""
    import nats.errors
    from nats.js.api import DeliverPolicy
    from nats.js.errors import NotFoundError
    from nats.js.kv import KV_MARKER_REASON, KV_OP
    stream, prefix = f"KV_{bucket}", f"$KV.{bucket}."
    try:
        sub = await js.subscribe(f"{prefix}>", stream=stream, ordered_consumer=True, headers_only=True,
                                 deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
    except NotFoundError:
        return [], []
    try:
        held: dict[str, int] = {}  # key: 0 if it holds a value, else its marker's stream sequence
        seq, deadline = 0, time.monotonic() + chase_for
        dseq = 0  # the consumer's own sequence of the last message come (its count, since a reset)
        while True:
            last = (await js.stream_info(stream)).state.last_seq
            if seq >= last or time.monotonic() > deadline:
                break
            while seq < last and time.monotonic() < deadline:
                try:
                    msg = await sub.next_msg(timeout=0.1)
                except nats.errors.TimeoutError:
                    # The stream's last messages purged (a lease dropped): its last
                    # sequence is none the consumer will deliver. Done once it has
                    # nothing pending and all it sent has come.
                    info = await sub.consumer_info()
                    if not info.num_pending and int(info.delivered.consumer_seq or 0) <= dseq:
                        seq = last
                    continue
                seq, dseq = msg.metadata.sequence.stream, msg.metadata.sequence.consumer
                headers = msg.headers or {}
                live = KV_OP not in headers and KV_MARKER_REASON not in headers
                held[msg.subject[len(prefix):]] = 0 if live else seq
    finally:
        await unsubscribe_quietly(sub)
    return sorted(k for k, marker in held.items() if not marker), sorted((k, m) for k, m in held.items() if m)
