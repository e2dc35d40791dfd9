"""Reading a stream through the Durable Streams protocol (docs/HTTP.md: a
message's text as a stream): catch-up from an offset, then long-poll at
the tail; a cut connection or a server that is not answering is tried
again from the last offset read, with backoff, so the caller sees one
gapless text. (Not PyPI's `durable-streams`: its writer is asyncio-only
and its 0.1.0 reader asks again without end once a long-polled stream is
closed; the protocol's long-poll over httpx is a few lines. docs/API.md.)"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

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


async def read_stream(http: httpx.AsyncClient, path: str, *, offset: str = "-1",
                      live: bool = True, tries: int | None = None) -> AsyncIterator[Chunk]:
    """The stream's text from `offset` until it is closed (`live` False:
    until its tail as it is now). `tries`: how many failed requests in a
    row before giving up (None: never)."""
    delay, failed, at_tail = BACKOFF_FIRST, 0, False
    while True:
        params = {"offset": offset}
        if live and at_tail:
            params["live"] = "long-poll"
        try:
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
            raise refused(r)
        delay, failed = BACKOFF_FIRST, 0
        offset = r.headers.get("stream-next-offset", offset)
        closed = r.headers.get("stream-closed") == "true"
        text = r.content.decode() if r.status_code == 200 else ""
        if closed:
            status = r.headers.get("stream-status")
            reason = r.headers.get("stream-aborted-reason") or r.headers.get("stream-error")
            yield Chunk(text, offset, status or "done", reason)
            return
        if text:
            yield Chunk(text, offset)
        at_tail = r.headers.get("stream-up-to-date") == "true" or r.status_code == 204
        if at_tail and not live:
            return
