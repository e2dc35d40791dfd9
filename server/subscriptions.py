"""In-process fan-out of message updates, by (session_id, msg_id).

The store calls `publish()` for every progress and terminal record as it is
appended (on the trio thread, never awaiting); each subscriber has a bounded
queue and is dropped (its channel closed, `dropped` set) when it falls
behind, so one slow consumer never slows a writer. A dropped subscriber
resumes exactly by subscribing again with what it has.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
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


class Subscription:
    """One subscriber of one message; iterate it for updates."""

    def __init__(self, hub: SubscriptionHub, key: tuple[str, str], have: int) -> None:
        self.hub = hub
        self.key = key
        self.have = have  # characters of content the subscriber has
        self.dropped = False
        self._send, self._recv = trio.open_memory_channel[MsgUpdate](SUBSCRIBER_QUEUE)

    def push(self, update: MsgUpdate) -> None:
        """Queue an update, trimmed to what the subscriber lacks (no duplicate
        character). Never blocks; a full queue drops the subscriber."""
        if self.dropped:
            return
        end = update.offset + len(update.content_delta)
        if update.offset < self.have:
            cut = min(self.have, end) - update.offset
            update = msgspec.structs.replace(update, offset=update.offset + cut,
                                             content_delta=update.content_delta[cut:])
        if update.offset > self.have:  # pragma: no cover - the store never skips
            update = msgspec.structs.replace(update, offset=self.have)
        self.have = max(self.have, end)
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

    def close(self) -> None:
        self.hub._remove(self)
        self._send.close()

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
