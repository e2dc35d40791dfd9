"""A session's event log as a Durable Streams stream (docs/HTTP.md): every
record, in order, from any offset, with the live tail by long-poll or SSE.

    GET /v1/stream/sessions/{session_id}?offset=<o>[&live=long-poll|sse]

The stream is JSON (`application/json`): each message one record,
`{"seq": 7, "ts": 1733200000.1, "event": {"type": "message_created", ...}}`
(the log's own events, docs/DESIGN-NOTES.md; a progress record's short
spelling `{"type": "p", "m", "d", "o", ...}` as on disk). An offset is the
last seq read and the stream's tag, as a message stream's (streams.py);
only durable records are shown (nothing a crash can take back). The
stream closes with the session's deletion (its last record).

A live reader taps the log's records as they are appended (LogTaps: one
listener for all readers), holds them until they are durable, and is ended
when it falls MAX_HELD records behind or the log is rebased under it (a
shared stream's): it resumes from its offset, nothing is queued without bound.
"""
from __future__ import annotations

import json
from typing import Final
from urllib.parse import parse_qsl, urlsplit

import msgspec
import trio

from sessionlog_store.eventstore.backend import EventLog
from sessionlog_store.eventstore.events import SessionDeleted
from sessionlog_store.eventstore.record import Record
from sessionlog_store.server.domain.errors import BadRequest
from sessionlog_store.server.edge.http import Exchange
from sessionlog_store.server.edge.operations import Operations
from sessionlog_store.server.edge.streams import (HEARTBEAT_SECONDS, LONG_POLL_SECONDS, SSE_SECONDS, cursor,
                                                  decode_offset, encode_offset, stream_tag)

JSON: Final = "application/json"
# A catch-up answer carries at most this many records (then a client reads on).
CHUNK_RECORDS: Final = 1000
# A live reader this many undelivered records behind is ended (it resumes).
MAX_HELD: Final = 10_000
_ENCODE: Final = msgspec.json.Encoder()


class Tap:
    """One live reader's records of one session, as appended."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.changed = trio.Event()
        self.void = False  # fell behind, or the log was rebased: the reader ends

    def push(self, rec: Record) -> None:
        if len(self.records) >= MAX_HELD:
            self.void = True
        else:
            self.records.append(rec)
        self.changed.set()


class LogTaps:
    """The taps of every live reader of a session's log, fed by one listener."""

    def __init__(self, es: EventLog) -> None:
        self.es = es
        self.taps: dict[str, set[Tap]] = {}
        self.stopping = False  # (a stop: every live reader ends; it resumes from its offset)
        es.listeners.append(self._on_record)
        es.reset_listeners.append(self._on_reset)

    def _on_record(self, sid: str, rec: Record, end: int) -> None:
        for tap in self.taps.get(sid, ()):
            tap.push(rec)

    def _on_reset(self, sid: str, records: list[Record], durable: int) -> None:
        for tap in self.taps.get(sid, ()):
            tap.void = True
            tap.changed.set()

    def wake_all(self) -> None:
        """A stop: every live reader ends its answer."""
        self.stopping = True
        for taps in self.taps.values():
            for tap in taps:
                tap.void = True
                tap.changed.set()

    def open(self, sid: str, *, stopping_too: bool = False) -> Tap:
        """A tap of `sid`'s records; during a stop void at once, unless
        `stopping_too` (a reader waiting for the stop's own last records)."""
        tap = Tap()
        tap.void = self.stopping and not stopping_too
        self.taps.setdefault(sid, set()).add(tap)
        return tap

    def close(self, sid: str, tap: Tap) -> None:
        taps = self.taps.get(sid)
        if taps is not None:
            taps.discard(tap)
            if not taps:
                del self.taps[sid]


async def durable_records(es: EventLog, sid: str, start: int, *, wait: bool = True) -> list[Record]:
    """The records of a session's log after seq `start`, once durable. A
    live reader waits for the last one's durability (`wait`): a record
    appended before its tap opened and not durable yet is in no tap, so
    leaving it out would skip it for good. A catch-up read (`wait=False`)
    answers the durable ones at once: its reader asks again from its offset."""
    if not wait:
        durable = es.durable_seq(sid)
        return [r for r in await es.read(sid, start) if r.seq <= durable] if start < durable else []
    records = await es.read(sid, start)
    if records:
        await es.wait_durable(sid, records[-1].seq)
    return records


async def next_durable(es: EventLog, sid: str, pos: int, tap: Tap) -> list[Record] | None:
    """The tapped records after `pos`, once durable (waiting for some);
    None when the tap is void (the reader ends and resumes). Cancelled while
    it waits for durability (a heartbeat's timer), it keeps them in the tap:
    the next call hands them over."""
    while True:
        if tap.void:
            return None
        fresh = [r for r in tap.records if r.seq > pos]
        if fresh:
            await es.wait_durable(sid, fresh[-1].seq)
            last = fresh[-1].seq
            tap.records = [r for r in tap.records if r.seq > last]
            return fresh
        tap.records.clear()
        tap.changed = trio.Event()
        await tap.changed.wait()


def _message(rec: Record) -> bytes:
    return b'{"seq":%d,"ts":%s,"event":%s}' % (rec.seq, json.dumps(rec.ts).encode(), _ENCODE.encode(rec.event))


def _body(records: list[Record]) -> bytes:
    return b"[" + b",".join(_message(r) for r in records) + b"]"


class SessionLogStream:
    """One read of one session's event log."""

    def __init__(self, ex: Exchange, ops: Operations, taps: LogTaps, target: str, session_id: str) -> None:
        self.ex, self.ops, self.taps, self.es = ex, ops, taps, taps.es
        self.sid = session_id
        self.tag = stream_tag(session_id, "")
        query = dict(parse_qsl(urlsplit(target).query, keep_blank_values=True))
        self.live, self.offset, self.cursor = query.get("live"), query.get("offset"), query.get("cursor")
        if self.live not in (None, "long-poll", "sse"):
            raise BadRequest("bad_request", f"live={self.live[:20]!r}: long-poll or sse")

    async def answer(self, method: str, if_none_match: str) -> None:
        self.ops.readable(self.sid, "stream read of the event log")
        durable = self.es.durable_seq(self.sid)
        start = decode_offset(self.offset, durable, self.tag)
        if method == "HEAD" or self.live is None:
            await self._catch_up(start, method, if_none_match)
            return
        tap = self.taps.open(self.sid)  # (before the catch-up read: no record falls between)
        try:
            if self.live == "long-poll":
                await self._long_poll(start, tap)
            else:
                await self._sse(start, tap)
        finally:
            self.taps.close(self.sid, tap)

    async def _read(self, start: int) -> list[Record]:
        return await durable_records(self.es, self.sid, start)

    async def _next(self, pos: int, tap: Tap) -> list[Record] | None:
        return await next_durable(self.es, self.sid, pos, tap)

    def _closing(self, records: list[Record]) -> dict[str, str]:
        if records and isinstance(records[-1].event, SessionDeleted):
            return {"Stream-Closed": "true"}
        return {}

    async def _catch_up(self, start: int, method: str, if_none_match: str) -> None:
        records = (await durable_records(self.es, self.sid, start, wait=False))[:CHUNK_RECORDS] \
            if method != "HEAD" else []
        end = records[-1].seq if records else max(start, 0) if method != "HEAD" else self.es.durable_seq(self.sid)
        up = end >= self.es.durable_seq(self.sid)
        headers = {"Stream-Next-Offset": encode_offset(end, self.tag), "Cache-Control": "no-store",
                   **self._closing(records)}
        if up:
            headers["Stream-Up-To-Date"] = "true"
        etag = f'"{self.sid}:log:{encode_offset(start, self.tag)}:{encode_offset(end, self.tag)}"'
        if self.offset != "now":
            headers["ETag"] = etag
        if method != "HEAD" and etag in {t.strip() for t in if_none_match.split(",")}:
            await self.ex.reply(304, headers=headers)
            return
        await self.ex.reply(200, _body(records), JSON, headers=headers)

    async def _long_poll(self, start: int, tap: Tap) -> None:
        records = (await self._read(start))[:CHUNK_RECORDS]
        if not records:
            with trio.move_on_after(LONG_POLL_SECONDS):
                records = await self._next(start, tap) or []
        end = records[-1].seq if records else start
        headers = {"Stream-Next-Offset": encode_offset(end, self.tag), "Stream-Cursor": cursor(self.cursor),
                   "Stream-Up-To-Date": "true", "Cache-Control": "no-store", **self._closing(records)}
        if not records:
            await self.ex.reply(204, headers=headers)
            return
        await self.ex.reply(200, _body(records), JSON, headers=headers)

    async def _sse(self, start: int, tap: Tap) -> None:
        ex, pos = self.ex, start
        await ex.start_stream(200, "text/event-stream", {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        records: list[Record] | None = await self._read(start)
        first = True
        with trio.move_on_after(SSE_SECONDS):
            while records is not None:
                closed = False
                for k in range(0, max(len(records), 1), CHUNK_RECORDS):  # (a long catch-up: in chunks)
                    part = records[k:k + CHUNK_RECORDS]
                    out = b""
                    if part:
                        pos = part[-1].seq
                        out += b"event: data\ndata:" + _body(part) + b"\n\n"
                    control: dict[str, object] = {"streamNextOffset": encode_offset(pos, self.tag)}
                    closed = bool(self._closing(part))
                    last = k + CHUNK_RECORDS >= len(records)
                    if closed:
                        control.update(streamClosed=True, upToDate=True)
                    else:
                        control.update(streamCursor=cursor(self.cursor), upToDate=last)
                    if part or first:
                        out += f"event: control\ndata:{json.dumps(control)}\n\n".encode()
                        await ex.send(out)
                first = False
                if closed:
                    break
                with trio.move_on_after(HEARTBEAT_SECONDS) as idle:
                    records = await self._next(pos, tap)
                if idle.cancelled_caught:
                    await ex.send(b": keep-alive\n\n")
                    records = []
        await ex.end_stream()
