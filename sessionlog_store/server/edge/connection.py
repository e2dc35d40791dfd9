"""One WebSocket client: the reader loop (decode, `match`, call the store,
reply), a sender task draining a bounded queue with a timeout per frame (a
client that stops reading is dropped; it can resume exactly), keepalive pings
and the client's subscriptions. Every exception of a frame is caught and
answered; nothing a client sends can stop the server.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from sessionlog_store.eventstore.errors import (InvalidSessionId, MessageFinished, RecordTooLarge, SessionReadOnly,
                                                StoreBroken, StoreClosed, UnknownSession)
from sessionlog_store.eventstore.ids import validate_session_id
from sessionlog_store.server.domain.errors import Conflict, ServiceError
from sessionlog_store.server.domain.subscriptions import TERMINAL, MsgUpdate, Subscription, merge_updates, split_update
from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.edge.auth import Principal
from sessionlog_store.server.edge.operations import Operations, OperationsHost, audit

if TYPE_CHECKING:
    from sessionlog_store.server.edge.config import ServerConfig

log = logging.getLogger("sessionlog.ws")

# Frames queued for one client before it is dropped as too slow.
SEND_QUEUE: Final = 512
# Subscriptions one connection may hold (a page subscribes to running messages only).
MAX_SUBSCRIPTIONS: Final = 1000
# A frame refused for the rate is read for its request_id only up to this size.
PEEK_BYTES: Final = 64 * 1024


def error_of(e: BaseException) -> tuple[str, str]:
    match e:
        case ServiceError(code=code, message=message):
            return code, message
        case InvalidSessionId():
            return "invalid_session_id", str(e)
        case UnknownSession():
            return "unknown_session", str(e)
        case SessionReadOnly():
            return "read_only", str(e)
        case MessageFinished():
            return "message_finished", str(e)
        case RecordTooLarge():
            return "frame_too_large", str(e)
        case StoreBroken() | StoreClosed():
            return "store_broken", str(e)
        case OSError():
            return "store_broken", f"a disk operation failed: {e}"
        case _:
            return "internal", f"{type(e).__name__}: {e}"


class _Pending:
    """A subscription's update waiting in a connection's send queue."""
    __slots__ = ("key", "update", "frame")

    def __init__(self, key: tuple[str, str], update: MsgUpdate, frame: str | None) -> None:
        self.key, self.update, self.frame = key, update, frame


class ConnectionHost(OperationsHost, Protocol):
    """What a connection asks of its server (edge/ws.py's Server), beyond the operations'."""
    config: ServerConfig
    dropped: int  # connections dropped for not taking frames (metrics)

    def shared_frame(self, update: MsgUpdate) -> str: ...


class Connection:
    """One WebSocket client."""

    def __init__(self, server: ConnectionHost, ws: WebSocketConnection, nursery: trio.Nursery,
                 principal: Principal | None = None) -> None:
        self.principal = principal or Principal()
        self.server = server
        self.store = server.store
        self.ws = ws
        self.nursery = nursery
        self._send, self._recv = trio.open_memory_channel[str | _Pending](SEND_QUEUE)
        self.subs: dict[tuple[str, str], Subscription] = {}
        # Per subscription, the update queued and not yet taken by the sender:
        # later updates are merged into it (a slow client gets one update
        # with everything it lacks, not a growing queue).
        self._pending: dict[tuple[str, str], _Pending] = {}
        # Sessions this client loaded: it is told of their new messages (`message_created`).
        self.watching: set[str] = set()
        self.dropped = False
        self.remote = "?"  # the client's address, for the log
        self.handling = False  # a request of this client was read and its answer is not queued yet
        self._busy = 0.0  # seconds spent answering its requests, up to the last one answered
        self._busy_since = 0.0
        # Frames queued and not yet written to the socket. (The channel's buffer
        # alone does not say: a frame handed straight to a waiting sender task
        # is in neither.)
        self.unsent = 0
        self.ended = False  # the reader loop returned: nothing more is read or sent
        # Woken whenever `handling`, `unsent`, `subs` or `ended` may have
        # changed (a stopping server waits on them: `wait_until`).
        self._changed = trio.lowlevel.ParkingLot()
        self._close_done: trio.Event | None = None  # set once our close handshake is over
        self.ops = Operations(server, self.principal, watch=self._watch)

    async def close(self, code: int, reason: str) -> None:
        """Close with a close handshake: the reader loop waits for it to end
        (trio-websocket reads the client's answer in this connection's
        nursery, which ends with the reader loop)."""
        if self._close_done is not None:
            await self._close_done.wait()
            return
        self._close_done = trio.Event()
        try:
            await self.ws.aclose(code, reason)
        finally:
            self._close_done.set()

    def end(self, code: int, reason: str) -> None:
        """Close this connection with a close handshake (its credential ended)."""
        log.info("closing a connection: %s", reason, extra={"remote": self.remote})
        self.nursery.start_soon(self.close, code, reason)

    async def _expire(self, at: float) -> None:
        await trio.sleep(max(0.0, at - time.time()))
        self.end(1008, "credentials expired")

    def send_nowait(self, frame: str | _Pending) -> None:
        """Queue a frame; a client whose queue is full is dropped."""
        if self.dropped:
            return
        try:
            self._send.send_nowait(frame)
            self.unsent += 1
        except trio.WouldBlock:
            self.drop("send queue full")
        except trio.ClosedResourceError:
            pass

    def drained(self) -> bool:
        """No subscription left, nothing queued or being written."""
        return not (self.subs or self.unsent)

    def idle(self) -> bool:
        """No request read and unanswered (its answer is queued, at least)."""
        return not self.handling

    async def wait_until(self, condition: Callable[[Connection], bool]) -> None:
        """Until `condition(self)` holds or the connection has ended. Returns
        without a checkpoint when it holds already, so that a caller acts on
        it (the close handshake) before another frame can be read."""
        while not (self.ended or condition(self)):
            await self._changed.park()

    def drop(self, why: str) -> None:
        if not self.dropped:
            self.dropped = True
            self.server.dropped += 1
            log.warning("dropping a slow client: %s", why, extra={"remote": self.remote})
            self.nursery.cancel_scope.cancel()

    def deliver(self, sub: Subscription, update: MsgUpdate, shared: bool) -> None:
        """A subscription's update (the sink of every subscription here)."""
        key = sub.key
        if update.status in TERMINAL and self.subs.get(key) is sub:
            del self.subs[key]
            self._changed.unpark_all()
        pieces = split_update(update)
        if len(pieces) > 1:
            shared = False
        for piece in pieces:
            pend = self._pending.get(key)
            if pend is not None:
                merged = merge_updates(pend.update, piece)
                if merged is not None:
                    pend.update, pend.frame = merged, None
                    continue
            pend = _Pending(key, piece, self.server.shared_frame(piece) if shared else None)
            self._pending[key] = pend
            self.send_nowait(pend)

    def busy_time(self) -> float:
        """Seconds spent answering this client's requests so far."""
        return self._busy + (trio.current_time() - self._busy_since if self.handling else 0.0)

    async def _keepalive(self) -> None:
        cfg = self.server.config
        while True:
            await trio.sleep(cfg.ping_interval)
            busy_at_send = self.busy_time()
            with trio.move_on_after(cfg.ping_timeout):
                try:
                    await self.ws.ping()
                except ConnectionClosed:
                    return
                continue
            if self.busy_time() - busy_at_send >= cfg.ping_timeout / 2:
                # our own slow requests held this client's frames (and the pong
                # queued behind them) unread for much of the wait: not its fault.
                # Quick requests do not count: a peer that never answers pings
                # is dropped however often it sends.
                continue
            self.drop(f"no pong within {cfg.ping_timeout:g} s")
            return

    async def _sender(self) -> None:
        async for item in self._recv:
            if isinstance(item, _Pending):
                if self._pending.get(item.key) is item:
                    del self._pending[item.key]  # later updates make a new item
                frame = item.frame or p.encode_frame("msg_update", p.to_wire(item.update))
            else:
                frame = item
            with trio.move_on_after(self.server.config.send_timeout):
                try:
                    await self.ws.send_message(frame)
                except ConnectionClosed:
                    if self._close_done is None:
                        self.nursery.cancel_scope.cancel()  # the client left; the reader ends too
                    return  # (our close: the reader ends once its handshake is over)
                finally:
                    self.unsent -= 1
                    self._changed.unpark_all()
                continue
            self.drop("a frame was not taken within the send timeout")
            return

    async def run(self) -> None:
        try:
            await self._read()
        finally:
            self.ended = True
            self._changed.unpark_all()

    async def _read(self) -> None:
        self.nursery.start_soon(self._sender)
        if self.server.config.ping_interval > 0:
            self.nursery.start_soon(self._keepalive)
        cred = self.principal.credential
        if cred is not None and cred.expires is not None:
            self.nursery.start_soon(self._expire, cred.expires)
        quotas, user = self.server.quotas, self.principal.user
        while True:
            pause = quotas.read_pause(user, trio.current_time())
            if pause:  # the user is over its rate: none of its connections is read until it may be
                await trio.sleep(pause)
            try:
                frame = await self.ws.get_message()
            except ConnectionClosed:
                if self._close_done is not None:  # ours: the client's answer is read first
                    await self._close_done.wait()
                return
            action: str | None = None
            rid: p.RequestId = None
            n = len(frame)  # a str's UTF-8 is at most 4 bytes a character: encode only what may be over
            size = n if isinstance(frame, bytes) or 4 * n <= quotas.limits.frame_bytes \
                else len(frame.encode("utf-8", "surrogatepass"))
            refused, wait = quotas.check_frame(user, size, trio.current_time())
            if wait and (refused is None or refused.code != "rate_limited"):
                await trio.sleep(wait)  # over its rate, told already: the frame waits for its token
            if refused is not None:  # not handled: a refused frame costs us next to nothing
                # (a small one's head is read to answer it by its request_id)
                action, rid = p.peek(frame) if refused.code == "rate_limited" and size <= PEEK_BYTES else (None, None)
                self.send_nowait(p.encode_error(refused.code, refused.message, action, rid))
                continue
            try:
                req = p.decode_action(frame)
                action, rid = req.__struct_config__.tag, req.request_id  # type: ignore[assignment]
                if self.store.shutting_down:  # read after the stop began: not carried out
                    raise Conflict("shutting_down", "the server is shutting down")
                self.handling = True
                self._busy_since = trio.current_time()
                await self.handle(req)
            except p.ProtocolError as e:
                self.send_nowait(p.encode_error(e.code, e.message, e.action, e.request_id))
            except Exception as e:  # one bad frame never ends the connection
                code, message = error_of(e)
                if code == "internal":
                    log.exception("handling %s failed", action)
                self.send_nowait(p.encode_error(code, message, action, rid))
            finally:
                if self.handling:  # its answer (result or error) is queued by now
                    self.handling = False
                    self._busy += trio.current_time() - self._busy_since
                    self._changed.unpark_all()

    def reply(self, type_: str, data: Any, rid: p.RequestId) -> None:
        self.send_nowait(p.encode_frame(type_, data, rid))

    # -- requests -------------------------------------------------------------

    def _watch(self, sid: str) -> None:
        """A session this client loaded or chatted in: it is told of its new messages."""
        if sid not in self.watching and len(self.watching) >= MAX_SUBSCRIPTIONS:
            self.watching.pop()
        self.watching.add(sid)

    def projects_frame(self, rid: p.RequestId = None) -> str:
        return p.encode_frame("projects_list", self.ops.projects_data(), rid)

    async def handle(self, req: p.ClientAction) -> None:
        """One request: the WebSocket's own (its subscriptions) here, every
        other through the operations (operations.py, as the HTTP API's)."""
        match req:
            case p.SubscribeMsg() as r:
                user = self.principal.user
                meta = self.ops.readable(r.session_id, f"subscribe_msg of message {r.msg_id}")
                sub = await self.subscribe(r)
                if meta.owner != user:  # an admin's follow of another's message: its end is logged too
                    sub.on_close(lambda: audit.warning(
                        "admin %r: subscribe_msg of message %s of session %s of user %r ended", user, r.msg_id,
                        r.session_id, meta.owner, extra={"remote": self.remote}))
            case p.UnsubscribeMsg(session_id=sid, msg_id=mid):
                validate_session_id(sid)
                old = self.subs.pop((sid, mid), None)
                if old is not None:
                    old.close()
                    self._pending.pop((sid, mid), None)
                self.reply("ok", {"action": "unsubscribe_msg", "subscribed": False}, req.request_id)
            case _:
                self.ops.remote = self.remote
                kind, data = await self.ops.run(req)
                self.reply(kind, data, req.request_id)

    async def subscribe(self, r: p.SubscribeMsg) -> Subscription:
        key = (r.session_id, r.msg_id)
        if key not in self.subs and len(self.subs) >= MAX_SUBSCRIPTIONS:
            raise ServiceError("too_many_subscriptions", f"at most {MAX_SUBSCRIPTIONS} subscriptions per connection")
        # The old subscription of this message (if any) goes only once the new
        # one exists: a refused re-subscribe leaves the client its old stream.
        sub = await self.store.subscribe(r.session_id, r.msg_id, offset=r.offset, after_seq=r.after_seq)
        old = self.subs.pop(key, None)
        if old is not None:
            old.close()
        self._pending.pop(key, None)  # a queued update of the old one is not merged with the new
        self.subs[key] = sub
        self.reply("subscribed", {"session_id": r.session_id, "msg_id": r.msg_id}, r.request_id)
        sub.attach(self.deliver)  # no await since subscribe: nothing was published in between
        return sub

    def close_subscriptions(self) -> None:
        for sub in list(self.subs.values()):
            sub.close()
        self.subs.clear()
        self._changed.unpark_all()
