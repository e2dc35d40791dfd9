"""Producing a reply from a backend (docs/HTTP.md: producing a reply from
outside the server): its placeholder opened, the text written in batches
at the durability interval through the Durable Streams protocol's
idempotent producer (exactly once across retries), token counts, the
finalize on exit (`done`; `error` with the exception's message), and a
user's Stop learnt within one interval (the reply's own stream followed:
its closure)."""
from __future__ import annotations

import math
import uuid
from typing import Any

import anyio
import httpx
import msgspec

from sessionlog_store.client.errors import ReplyStopped, refused
from sessionlog_store.client.reading import BACKOFF_MAX
from sessionlog_store.server.edge import apitypes as t

RETRY_FOR = 60.0  # how long an append is tried again (the same seq) while the server does not answer
CANCEL_GRACE = 5.0  # how long a cancelled reply's exit tries to send its last text and close


class Reply:
    """`async with client.reply(session_id) as r:` opens the reply (its
    placeholder durable), `r.write(text)` buffers, and every `interval`
    seconds the buffer is one append. On exit the rest is sent and the reply
    closed: `done`, or `error` with the exception's message (the exception
    goes on). `r.stopped` is set when the reply ended meanwhile (a Stop):
    writes are then dropped, and the exit closes nothing."""

    def __init__(self, http: httpx.AsyncClient, api: str, session_id: str, *, interval: float, kind: str,
                 metadata: dict[str, Any], caller: str | None = None, background: bool = True) -> None:
        self.http, self.api, self.session_id = http, api, session_id
        self.interval, self.kind, self.metadata, self.caller = interval, kind, metadata, caller
        self.reply_id = ""
        self.stream = ""
        self.stopped = anyio.Event()
        self.ended: ReplyStopped | None = None
        self._buffer: list[str] = []
        self._producer = uuid.uuid4().hex
        self._seq = 0
        self._tokens: t.Tokens | None = None
        self._in_doubt: str | None = None  # an append's text sent without an answer (cut or failed): sent again
        self._group: Any = None
        # (a tool call has none: its text is sent on exit, and it may be
        # entered and exited in any order beside others)
        self._background = background

    async def __aenter__(self) -> Reply:
        body = msgspec.json.encode(t.NewReply(kind=self.kind, metadata=self.metadata,  # type: ignore[arg-type]
                                              caller=self.caller, parent_id=self.caller))
        r = await self.http.post(f"{self.api}/sessions/{self.session_id}/replies", content=body,
                                 headers={"Content-Type": "application/json"})
        if r.status_code >= 400:
            raise refused(r)
        opened = msgspec.json.decode(r.content, type=t.ReplyOpened)
        self.reply_id, self.stream = opened.reply_id, opened.stream
        if self._background:
            self._group = anyio.create_task_group()
            await self._group.__aenter__()
            self._group.start_soon(self._flusher)
            self._group.start_soon(self._watch)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        cancelled = isinstance(exc, anyio.get_cancelled_exc_class())
        if self._group is not None:
            self._group.cancel_scope.cancel()
            try:
                await self._group.__aexit__(None, None, None)
            except anyio.get_cancelled_exc_class():
                if not cancelled:
                    raise
                # (the caller's cancel: it goes on once the close below is sent)
        # A caller's cancel too ends the reply (its close is sent), within
        # CANCEL_GRACE: past it the server's producer timeout ends it.
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + CANCEL_GRACE if cancelled else math.inf):
            if not self.stopped.is_set():
                await self._flush()
            if not self.stopped.is_set():
                if exc is None or isinstance(exc, (anyio.get_cancelled_exc_class(), KeyboardInterrupt)):
                    await self._append("", close=True)
                else:
                    await self._append("", close=True, error=f"{type(exc).__name__}: {exc}"[:1000])
        return False

    def write(self, text: str) -> None:
        """Buffer text (sent at the next interval; dropped once stopped)."""
        if text and not self.stopped.is_set():
            self._buffer.append(text)

    def tool_call(self, tool: str, *, call_id: str, arguments: str = "",
                  metadata: dict[str, Any] | None = None) -> Reply:
        """A tool call this reply makes, as a message of its own under it
        (`async with reply.tool_call("search", call_id="call_1",
        arguments='{"q": "x"}') as call:` write its result; the exit sends it
        and closes the call), as the in-process agents record theirs: its
        arguments in its metadata, its result as its text. Tool calls may
        end in any order."""
        return Reply(self.http, self.api, self.session_id, interval=self.interval, kind="tool_call",
                     metadata={**(metadata or {}), "tool": tool, "tool_call_id": call_id, "arguments": arguments},
                     caller=self.reply_id,
                     background=False)

    def tokens(self, *, input: int, output: int) -> None:
        """The token totals so far (sent with the next interval)."""
        self._tokens = t.Tokens(input=input, output=output)

    async def _flusher(self) -> None:
        while not self.stopped.is_set():
            await anyio.sleep(self.interval)
            await self._flush()

    async def _flush(self) -> None:
        if self._tokens is not None:
            tokens, self._tokens = self._tokens, None
            sent = False
            try:
                r = await self.http.patch(f"{self.api}/sessions/{self.session_id}/replies/{self.reply_id}",
                                          content=msgspec.json.encode(t.ReplyProgress(tokens=tokens)),
                                          headers={"Content-Type": "application/json"})
                # (a 409: its end learnt by the watch)
                sent = r.status_code < 500 and r.status_code != 429
            except httpx.TransportError:
                pass
            finally:
                if not sent and self._tokens is None:  # (totals: sent again with the next flush, cut or failed)
                    self._tokens = tokens
        if self._in_doubt is not None:
            # An append cut by a cancel (the exit's, or the caller's): the
            # server may have taken it. Sent again with the same seq, it is
            # taken once (or answered as its duplicate), and the next seq
            # (the close) is not taken for that duplicate.
            await self._append(self._in_doubt)
        if self._buffer:
            text, self._buffer = "".join(self._buffer), []
            await self._append(text)

    async def _append(self, text: str, *, close: bool = False, error: str | None = None) -> None:
        """One append, its seq kept across retries (a retry of one stored is
        answered as a duplicate); a 409 says the reply ended (stopped)."""
        headers = {"Content-Type": "text/plain; charset=utf-8", "Producer-Id": self._producer,
                   "Producer-Epoch": "0", "Producer-Seq": str(self._seq)}
        if close:
            headers["Stream-Closed"] = "true"
            if error is not None:
                headers.update({"Stream-Status": "error", "Stream-Error": error.replace("\n", " ")})
        deadline, delay = anyio.current_time() + RETRY_FOR, 0.1
        self._in_doubt = text  # (until answered: its seq not counted here)
        while True:
            try:
                r = await self.http.post(self.stream, content=text.encode(), headers=headers)
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code < 500 and r.status_code != 429:
                break
            if anyio.current_time() > deadline:
                raise refused(r) if r is not None else ConnectionError(f"{self.stream}: no answer")
            await anyio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX)
        self._seq += 1
        self._in_doubt = None
        if r.status_code == 409:
            self._ended(r)
        elif r.status_code >= 400:
            raise refused(r)

    def _ended(self, r: httpx.Response) -> None:
        if not self.stopped.is_set():
            status = r.headers.get("stream-status", "aborted")
            try:
                reason = msgspec.json.decode(r.content, type=t.Error).error.message
            except msgspec.DecodeError:
                reason = ""
            self.ended = ReplyStopped(status, reason)
            self._buffer.clear()
            self.stopped.set()

    async def _watch(self) -> None:
        """Follow the reply's own stream: its closure not by this producer
        (a Stop, the producer timeout) sets `stopped` at once."""
        offset = "now"
        while not self.stopped.is_set():
            try:
                r = await self.http.get(self.stream, params={"offset": offset, "live": "long-poll"})
            except httpx.TransportError:
                await anyio.sleep(self.interval)
                continue
            if r.status_code >= 400:
                await anyio.sleep(self.interval)
                continue
            offset = r.headers.get("stream-next-offset", offset)
            if r.headers.get("stream-closed") == "true":
                self._ended(r)
                return
