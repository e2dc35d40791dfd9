"""The generic namespace of the Durable Streams protocol over HTTP: streams
an app creates, appends to, reads and deletes under /v1/stream/<name> (any
name but `sessions/...`, the sessions' own streams: streams.py). The
protocol is ElectricSQL's (docs/HTTP.md has what this server does where it
leaves a choice); the streams are the space's (domain/streamspace.py).

    PUT    create (Content-Type, Stream-TTL | Stream-Expires-At, Stream-Closed,
           Stream-Forked-From + Stream-Fork-Offset [+ Stream-Fork-Sub-Offset]; body: first data)
    POST   append (Producer-Id/-Epoch/-Seq, Stream-Seq, Stream-Closed)
    GET    read from ?offset= (-1, now, or an offset); &live=long-poll | sse
    HEAD   its metadata
    DELETE delete it
"""
from __future__ import annotations

import base64
import json
import re
from datetime import datetime
from typing import Final
from urllib.parse import parse_qs, urlsplit

import trio

from sessionlog_store.projections.dstream import (MAX_SAFE, Refused, StreamState, encode_offset, is_json,
                                                  is_text, parse_int, parse_offset)
from sessionlog_store.server.domain.streamspace import StreamSpace
from sessionlog_store.server.edge.http import Exchange, Request
from sessionlog_store.server.edge.streams import HEARTBEAT_SECONDS, LONG_POLL_SECONDS, SSE_SECONDS, cursor

PREFIX: Final = "/v1/stream/"
# A catch-up read answers at most this many bytes (at least one append):
# a client reads on from its Stream-Next-Offset.
CHUNK: Final = 1024 * 1024
_CONTENT_TYPE: Final = re.compile(r"^[\w.+-]+/[\w.+-]+")
_DIGITS: Final = re.compile(r"^\d+$")
_LINES: Final = re.compile(r"\r\n|\r|\n")
_CATCH_UP_CACHE: Final = "private, max-age=60, stale-while-revalidate=300"


def stream_name(path: str, root_path: str = "") -> str | None:
    """The stream a path names (its part after /v1/stream/), or None."""
    for prefix in (PREFIX, root_path + PREFIX if root_path else None):
        if prefix and path.startswith(prefix) and len(path) > len(prefix):
            return path[len(prefix):]
    return None


def _closed(h: dict[str, str]) -> bool:
    return h.get("stream-closed", "").strip().lower() == "true"


def _producer(h: dict[str, str]) -> tuple[str, int, int] | None:
    given = [h.get(n) for n in ("producer-id", "producer-epoch", "producer-seq")]
    if all(v is None for v in given):
        return None
    pid, epoch, seq = (v.strip() if v is not None else None for v in given)
    if pid is None or epoch is None or seq is None:
        raise Refused(400, "bad_producer", "Producer-Id, Producer-Epoch and Producer-Seq go together")
    if not pid:
        raise Refused(400, "bad_producer", "Producer-Id is empty")
    for name, v in (("Producer-Epoch", epoch), ("Producer-Seq", seq)):
        if not _DIGITS.match(v) or int(v) > MAX_SAFE:
            raise Refused(400, "bad_producer", f"{name}: an integer from 0 to 2^53-1")
    return pid, int(epoch), int(seq)


def _sse_event(kind: str, payload: str) -> str:
    return f"event: {kind}\n" + "".join(f"data:{line}\n" for line in _LINES.split(payload)) + "\n"


class Namespace:
    """The generic namespace of one server."""

    def __init__(self, space: StreamSpace, root_path: str = "", public_url: str | None = None,
                 long_poll: float = LONG_POLL_SECONDS, stopping: trio.Event | None = None) -> None:
        self.space = space
        self.stopping = stopping if stopping is not None else trio.Event()  # (set: live reads end their answers)
        self.root_path = root_path
        self.public_url = public_url
        self.long_poll = long_poll

    def _base(self, req: Request) -> str:
        """The scheme and host of this server's URLs (for a Location)."""
        if self.public_url is not None:
            u = urlsplit(self.public_url)
            return f"{u.scheme}://{u.netloc}{self.root_path}"
        return f"http://{req.headers.get('host', 'localhost')}{self.root_path}"

    async def answer(self, ex: Exchange, req: Request, body: bytes, owner: str) -> None:
        try:
            await self._answer(ex, req, body, owner)
        except Refused as e:
            if e.status in (404, 410):  # (what an expiry decided is durable before it is said)
                await self.space.settle_removals()
            raise

    async def _answer(self, ex: Exchange, req: Request, body: bytes, owner: str) -> None:
        name = stream_name(req.path)
        if name is None:
            raise Refused(404, "unknown_stream", "no stream named")
        await self.space.synced()  # (workers sharing the streams: what another acknowledged is known)
        method = req.method
        if method == "PUT":
            await self._create(ex, req, body, owner, name)
        elif method == "POST":
            st = self.space.find(owner, name)
            got = await self.space.append(st, body, content_type=req.headers.get("content-type"),
                                          close=_closed(req.headers), producer=_producer(req.headers),
                                          stream_seq=req.headers.get("stream-seq"))
            await ex.reply(got.status, headers=got.headers)
        elif method == "DELETE":
            await self.space.delete(owner, name)
            await ex.reply(204)
        elif method == "HEAD":
            await self._head(ex, self.space.find(owner, name, touch=False))
        elif method == "GET":
            if body:
                raise Refused(400, "bad_request", "a read takes no body")
            await self._read(ex, req, owner, name)
        else:
            raise Refused(405, "method_not_allowed", f"{method} is not allowed here",
                          {"Allow": "GET, HEAD, POST, PUT, DELETE"})

    # -- create ------------------------------------------------------------

    async def _create(self, ex: Exchange, req: Request, body: bytes, owner: str, name: str) -> None:
        h = req.headers
        source = h.get("stream-forked-from")
        ctype = h.get("content-type", "").strip()
        if not _CONTENT_TYPE.match(ctype):
            ctype = ""
        ttl_text, expires = h.get("stream-ttl"), h.get("stream-expires-at")
        if ttl_text is not None and expires is not None:
            raise Refused(400, "bad_expiry", "Stream-TTL and Stream-Expires-At: one or the other")
        ttl = parse_int(ttl_text.strip()) if ttl_text is not None else None
        if ttl_text is not None and ttl is None:
            raise Refused(400, "bad_expiry", "Stream-TTL: whole seconds, no sign, no leading zeros")
        if expires is not None:
            try:
                datetime.fromisoformat(expires.strip().replace("Z", "+00:00"))
            except ValueError:
                raise Refused(400, "bad_expiry", "Stream-Expires-At: an RFC 3339 time") from None
            expires = expires.strip()
        fork_name = fork_offset = None
        sub = 0
        if source is not None:
            path = urlsplit(source.strip()).path
            fork_name = stream_name(path, self.root_path)
            if fork_name is None:
                raise Refused(404, "unknown_stream", "Stream-Forked-From: not a stream of this server")
            off = h.get("stream-fork-offset")
            if off is not None:
                fork_offset = parse_offset(off.strip())
                if fork_offset is None:
                    raise Refused(400, "bad_fork_offset", "Stream-Fork-Offset: not an offset")
        sub_text = h.get("stream-fork-sub-offset")
        if sub_text is not None:
            if source is None:
                raise Refused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset needs Stream-Forked-From")
            parsed = parse_int(sub_text.strip())
            if parsed is None:
                raise Refused(400, "bad_fork_offset", "Stream-Fork-Sub-Offset: a whole number")
            sub = parsed
        st, created = await self.space.create(
            owner, name, content_type=ctype or None, ttl=ttl, expires_at=expires, closed=_closed(h), data=body,
            forked_from=fork_name, fork_offset=fork_offset, fork_sub=sub)
        headers = {"Stream-Next-Offset": encode_offset(st.visible_tail)}
        if created:
            headers["Location"] = self._base(req) + req.target.split("?")[0]
        if st.ended:
            headers["Stream-Closed"] = "true"
        await ex.reply(201 if created else 200, b"", st.content_type, headers=headers)

    # -- metadata ------------------------------------------------------------

    async def _head(self, ex: Exchange, st: StreamState) -> None:
        headers = {"Stream-Next-Offset": encode_offset(st.visible_tail), "Cache-Control": "no-store",
                   "ETag": self._etag(st, "-1", st.visible_tail, st.ended)}
        if st.ended:
            headers["Stream-Closed"] = "true"
        if st.ttl is not None:
            headers["Stream-TTL"] = str(st.ttl)
        if st.expires_at is not None:
            headers["Stream-Expires-At"] = st.expires_at
        await ex.reply(200, b"", st.content_type, headers=headers)

    @staticmethod
    def _etag(st: StreamState, start: str, end: int, closed: bool) -> str:
        return f'"{st.log_id}:{start}:{encode_offset(end)}{":c" if closed else ""}"'

    # -- reads ---------------------------------------------------------------

    async def _read(self, ex: Exchange, req: Request, owner: str, name: str) -> None:
        try:
            query = parse_qs(urlsplit(req.target).query, keep_blank_values=True)
        except ValueError:
            raise Refused(400, "bad_request", "a malformed query") from None
        offsets = query.get("offset", [])
        live = query["live"][0] if query.get("live") else None
        theirs = query["cursor"][0] if query.get("cursor") else None
        if len(offsets) > 1:
            raise Refused(400, "bad_offset", "one offset")
        offset = offsets[0] if offsets else None
        if offset is not None and offset not in ("-1", "now") and parse_offset(offset) is None:
            raise Refused(400, "bad_offset", f"offset {offset[:40]!r} is not an offset (nor -1 or now)")
        if live not in (None, "long-poll", "sse"):
            raise Refused(400, "bad_request", "live: long-poll or sse")
        if live is not None and offset is None:
            raise Refused(400, "bad_offset", f"live={live} needs an offset")
        st = self.space.find(owner, name)
        if offset == "now":
            start = st.visible_tail
        elif offset is None or offset == "-1":
            start = 0
        else:
            start = parse_offset(offset) or 0
        if live == "sse":
            await self._sse(ex, st, start, theirs)
            return
        if offset == "now" and live is None:
            headers = {"Stream-Next-Offset": encode_offset(st.visible_tail),
                       "Stream-Up-To-Date": "true", "Cache-Control": "no-store"}
            if st.ended:
                headers["Stream-Closed"] = "true"
            await ex.reply(200, b"[]" if st.json else b"", st.content_type, headers=headers)
            return
        i, j = st.span(start, CHUNK)
        if live == "long-poll" and i == j:
            i, j = await self._wait(st, start)
            if self.space.gone(st):
                self.space.find(owner, name, touch=False)  # (raises: 404, or 410 under forks)
            if i == j:
                headers = {"Stream-Next-Offset": encode_offset(st.end_of(i, j)),
                           "Stream-Up-To-Date": "true", "Stream-Cursor": cursor(theirs)}
                if st.ended:
                    headers["Stream-Closed"] = "true"
                await ex.reply(204, headers=headers)
                return
        end, up = st.end_of(i, j), j >= st.durable
        at_end = up and st.ended
        headers = {"Stream-Next-Offset": encode_offset(end),
                   "Cache-Control": _CATCH_UP_CACHE if i < j and not at_end else "no-store"}
        if live == "long-poll":
            headers["Stream-Cursor"] = cursor(theirs)
        if up:
            headers["Stream-Up-To-Date"] = "true"
        if at_end:
            headers["Stream-Closed"] = "true"
        etag = self._etag(st, offset or "-1", end, at_end)
        headers["ETag"] = etag
        if etag in {t.strip() for t in req.headers.get("if-none-match", "").split(",")}:
            await ex.reply(304, headers=headers)
            return
        await ex.reply(200, st.body(st.units[i:j]), st.content_type, headers=headers)

    async def _wait(self, st: StreamState, start: int) -> tuple[int, int]:
        """A long-poll's wait for data after `start` (or the stream's close)."""
        with trio.move_on_after(self.long_poll):
            while True:
                i, j = st.span(start, CHUNK)
                if i < j or st.ended or self.space.gone(st) or self.stopping.is_set():
                    return i, j
                await self.space.changed(st).wait()
        return st.span(start, CHUNK)

    async def _sse(self, ex: Exchange, st: StreamState, start: int, theirs: str | None) -> None:
        text, json_mode = is_text(st.content_type), is_json(st.content_type)
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        if not text:
            headers["Stream-SSE-Data-Encoding"] = "base64"
        await ex.start_stream(200, "text/event-stream", headers)
        pos, first = start, True
        with trio.move_on_after(SSE_SECONDS):
            while True:
                i, j = st.span(pos, CHUNK)
                up = j >= st.durable
                changed = self.space.changed(st)  # (before any await: no change is missed)
                out: list[str] = []
                for k in range(i, j):
                    unit = st.units[k]
                    if json_mode:
                        payload = "[" + unit.decode("utf-8", "replace") + "]"
                    elif text:
                        payload = unit.decode("utf-8", "replace")
                    else:
                        payload = base64.b64encode(unit).decode("ascii")
                    pos = st.ends[k]
                    out.append(_sse_event("data", payload))
                    out.append(_sse_event("control", json.dumps(self._control(st, pos, up and k == j - 1, theirs))))
                if i == j:
                    pos = min(pos, st.visible_tail)
                    if first or st.ended:
                        out.append(_sse_event("control", json.dumps(self._control(st, pos, True, theirs))))
                first = False
                if out:
                    await ex.send("".join(out).encode("utf-8"))
                if (up and st.ended) or self.space.gone(st) or self.stopping.is_set():
                    break
                if up:
                    with trio.move_on_after(HEARTBEAT_SECONDS) as idle:
                        await changed.wait()
                    if idle.cancelled_caught:
                        await ex.send(b": keep-alive\n\n")
        await ex.end_stream()

    @staticmethod
    def _control(st: StreamState, pos: int, up: bool, theirs: str | None) -> dict[str, object]:
        c: dict[str, object] = {"streamNextOffset": encode_offset(pos)}
        if up and st.ended:
            c.update(streamClosed=True, upToDate=True)
        else:
            c["streamCursor"] = cursor(theirs)
            if up:
                c["upToDate"] = True
        return c
