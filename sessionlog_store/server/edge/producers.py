"""External producers (docs/HTTP.md, "Producing a reply"): a backend outside
the server opens a reply, streams text into it over HTTP and ends it.

    POST /v1/sessions/{id}/replies                      -> 201 {reply_id, stream, producer_timeout}
    POST /v1/stream/sessions/{id}/messages/{reply_id}   text/plain: appended (Durable Streams appends,
                                                        idempotent with Producer-Id/-Epoch/-Seq);
                                                        with `Stream-Closed: true`: the reply ends
                                                        (`Stream-Status: error` and `Stream-Error`
                                                        for a failure)

Each open reply is an in-flight message of the store (`store.inflight`, as
an in-process agent's) held by a task of the server's: its placeholder is
durable before the open is answered; an append is one progress record, in
the log and fanned out when it is answered (a reader reads its own writes)
and durable with the next group commit; a stop (a user's Stop,
from any client) ends it `aborted` "stopped by user" and the producer's next
append is refused `message_finished`; a producer silent for longer than
the producer timeout has its reply ended `aborted` "producer lost", with
the text it had sent. Ending it waits until its finalize is durable.

Idempotent appends follow the protocol: per (reply, Producer-Id) the last
epoch and seq; a retry of an accepted seq answers 204 and appends nothing.
The state lives as long as the reply runs (a reply is one producer's work).
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import trio

from sessionlog_store.server.domain.errors import Conflict, NotFound, ServiceError

if TYPE_CHECKING:
    from sessionlog_store.server.domain.inflight import InflightMessage
    from sessionlog_store.server.domain.store import SessionStore
    from sessionlog_store.server.edge.limits import Quotas

log = logging.getLogger("sessionlog.producers")

# A producer silent this long loses its reply (the flag --producer-timeout).
PRODUCER_TIMEOUT: Final = 30.0
# Ended external replies remembered (to say how one ended to a late append).
ENDED_KEPT: Final = 4096
MAX_INT: Final = 2**53 - 1


class ProducerError(Exception):
    """The producer ended its reply as failed (its words become the message's error)."""


@dataclass
class Producer:
    epoch: int
    seq: int


@dataclass
class ExternalReply:
    session_id: str
    msg_id: str
    owner: str
    msg: InflightMessage
    closing: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)
    failure: str | None = None          # the producer's error, when it ends it as failed
    lock: trio.Lock = field(default_factory=trio.Lock)
    producers: dict[str, Producer] = field(default_factory=dict)


@dataclass(frozen=True)
class AppendResult:
    status: int                 # 200 new data, 204 a duplicate or a plain append
    next_offset: int
    producer: tuple[int, int] | None = None  # (epoch, seq) echoed
    closed: str | None = None   # the reply's end, when this request ended it


class Producers:
    """The external replies of one server."""

    def __init__(self, store: SessionStore, quotas: Quotas, timeout: float = PRODUCER_TIMEOUT) -> None:
        self.store, self.quotas, self.timeout = store, quotas, timeout
        self.replies: dict[tuple[str, str], ExternalReply] = {}
        # How a recent one ended, with its producers' last (epoch, seq): a
        # retried close (its answer lost) is answered as the close was.
        self.ended: OrderedDict[tuple[str, str], tuple[str, dict[str, Producer]]] = OrderedDict()

    async def open(self, nursery: trio.Nursery, session_id: str, owner: str, *, kind: str,
                   parent_id: str | None, caller: str | None, role: str | None = None,
                   metadata: dict[str, Any] | None = None) -> ExternalReply:
        """A new reply, its placeholder durable on return (a turn: refused
        `reply_running` while another reply runs in the session, as a chat)."""
        store, quotas = self.store, self.quotas
        quotas.start_reply(owner)
        turn = caller is None
        try:
            if turn:
                store.claim_turn(session_id)
            try:
                reserved = await store.reserve_reply(session_id) if turn else None
                try:
                    role = role or ("assistant" if kind == "llm_reply" else "tool")
                    reply: ExternalReply = await nursery.start(self._hold, session_id, owner, kind, parent_id,
                                                               caller, reserved, role, dict(metadata or {}))
                except BaseException:
                    await store.reply_released(session_id, reserved)
                    raise
            finally:
                if turn:
                    store.end_turn(session_id)
        except BaseException:
            quotas.end_reply(owner)
            raise
        return reply

    async def _hold(self, session_id: str, owner: str, kind: str, parent_id: str | None, caller: str | None,
                    reserved: str | None, role: str, metadata: dict[str, Any],
                    task_status: trio.TaskStatus[ExternalReply] = trio.TASK_STATUS_IGNORED) -> None:
        store, started = self.store, False
        reply: ExternalReply | None = None
        try:
            async with store.inflight(session_id, kind=kind, role=role, parent_id=parent_id, caller=caller,
                                      metadata=metadata, msg_id=reserved, leased=reserved is not None) as msg:
                reply = ExternalReply(session_id, msg.msg_id, owner, msg)
                self.replies[(session_id, msg.msg_id)] = reply
                task_status.started(reply)
                started = True
                while not reply.closing.is_set():
                    left = self.timeout - (trio.current_time() - msg.last_activity)
                    if left <= 0:
                        msg.abort_reason = "producer lost"
                        msg.scope.cancel()
                        await trio.lowlevel.checkpoint()
                    with trio.move_on_after(max(left, 0.0)):
                        await reply.closing.wait()
                if reply.failure is not None:
                    raise ProducerError(reply.failure)
        except ProducerError:
            pass  # (finalized `error` with its words)
        except Exception:
            if not started:
                raise  # the opener gets the real error (unknown_session, reply_running, read_only...)
            log.exception("external reply in session %s", session_id)
        finally:
            self.quotas.end_reply(owner)
            if reply is not None:
                key = (session_id, reply.msg_id)
                self.replies.pop(key, None)
                m = store.loaded(session_id)
                node = m.messages.get(reply.msg_id) if m is not None else None
                how = node.status if node is not None else (  # (its state evicted: how it was ended here)
                    "error" if reply.failure is not None else "aborted" if reply.msg.scope.cancel_called else "done")
                self.ended[key] = (how, dict(reply.producers))
                while len(self.ended) > ENDED_KEPT:
                    self.ended.popitem(last=False)
                reply.ended.set()

    def reply_of(self, session_id: str, msg_id: str) -> ExternalReply:
        """The running external reply, or the error for one that is not (or no longer) one."""
        reply = self.replies.get((session_id, msg_id))
        if reply is not None and not reply.msg.finished:
            return reply
        state = self.store.loaded(session_id)
        node = state.messages.get(msg_id) if state is not None else None
        kept = self.ended.get((session_id, msg_id))
        how = kept[0] if kept is not None else node.status if node is not None else None
        if how is not None and how not in ("running", "pending"):
            reason = node.metadata.get("aborted_reason") if node is not None else None
            raise Conflict("message_finished", f"message {msg_id} has ended ({how}"
                           f"{': ' + reason if reason else ''}); nothing more is appended")
        if node is not None:
            raise Conflict("not_producer", f"message {msg_id} is produced by another producer (an agent of the "
                           "server, or another worker's)")
        raise NotFound("unknown_message", f"unknown message {msg_id!r}")

    async def append(self, reply: ExternalReply, text: str, producer: tuple[str, int, int] | None,
                     close: str | None, error: str | None) -> AppendResult:
        """Append `text` (and with `close`, "done" or "error", end the reply):
        serialized per reply, idempotent per producer id."""
        async with reply.lock:
            if reply.msg.finished:  # (stopped, or lost, while this request waited): nothing is taken, no seq counted
                self.reply_of(reply.session_id, reply.msg_id)
            echo = None
            if producer is not None:
                pid, epoch, seq = producer
                state = reply.producers.get(pid)
                if state is not None and epoch < state.epoch:
                    raise StaleEpoch(state.epoch)
                if state is not None and epoch == state.epoch and seq <= state.seq:
                    return AppendResult(204, reply.msg.length, (epoch, state.seq))
                expected = 0 if state is None or epoch > state.epoch else state.seq + 1
                if seq != expected:
                    if state is not None and epoch > state.epoch:
                        raise ServiceError("bad_request", "a new producer epoch starts at Producer-Seq 0")
                    raise SeqGap(expected, seq)
                reply.producers[pid] = Producer(epoch, seq)
                echo = (epoch, seq)
            reply.msg.write(text)
            # One record per append (a producer batches its own deltas): at
            # once in the log and told to every reader (read-your-writes),
            # durable with the next group commit.
            self.store.saver.flush(reply.msg)
            if close is None:
                return AppendResult(200 if echo is not None else 204, reply.msg.length, echo)
            reply.failure = (error or "the producer failed") if close == "error" else None
            reply.closing.set()
            with trio.CancelScope(shield=True):
                await reply.ended.wait()  # its finalize is durable
            kept = self.ended.get((reply.session_id, reply.msg_id))
            return AppendResult(200 if echo is not None else 204, reply.msg.length, echo,
                                closed=kept[0] if kept is not None else close)

    async def progress(self, reply: ExternalReply, tokens: tuple[int, int] | None, tree: Any) -> dict[str, int]:
        """Set a running reply's token totals and (not None) its tree: one
        progress record, at once in the log and told to readers."""
        async with reply.lock:
            if reply.msg.finished:
                self.reply_of(reply.session_id, reply.msg_id)
            if tokens is not None:
                reply.msg.set_tokens(*tokens)
            if tree is not None:
                reply.msg.set_tree(tree)
            self.store.saver.flush(reply.msg)
            return dict(reply.msg.tokens)

    def retried(self, session_id: str, msg_id: str, producer: tuple[str, int, int] | None) -> AppendResult | None:
        """An ended reply's append that its producer had made already (a retry
        whose answer was lost): answered as a duplicate, with how it ended."""
        kept = self.ended.get((session_id, msg_id))
        if kept is None or producer is None:
            return None
        how, producers = kept
        pid, epoch, seq = producer
        last = producers.get(pid)
        if last is None or epoch != last.epoch or seq > last.seq:
            return None
        state = self.store.loaded(session_id)
        node = state.messages.get(msg_id) if state is not None else None
        return AppendResult(204, len(node.content) if node is not None else 0, (epoch, last.seq), closed=how)


class StaleEpoch(ServiceError):
    def __init__(self, epoch: int) -> None:
        super().__init__("stale_epoch", f"a newer producer epoch ({epoch}) writes this reply")
        self.epoch = epoch


class SeqGap(ServiceError):
    def __init__(self, expected: int, received: int) -> None:
        super().__init__("producer_seq_gap", f"Producer-Seq {received} where {expected} was expected")
        self.expected, self.received = expected, received
