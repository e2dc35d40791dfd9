"""In-process fan-out of message updates, by (session_id, msg_id).

The store calls `publish()` for every progress and terminal record as it is
appended (on the trio thread, never awaiting). A subscriber either iterates
its bounded queue (dropped, its channel closed and `dropped` set, when it
falls behind, so one slow consumer never slows a writer; it resumes exactly
by subscribing again with what it has), or has a *sink* attached (the
WebSocket server): each update is handed to the sink synchronously, with a
flag saying whether it is the very object published to every subscriber (so
its encoding can be shared) or one trimmed for this subscriber; the sink
coalesces what its client has not taken yet (`merge_updates`).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Final

import msgspec
import trio

# Updates a subscriber may have queued before it is dropped: at 4 updates/s
# per message this is over a minute of backlog.
SUBSCRIBER_QUEUE: Final = 256


class MsgUpdate(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One update of a message: `content_delta` starts at character `offset`
    of the message's content; `durable_seq` is the session's highest seq that
    would survive a crash when this was sent."""
    session_id: str
    msg_id: str
    seq: int
    offset: int
    content_delta: str
    status: str
    durable_seq: int
    tree: Any = None
    tokens: dict[str, int] | None = None
    error: str | None = None
    aborted_reason: str | None = None
    more: bool = False  # a piece of a longer update (see split_update)


TERMINAL: Final = frozenset({"done", "error", "aborted"})
# The most characters one update carries to a client (a character is at most
# 6 bytes of JSON, so a frame stays under the 1 MiB message limit common to
# WebSocket clients): a longer catch-up is sent in pieces, and a slow
# client's merged update grows no further.
MAX_UPDATE_CHARS: Final = 128 * 1024
# What one frame should stay under (the common client limit): the content of
# a piece that carries a `tree` is cut so that both fit, when the tree does.
FRAME_BYTES: Final = 1024 * 1024 - 4096
_ENC = msgspec.json.Encoder()


def _tree_bytes(u: MsgUpdate) -> int:
    return 0 if u.tree is None else len(_ENC.encode(u.tree))


def merge_updates(a: MsgUpdate, b: MsgUpdate) -> MsgUpdate | None:
    """`a` then `b` as one update (b's delta starts where a's ends), or None
    when they do not follow each other or would be too long together."""
    chars = len(a.content_delta) + len(b.content_delta)
    if b.offset != a.offset + len(a.content_delta) or a.status in TERMINAL or chars > MAX_UPDATE_CHARS:
        return None
    if (a.tree is not None or b.tree is not None) and \
            6 * chars + 1024 + _tree_bytes(b if b.tree is not None else a) > FRAME_BYTES:
        return None
    return msgspec.structs.replace(
        b, offset=a.offset, content_delta=a.content_delta + b.content_delta,
        tree=b.tree if b.tree is not None else a.tree, tokens=b.tokens if b.tokens is not None else a.tokens)


def split_update(u: MsgUpdate) -> list[MsgUpdate]:
    """An update in pieces of at most MAX_UPDATE_CHARS characters; all but the
    last say `running` and `more` (their `seq` is the whole update's: resume
    from one of them by `offset`, not `after_seq`); the last carries the
    update's status, tree and the rest, with no more content than fits one
    frame beside its tree."""
    d = u.content_delta
    n = MAX_UPDATE_CHARS
    last_room = n if u.tree is None else max(0, min(n, (FRAME_BYTES - 1024 - _tree_bytes(u)) // 6))
    if len(d) <= last_room:
        return [u]
    cut = len(d) - last_room  # the last piece's content starts here
    out = [MsgUpdate(session_id=u.session_id, msg_id=u.msg_id, seq=u.seq, offset=u.offset + i,
                     content_delta=d[i:min(i + n, cut)], status="running", durable_seq=u.durable_seq, more=True)
           for i in range(0, cut, n)]
    out.append(msgspec.structs.replace(u, offset=u.offset + cut, content_delta=d[cut:]))
    return out


Sink = Callable[["Subscription", MsgUpdate, bool], None]


class Subscription:
    """One subscriber of one message; iterate it for updates, or attach a sink."""

    def __init__(self, hub: SubscriptionHub, key: tuple[str, str], have: int) -> None:
        self.hub = hub
        self.key = key
        self.have = have  # characters of content the subscriber has
        self.dropped = False
        self.closed = False
        self._sink: Sink | None = None
        self._send, self._recv = trio.open_memory_channel[MsgUpdate](SUBSCRIBER_QUEUE)
        self._on_close: list[Callable[[], None]] = []

    def attach(self, sink: Sink) -> None:
        """From now on hand each update to `sink` (what is queued first)."""
        while True:
            try:
                update = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
            sink(self, update, False)
        self._sink = sink

    def push(self, update: MsgUpdate) -> None:
        """Queue an update, trimmed to what the subscriber lacks (no duplicate
        character). Never blocks; a full queue drops the subscriber."""
        if self.dropped:
            return
        shared = True
        end = update.offset + len(update.content_delta)
        if update.offset < self.have:
            cut = min(self.have, end) - update.offset
            update = msgspec.structs.replace(update, offset=update.offset + cut,
                                             content_delta=update.content_delta[cut:])
            shared = False
        if update.offset > self.have:  # pragma: no cover - the store never skips
            update = msgspec.structs.replace(update, offset=self.have)
            shared = False
        self.have = max(self.have, end)
        if self._sink is not None:
            if not self.closed:
                self._sink(self, update, shared)
                if update.status in TERMINAL:
                    self.close()
            return
        try:
            self._send.send_nowait(update)
        except trio.WouldBlock:
            self.dropped = True
            self.close()
            return
        except trio.ClosedResourceError:
            return
        if update.status in ("done", "error", "aborted"):
            self.close()

    def on_close(self, fn: Callable[[], None]) -> None:
        """Call `fn` once when the subscription ends, however it ends (a
        terminal update, closed by its subscriber, dropped, the session
        gone); at once if it has ended already."""
        if self.closed:
            fn()
        else:
            self._on_close.append(fn)

    def close(self) -> None:
        first = not self.closed
        self.closed = True
        self.hub._remove(self)
        self._send.close()
        if first:
            for fn in self._on_close:
                fn()

    def __aiter__(self) -> AsyncIterator[MsgUpdate]:
        return self._recv.__aiter__()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class SubscriptionHub:
    def __init__(self) -> None:
        self._subs: dict[tuple[str, str], set[Subscription]] = {}

    def add(self, session_id: str, msg_id: str, have: int) -> Subscription:
        sub = Subscription(self, (session_id, msg_id), have)
        self._subs.setdefault(sub.key, set()).add(sub)
        return sub

    def _remove(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self._subs[sub.key]

    def wants(self, session_id: str, msg_id: str) -> bool:
        return (session_id, msg_id) in self._subs

    def publish(self, update: MsgUpdate) -> None:
        for sub in list(self._subs.get((update.session_id, update.msg_id), ())):
            sub.push(update)

    def end(self, session_id: str | None, reason: str, *, msg_id: str | None = None, seq: int = 0) -> int:
        """End every subscription of a session (or of one message, or, with
        None, all) with a final `aborted` update carrying `reason`, when its
        message will never get a terminal record here (the session was
        deleted, the store failed, the server stops). Returns how many."""
        keys = [k for k in self._subs
                if session_id is None or (k[0] == session_id and (msg_id is None or k[1] == msg_id))]
        n = 0
        for key in keys:
            for sub in list(self._subs.get(key, ())):
                sub.push(MsgUpdate(session_id=key[0], msg_id=key[1], seq=seq, offset=sub.have, content_delta="",
                                   status="aborted", aborted_reason=reason, durable_seq=seq))
                sub.close()
                n += 1
        return n

    def count(self) -> int:
        return sum(len(s) for s in self._subs.values())
