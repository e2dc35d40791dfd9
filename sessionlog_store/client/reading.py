"""Reading a stream through the Durable Streams protocol (docs/HTTP.md: a
message's text as a stream): catch-up from an offset, then SSE (or
long-poll) at the tail; a cut connection or a server that is not
answering is tried again from the last offset read, with backoff, so the
caller sees one gapless text. (Not PyPI's `durable-streams`: its writer
is asyncio-only, and its 0.1.0 long-poll reader asks again without end:
`python -m bench client_reads` measured 63,000 requests for one 15 s
reply. SSE costs a third of long-poll's CPU there, at the same delay.)"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import json

import anyio
import httpx

from sessionlog_store.client.errors import ApiError, refused

BACKOFF_FIRST = 0.1
BACKOFF_MAX = 5.0


@dataclass(frozen=True)
class Chunk:
    """Text read, the offset after it (resume from there), and, on the
    last chunk of an ended message, its status (`done`, `error`,
    `aborted`) and why (`aborted`: the reason; `error`: the message)."""
    text: str
    offset: str
    status: str | None = None
    reason: str | None = None
    # The server lost a tail it had sent (it crashed before that tail was
    # written: docs/PROTOCOL.md): this chunk starts again from the stream's
    # start. `text = chunk.text if chunk.restart else text + chunk.text`.
    restart: bool = False


async def read_stream(http: httpx.AsyncClient, path: str, *, offset: str = "-1", live: bool = True,
                      mode: str = "sse", tries: int | None = None) -> AsyncIterator[Chunk]:
    """The stream's text from `offset` until it is closed (`live` False:
    until its tail as it is now), read at the tail by SSE (`mode`, the
    default: one response a minute) or long-poll (a request a batch).
    `tries`: how many failed requests in a row before giving up (None:
    never)."""
    delay, failed, at_tail = BACKOFF_FIRST, 0, False
    delivered = restart = False  # (a refused offset after a delivery is a tail the server lost)
    while True:
        params = {"offset": offset}
        if live and at_tail:
            params["live"] = "sse" if mode == "sse" else "long-poll"
        r: httpx.Response | None = None
        try:
            if params.get("live") == "sse":
                async with http.stream("GET", path, params=params) as r:
                    if r.status_code == 200:
                        delay, failed = BACKOFF_FIRST, 0
                        async for chunk in _events(r):
                            offset = chunk.offset
                            if restart:
                                chunk, restart = replace(chunk, restart=True), False
                            delivered = delivered or bool(chunk.text)
                            yield chunk
                            if chunk.status is not None:
                                return
                        continue  # (its minute ended, or it was cut: from the offset read)
                    await r.aread()
            else:
                r = await http.get(path, params=params)
        except httpx.TransportError:
            r = None
        if r is None or r.status_code >= 500 or r.status_code == 429:
            failed += 1
            if tries is not None and failed >= tries:
                if r is not None:
                    raise refused(r)
                raise ApiError(0, "unreachable", f"{path}: no answer after {failed} tries")
            await anyio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)
            continue
        if r.status_code >= 400:
            error = refused(r)
            if error.code == "bad_offset" and delivered:
                offset, restart, at_tail = "-1", True, False
                continue
            raise error
        delay, failed = BACKOFF_FIRST, 0
        offset = r.headers.get("stream-next-offset", offset)
        closed = r.headers.get("stream-closed") == "true"
        text = r.content.decode() if r.status_code == 200 else ""
        if closed:
            yield Chunk(text, offset, r.headers.get("stream-status") or "done", r.headers.get("stream-error"),
                        restart=restart)
            return
        if text or restart:
            yield Chunk(text, offset, restart=restart)
            delivered, restart = delivered or bool(text), False
        at_tail = r.headers.get("stream-up-to-date") == "true" or r.status_code == 204
        if at_tail and not live:
            return


async def _events(r: httpx.Response) -> AsyncIterator[Chunk]:
    """The protocol's SSE answer as chunks: the `data` events' text up to
    each `control` event, with its offset (and the end's status). Lines
    are split at LF only, as the server writes them (a CR is text)."""
    buf, kind, data, text = "", "", [], ""
    async for piece in r.aiter_text():
        buf += piece
        while "\n" in buf:
            line, buf = buf.split("\n", 1)
            if line.startswith("event:"):
                kind = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[6:] if line.startswith("data: ") else line[5:])
            elif line == "":
                if kind == "data":
                    text += "\n".join(data)
                elif kind == "control":
                    c = json.loads("\n".join(data))
                    closed = c.get("streamClosed") is True
                    yield Chunk(text, str(c.get("streamNextOffset", "")), c.get("status") if closed else None,
                                (c.get("abortedReason") or c.get("error")) if closed else None)
                    text = ""
                kind, data = "", []
