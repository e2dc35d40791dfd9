"""Replies and their branches, as methods of SessionStore: running in-flight
messages (placeholder, throttled progress, terminal state), finalize, stop,
retry on a sibling branch, switching branches, and subscribing with exact
resume. A mixin: its methods take the store as `self`.
"""
from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from sessionlog_store.eventstore.errors import EventStoreError, MessageFinished
from sessionlog_store.eventstore.events import Event, HeadMoved, MessageCreated, MessageFinalized, SessionFlags
from sessionlog_store.eventstore.ids import new_session_id
from sessionlog_store.eventstore.record import scan
from sessionlog_store.projections.lifecycle import OPEN_STATUSES, TERMINAL_STATUSES, check_move
from sessionlog_store.projections.recovery import fold_until
from sessionlog_store.projections.session import MessageSnapshot, SessionState
from sessionlog_store.server.domain.errors import BadRequest, Conflict, NotFound
from sessionlog_store.server.domain.fields import valid_kind
from sessionlog_store.server.domain.inflight import InflightMessage, scrub_surrogates
from sessionlog_store.server.domain.subscriptions import MsgUpdate, Subscription

if TYPE_CHECKING:
    from sessionlog_store.eventstore.backend import Appended, EventLog
    from sessionlog_store.projections.registry import Registry
    from sessionlog_store.server.domain.inflight import ThrottledSaver
    from sessionlog_store.server.domain.sharing import SharedLog
    from sessionlog_store.server.domain.states import LoadedStates
    from sessionlog_store.server.domain.subscriptions import SubscriptionHub

log = logging.getLogger("sessionlog.store")

# A producer's exception is logged in its finalize record, cut to this length.
MAX_ERROR_CHARS: Final = 4000


class RepliesHost(Protocol):
    """What the reply and branch operations use of the session store (it
    hands itself in: the store's module is never imported here)."""
    es: EventLog
    registry: Registry
    saver: ThrottledSaver
    hub: SubscriptionHub
    worker: SharedLog | None
    states: LoadedStates

    @property
    def shutting_down(self) -> bool: ...
    async def log_bytes(self, session_id: str) -> bytes: ...
    async def load_session(self, session_id: str) -> SessionState: ...
    async def append_events(self, session_id: str, *events: Event) -> list[Appended]: ...
    def notify(self, kind: str, data: dict[str, Any], owner: str | None = None) -> None: ...
    def after_reply(self, session_id: str) -> None: ...
    def failure(self) -> BaseException | None: ...


class Replies:
    """The store's reply and branch operations (SessionStore hands each out
    as its own method): in-flight messages, turns, stops, retries, branch
    switches and subscriptions."""

    def __init__(self, host: RepliesHost) -> None:
        self.host = host
        self.turns: set[str] = set()  # sessions whose new turn is being started here (claim_turn)

    def list_running(self, owner: str | None = None) -> list[dict[str, Any]]:
        """Every message running in this process, across sessions (of `owner`'s
        only, unless it is None), oldest first: session, message, kind, role,
        caller, started_at and its length so far. On a shared stream, the
        replies other workers stream too (their length as of their last
        message on the stream)."""
        rows = self.host.registry.rows
        out = [{"session_id": m.session_id, "msg_id": m.msg_id, "kind": m.kind, "role": m.role,
                "caller": m.caller, "started_at": m.started_at, "length": m.length}
               for m in self.host.saver.active.values() if not m.finished
               and (owner is None or (m.session_id in rows and rows[m.session_id].owner == owner))]
        if self.host.worker is not None:  # and the replies other workers stream
            out += [dict(r) for key, r in self.host.worker.others_running() if key not in self.host.saver.active
                    and (owner is None or (key[0] in rows and rows[key[0]].owner == owner))]
        return sorted(out, key=lambda r: r["started_at"])

    def claim_turn(self, session_id: str) -> None:
        """`turn_free`, and the turn is this caller's until `end_turn` (its
        reply's placeholder is written, or the turn failed): two turns sent at
        once to this process are one accepted, one refused (the check and the
        claim take no await between them)."""
        self.turn_free(session_id)
        self.turns.add(session_id)

    def end_turn(self, session_id: str) -> None:
        self.turns.discard(session_id)

    def turn_free(self, session_id: str) -> None:
        """A new turn (a chat, a retry) waits for the session's running reply:
        Conflict `reply_running` while any of its messages runs, here or (on a
        shared stream, as the tail brought it) on another worker, or while
        another turn of it is being started here."""
        if session_id in self.turns:
            raise Conflict("reply_running", f"a turn is starting in session {session_id}: send when its "
                                                "reply has ended")
        meta = self.host.registry.get(session_id)
        if meta is None or not meta.open_msgs or self.host.failure() is not None:
            return  # (a failed store: the write says store_broken)
        if self.host.worker is None and not any((session_id, m) in self.host.saver.active for m in meta.open_msgs):
            return  # (a local store: nothing runs without its producer here)
        raise Conflict("reply_running", f"a reply is running in session {session_id}: stop it, or send "
                                            "when it has ended")

    async def reserve_reply(self, session_id: str) -> str | None:
        """On a shared stream, a turn's reply id with its lease and the
        session's turn taken (before anything of the turn is written: a chat's reply that could not start
        would leave its user's message alone); `reply_released` gives it up if
        the reply does not start. None on the local store (nothing to take)."""
        if self.host.worker is None:
            return None
        msg_id = new_session_id()
        await self.host.worker.reply_starting(session_id, msg_id, turn=True)
        return msg_id

    async def reply_released(self, session_id: str, msg_id: str | None) -> None:
        if self.host.worker is not None and msg_id is not None:
            with trio.CancelScope(shield=True):
                await self.host.worker.reply_ended(session_id, msg_id)

    @asynccontextmanager
    async def inflight(self, session_id: str, *, kind: str = "llm_reply", role: str = "assistant",
                       parent_id: str | None = None, caller: str | None = None,
                       metadata: dict[str, Any] | None = None, msg_id: str | None = None,
                       leased: bool = False) -> AsyncIterator[InflightMessage]:
        """Run in-flight work as a message: a durable placeholder before the block,
        throttled progress while it runs, and a durable terminal state after it:
        done on a normal exit, error on an exception, aborted on cancellation
        (with the reason: "stopped by user", "stalled", "server shutdown").
        `parent_id`: None = the current head, "" = a root message. `msg_id`:
        the message's id, when the caller made it (`leased`: and, on a shared
        stream, took its lease already: `reserve_reply`)."""
        try:
            state = await self.host.load_session(session_id)
            if not valid_kind(role, kind) or kind in ("chat", "relocate"):
                raise BadRequest("bad_field", f"bad in-flight kind {kind!r} or role {role!r}")
            if parent_id and parent_id not in state.messages:
                raise NotFound("unknown_message", f"unknown message {parent_id!r}")
            if self.host.shutting_down:
                raise Conflict("shutting_down", "the server is shutting down")
        except BaseException:
            if leased:  # (a reserved reply that does not start: its lease goes)
                await self.reply_released(session_id, msg_id)
            raise
        msg_id = msg_id or new_session_id()
        parent = state.head if parent_id is None else (parent_id or None)  # "": a root message
        moves_head = caller is None and parent != state.head  # a retry: a sibling branch becomes current
        placeholder = MessageCreated(msg_id=msg_id, role=role, kind=kind,  # type: ignore[arg-type]
                                     parent_id=parent, caller=caller, status="running",
                                     started_at=time.time(), metadata=metadata or {})
        events: list[Event] = [placeholder]
        if state.meta is not None and state.meta.status != "running":
            events.append(SessionFlags(status="running"))
        msg = InflightMessage(self.host.saver, session_id, msg_id, kind, role, parent, caller,
                              placeholder.started_at or 0.0)
        if self.host.worker is not None and not leased:  # the reply's lease first: a running reply always has one
            await self.host.worker.reply_starting(session_id, msg_id)
        calling = self.host.saver.active.get((session_id, caller)) if caller is not None else None
        if calling is not None:  # the caller's text written before this call precedes it in the log
            self.host.saver.flush(calling)
        try:
            with trio.CancelScope(shield=True):  # once queued, see it durable; a cancel lands in the body
                if session_id not in self.host.states:  # (dropped by other loads since: the reply folds into it)
                    await self.host.load_session(session_id)
                appended = await self.host.append_events(session_id, *events)
        except BaseException:
            if self.host.worker is not None:
                with trio.CancelScope(shield=True):
                    await self.host.worker.reply_ended(session_id, msg_id)
            raise
        if moves_head:
            self.host.notify("head_moved", {"session_id": session_id, "head": msg_id, "seq": appended[0].record.seq})
        # Live (stoppable, watched) only once its placeholder is durable.
        msg.last_activity = trio.current_time()
        self.host.saver.start(msg)
        if self.host.shutting_down:  # a stop began while the placeholder was written: it ends at once
            msg.abort_reason = "server shutdown"
            msg.scope.cancel()
        elif self.host.worker is not None and self.host.worker.stop_pending(session_id, msg_id):
            msg.abort_reason = "stopped by user"  # asked by another worker while its placeholder was written
            msg.scope.cancel()
        status, error, reason = "done", None, None
        try:
            with msg.scope:
                yield msg
            if msg.scope.cancelled_caught:
                status, reason = "aborted", msg.abort_reason or "stopped by user"
        except trio.Cancelled:
            status, reason = "aborted", msg.abort_reason or "server shutdown"
            raise
        except BaseException as e:
            status, error = "error", scrub_surrogates(f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS])
            raise
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await self._finalize(msg, status, error=error, reason=reason)
                finally:
                    # Its lease goes however it ended (finalized here or
                    # elsewhere, its session deleted, its lease lapsed or
                    # taken: a release of one no longer held is quiet).
                    if self.host.worker is not None:
                        await self.host.worker.reply_ended(msg.session_id, msg.msg_id)

    async def _finalize(self, msg: InflightMessage, status: str, *, error: str | None = None,
                        reason: str | None = None) -> None:
        if msg.finished:
            return
        self.host.saver.flush(msg)
        if msg.finished:
            return  # ended by its flush: finalized elsewhere, or (shared stream) its lease lapsed
        msg.finished = True
        self.host.saver.end(msg)
        if (msg.session_id not in self.host.registry or self.host.es.broken is not None
                or msg.session_id not in self.host.es or self.host.es.corruption(msg.session_id) is not None):
            return  # deleted, the store failed, or quarantined: no finalize can be written
        tokens = dict(msg.tokens) if any(msg.tokens.values()) else None
        try:
            await self.host.append_events(msg.session_id, *self._ending(msg.session_id, MessageFinalized(
                msg_id=msg.msg_id, status=status, error=error, aborted_reason=reason, tokens=tokens)))  # type: ignore[arg-type]
        except MessageFinished:
            pass  # another worker's finalize came first (a stop, a sweep): that one stands
        if status == "done" and msg.role == "assistant" and msg.kind == "llm_reply":
            self.host.after_reply(msg.session_id)

    def _ending(self, session_id: str, finalize: MessageFinalized) -> list[Event]:
        """A finalize, and the session's idle flag when it ends the last
        running message: with the unread flag, unless its user stopped it
        (a reply that ended is news to whoever is not looking at the chat;
        a client showing the chat clears the flag, docs/PROTOCOL.md)."""
        events: list[Event] = [finalize]
        meta = self.host.registry.get(session_id)
        if meta is not None and set(meta.open_msgs) <= {finalize.msg_id} and meta.status == "running":
            stopped = finalize.status == "aborted" and finalize.aborted_reason == "stopped by user"
            events.append(SessionFlags(status="idle", unread=None if stopped or meta.unread else True))
        return events

    async def finalize_message(self, session_id: str, msg_id: str, status: str, *,
                               content: str | None = None, error: str | None = None,
                               reason: str | None = None) -> None:
        """Finalize a message that has no live producer in this process (a
        placeholder created elsewhere). Illegal transitions raise and change nothing."""
        state, m = await self._message(session_id, msg_id)
        check_move(msg_id, m.status, status)
        live = self.host.saver.active.get((session_id, msg_id))
        if live is not None:
            self.host.saver.flush(live)
            live.finished = True
            self.host.saver.end(live)
        await self.host.append_events(session_id, MessageFinalized(msg_id=msg_id, status=status,  # type: ignore[arg-type]
                                                        content=content, error=error, aborted_reason=reason))

    def stop(self, session_id: str, msg_id: str) -> bool:
        """Cancel a running message; it is finalized aborted "stopped by user".
        False when no producer of it runs here."""
        msg = self.host.saver.active.get((session_id, msg_id))
        if msg is None:
            return False
        msg.abort_reason = "stopped by user"
        msg.scope.cancel()
        return True

    async def stop_anywhere(self, session_id: str, msg_id: str) -> bool:
        """`stop`, or, on a shared stream, a reply another worker streams:
        that worker is asked to stop it (and writes its finalize); if none
        answers, its finalize `aborted` "stopped by user" is written here,
        and a producer that still runs ends when its tail brings it
        (scaleout.py).
        False when the message is not running."""
        if self.stop(session_id, msg_id):
            return True
        meta = self.host.registry.get(session_id)
        if self.host.worker is None or meta is None or msg_id not in meta.open_msgs:
            return False
        if await self.host.worker.stop_elsewhere(session_id, msg_id):
            return True  # its worker ended it and writes its finalize
        meta = self.host.registry.get(session_id)  # (it may have ended while no one answered)
        if meta is None or msg_id not in meta.open_msgs:
            return False
        try:
            await self.host.append_events(session_id, *self._ending(session_id, MessageFinalized(
                msg_id=msg_id, status="aborted", aborted_reason="stopped by user")))
        except MessageFinished:
            return False  # it ended meanwhile (its finalize reached this log first)
        return True

    async def _message(self, session_id: str, msg_id: str) -> tuple[SessionState, MessageSnapshot]:
        """A loaded session and one of its messages (NotFound when unknown)."""
        state = await self.host.load_session(session_id)
        m = state.messages.get(msg_id)
        if m is None:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        return state, m

    async def retry_target(self, session_id: str, msg_id: str) -> MessageSnapshot:
        """The message to retry (a finished conversational reply); the retry runs
        as a new in-flight message with the same parent (a sibling branch)."""
        state, m = await self._message(session_id, msg_id)
        if m.status not in TERMINAL_STATUSES:
            raise Conflict("message_running", f"message {msg_id} is still {m.status}")
        if m.role != "assistant" or m.caller is not None:
            raise Conflict("not_retryable", f"message {msg_id} is not an assistant reply")
        return m

    async def switch_branch(self, session_id: str, msg_id: str) -> str:
        """Show the branch through `msg_id` (a sibling a retry or regenerate
        made, or any conversational message): head moves to the tip that branch
        had when it was last shown (`SessionState.leaf_of`), durably. Returns
        the new head; every client watching the session is told (`head_moved`)."""
        state, m = await self._message(session_id, msg_id)
        if m.caller is not None:
            raise BadRequest("not_conversational", f"message {msg_id} is a {m.kind} node, not on a branch")
        head = state.leaf_of(msg_id)
        if head != state.head:
            appended = await self.host.append_events(session_id, HeadMoved(head=head))
            self.host.notify("head_moved", {"session_id": session_id, "head": head, "seq": appended[0].record.seq})
        return head

    @asynccontextmanager
    async def retry(self, session_id: str, msg_id: str) -> AsyncIterator[InflightMessage]:
        """A new reply on a sibling branch of `msg_id` (same parent); head moves to it."""
        m = await self.retry_target(session_id, msg_id)
        async with self.inflight(session_id, kind=m.kind, role=m.role, parent_id=m.parent_id or "") as msg:
            yield msg

    async def subscribe(self, session_id: str, msg_id: str, *, offset: int | None = None,
                        after_seq: int | None = None) -> Subscription:
        """Subscribe to a message's updates. Say what you have (`offset`: characters
        of content; or `after_seq`: the seq your copy is as of) and the first update
        holds exactly the rest, then the live tail; it ends at a terminal status."""
        state = await self.host.load_session(session_id)
        if msg_id not in state.messages:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        have = 0
        if offset is not None:
            have = offset
        elif after_seq is not None:
            have = await self._length_at(session_id, msg_id, after_seq)
        m = state.messages.get(msg_id)
        if m is not None and m.status in TERMINAL_STATUSES and m.seq > self.host.es.durable_seq(session_id):
            await self.host.es.wait_durable(session_id, m.seq)  # terminal states are shown once durable
            # (as the log then holds it: on a shared stream a rebase meanwhile
            # may have replaced the loaded state and dropped this finalize)
            m = (await self.host.load_session(session_id)).messages.get(msg_id)
        if m is None:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        if have < 0 or have > len(m.content):
            raise BadRequest("bad_offset", f"offset {have} is outside the message's {len(m.content)} characters")
        if session_id not in self.host.registry or session_id not in self.host.es:  # deleted while we waited
            raise NotFound("unknown_session", f"session {session_id!r} was deleted")
        sub = self.host.hub.add(session_id, msg_id, have)
        sub.push(MsgUpdate(session_id=session_id, msg_id=msg_id, seq=m.seq, offset=0, content_delta=m.content,
                           status=m.status, tree=m.metadata.get("context_tree"),
                           tokens=m.metadata.get("partial_tokens_used") if m.tokens is None else m.tokens,
                           error=m.error, aborted_reason=m.metadata.get("aborted_reason"),
                           durable_seq=self.host.es.durable_seq(session_id)))
        if m.status in OPEN_STATUSES and (session_id, msg_id) not in self.host.saver.active:
            # No producer here will ever finalize it: say so now rather than never.
            why = ("store failure" if self.host.failure() is not None
                   else "session quarantined" if self.host.es.corruption(session_id) is not None
                   else "server shutdown" if self.host.shutting_down else None)
            if why is not None:
                self.host.hub.end(session_id, why, msg_id=msg_id, seq=m.seq)
        return sub

    async def _length_at(self, session_id: str, msg_id: str, seq: int) -> int:
        """How long the message's content was as of `seq` (read from the log)."""
        data = await self.host.log_bytes(session_id)
        state = fold_until(scan(session_id, data).records, data, seq)
        m = state.messages.get(msg_id)
        return len(m.content) if m is not None else 0

    async def abort_running(self, reason: str) -> int:
        """Finalize every running message of this process `aborted` with
        `reason` (their pending text first). Returns how many. Their producers
        see nothing: a later finalize of theirs is a no-op."""
        n = 0
        for msg in list(self.host.saver.active.values()):
            msg.abort_reason = msg.abort_reason or reason
            try:
                await self._finalize(msg, "aborted", reason=msg.abort_reason)
            except (NotFound, EventStoreError) as e:  # deleted meanwhile, or the store failed
                log.warning("could not finalize message %s at stop: %s", msg.msg_id, e)
                continue
            n += 1
        return n
