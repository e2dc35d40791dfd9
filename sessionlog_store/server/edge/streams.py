"""A message's content as a Durable Streams stream (ElectricSQL's open HTTP
protocol for append-only streams; docs/HTTP.md): read from any offset, the
live tail by long-poll or SSE, exact resume after a cut, and the end of the
message as the stream's closure.

    GET /v1/stream/sessions/{session_id}/messages/{msg_id}?offset=<o>[&live=long-poll|sse]

The stream is the message's text (`text/plain; charset=utf-8`). An offset is
16 decimal digits, the number of characters before it, and a tag of its
stream (`0000000000000042_3fa9c1`: opaque to a client, sortable within its
stream; an offset of another stream is refused, not misread); `-1` is the
start, `now` the tail. Every answer says
`Stream-Next-Offset`; once the message has ended, a read at its end says
`Stream-Closed: true` and `Stream-Status` (done, error, aborted). A reader
is a subscription of the store (as a WebSocket client's): bounded, and
ended when it falls behind, so a slow reader costs nothing and resumes from
its last offset.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Final
from urllib.parse import parse_qsl, urlsplit

import trio

from sessionlog_store.server.domain.errors import BadRequest, NotFound
from sessionlog_store.server.domain.subscriptions import TERMINAL, Subscription
from sessionlog_store.server.edge.http import Exchange
from sessionlog_store.server.edge.operations import Operations

OFFSET_DIGITS: Final = 16
TEXT: Final = "text/plain; charset=utf-8"
# A long-poll waits this long for new text, then answers 204.
LONG_POLL_SECONDS: Final = 20.0
# An SSE answer sends a comment this often when nothing else is sent (proxies
# close idle connections), and ends after SSE_SECONDS (the protocol's advice:
# a client reconnects from its offset).
HEARTBEAT_SECONDS: Final = 15.0
SSE_SECONDS: Final = 60.0
# Cursors (the protocol's CDN collapsing): 20 s intervals from 2024-10-09.
_CURSOR_EPOCH: Final = 1728432000.0
_SSE_HEADERS: Final = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def stream_tag(session_id: str, msg_id: str) -> str:
    """What an offset of this message's stream ends with."""
    return hashlib.blake2s(f"{session_id}/{msg_id}".encode(), digest_size=3).hexdigest()


def encode_offset(chars: int, tag: str) -> str:
    return f"{chars:0{OFFSET_DIGITS}d}_{tag}"


def decode_offset(text: str | None, tail: int, tag: str) -> int:
    """Characters before the offset `text` ("-1": 0, "now": `tail`)."""
    if text is None or text == "-1":
        return 0
    if text == "now":
        return tail
    digits, _, of = text.partition("_")
    if len(digits) != OFFSET_DIGITS or not digits.isdigit() or not of:
        raise BadRequest("bad_offset", f"offset {text[:40]!r} is not an offset (16 digits and a stream's tag, "
                         "-1 or now)")
    if of != tag:
        raise BadRequest("bad_offset", f"offset {text[:40]!r} is another stream's")
    n = int(digits)
    if n > tail:
        raise BadRequest("bad_offset", f"offset {text} is beyond the stream's end ({encode_offset(tail, tag)})")
    return n


def cursor(after: str | None) -> str:
    """The next cursor: this interval's number, past the client's own."""
    now = int((time.time() - _CURSOR_EPOCH) // 20)
    try:
        theirs = int(after) if after is not None else -1
    except ValueError:
        theirs = -1
    return str(now if now > theirs else theirs + 1)


class MessageStream:
    """One read of one message's stream."""

    def __init__(self, ex: Exchange, ops: Operations, target: str, session_id: str, msg_id: str) -> None:
        self.ex, self.ops, self.store = ex, ops, ops.store
        self.session_id, self.msg_id = session_id, msg_id
        self.tag = stream_tag(session_id, msg_id)
        query = dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))
        self.live = query.get("live")
        self.offset = query.get("offset")
        self.cursor = query.get("cursor")
        if self.live not in (None, "long-poll", "sse"):
            raise BadRequest("bad_request", f"live={self.live[:20]!r}: long-poll or sse")

    async def answer(self, method: str, if_none_match: str) -> None:
        self.ops.readable(self.session_id, f"stream read of message {self.msg_id}")
        state = await self.store.load_session(self.session_id)
        m = state.messages.get(self.msg_id)
        if m is None:
            raise NotFound("unknown_message", f"unknown message {self.msg_id!r}")
        start = decode_offset(self.offset, len(m.content), self.tag)
        if method == "HEAD" or self.live is None:
            await self._catch_up(start, m.content, m.status, method, if_none_match)
        elif self.live == "long-poll":
            await self._long_poll(start)
        else:
            await self._sse(start)

    def _closing(self, status: str) -> dict[str, str]:
        return {"Stream-Closed": "true", "Stream-Status": status} if status in TERMINAL else {}

    async def _catch_up(self, start: int, content: str, status: str, method: str, if_none_match: str) -> None:
        end = len(content)
        tag = f'"{self.session_id}:{self.msg_id}:{encode_offset(start, self.tag)}:{encode_offset(end, self.tag)}"'
        closed = status in TERMINAL
        headers = {"Stream-Next-Offset": encode_offset(end, self.tag), "Stream-Up-To-Date": "true",
                   "Cache-Control": "private, max-age=60" if closed else "no-store", **self._closing(status)}
        if self.offset != "now":
            headers["ETag"] = tag
        if method != "HEAD" and tag in {t.strip() for t in if_none_match.split(",")}:
            await self.ex.reply(304, headers=headers)
            return
        await self.ex.reply(200, content[start:].encode("utf-8", "surrogatepass"), TEXT, headers=headers)

    async def _subscribe(self, start: int) -> Subscription:
        return await self.store.subscribe(self.session_id, self.msg_id, offset=start)

    async def _long_poll(self, start: int) -> None:
        sub = await self._subscribe(start)
        text, status, pos = "", "running", start
        try:
            updates = sub.__aiter__()
            with trio.move_on_after(LONG_POLL_SECONDS):
                async for u in updates:
                    text += u.content_delta
                    status = u.status
                    if text or status in TERMINAL:
                        break
        finally:
            sub.close()
        pos += len(text)
        headers = {"Stream-Next-Offset": encode_offset(pos, self.tag), "Stream-Cursor": cursor(self.cursor),
                   "Cache-Control": "no-store", **self._closing(status)}
        headers["Stream-Up-To-Date"] = "true"  # (what there was is all sent)
        if not text:
            await self.ex.reply(204, headers=headers)
            return
        await self.ex.reply(200, text.encode("utf-8", "surrogatepass"), TEXT, headers=headers)

    async def _sse(self, start: int) -> None:
        sub = await self._subscribe(start)
        ex, pos, status = self.ex, start, "running"
        try:
            await ex.start_stream(200, "text/event-stream; charset=utf-8", _SSE_HEADERS)
            updates = sub.__aiter__()
            first = True
            with trio.move_on_after(SSE_SECONDS):
                while True:
                    with trio.move_on_after(HEARTBEAT_SECONDS) as idle:
                        try:
                            u = await updates.__anext__()
                        except StopAsyncIteration:
                            break  # (dropped for falling behind, or the session went: resume from the offset)
                    if idle.cancelled_caught:
                        await ex.send(b": keep-alive\n\n")
                        continue
                    out = ""
                    if u.content_delta:
                        out += "event: data\n" + "".join(f"data: {line}\n" for line in
                                                         u.content_delta.split("\n")) + "\n"
                        pos += len(u.content_delta)
                    status = u.status
                    control: dict[str, object] = {"streamNextOffset": encode_offset(pos, self.tag),
                                                  "streamCursor": cursor(self.cursor)}
                    if first or not u.more:
                        control["upToDate"] = not u.more
                    if status in TERMINAL:
                        control.update(streamClosed=True, status=status)
                        if u.error:
                            control["error"] = u.error
                        if u.aborted_reason:
                            control["abortedReason"] = u.aborted_reason
                    first = False
                    out += f"event: control\ndata: {json.dumps(control)}\n\n"
                    await ex.send(out.encode("utf-8", "surrogatepass"))
                    if status in TERMINAL:
                        break
            await ex.end_stream()
        finally:
            sub.close()
