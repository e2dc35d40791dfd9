"""The Vercel AI SDK's door (docs/HTTP.md: "The Vercel AI SDK"): a React app's `useChat` with
its default transport talks to sessionlog's agents with nothing but this
endpoint's URL.

    POST /v1/ai/chat                   {id, messages, trigger, ...}: the last user message is chatted
                                       into the chat's session (made on the first message); the
                                       answer is the reply as a UI message stream (SSE)
    GET  /v1/ai/chat/{id}/stream       the running reply, replayed whole and then live (what
                                       `useChat({resume: true})` asks after a reload); 204 when none runs
    GET  /v1/ai/chat/{id}/messages     the chat's finished messages as UIMessages (to start a reloaded
                                       page with, as the AI SDK's persistence guide does)

A chat's session id is made from its user and its chat id
(`chat_session`): one user's chat id never names another user's session,
so the door tells nobody which sessions exist (a chat id of theirs is a
new chat of yours), and any string of up to 200 characters is a chat id.
The stream's `start` says the session id (`messageMetadata.sessionId`).

The stream is folded from the session's log (projections/ui_stream.py),
durable records only: what a reader was sent is never taken back by a
crash, so a resume's full replay is exactly what was stored. A reader that
leaves (a reload, `stop()` in the page) does not stop the reply: the AI
SDK's resumable-stream rule; a user's Stop is sessionlog's
(`POST /v1/sessions/{id}/messages/{msg_id}/stop`), and the stream then ends
with `abort`.
"""
from __future__ import annotations

import base64
import hashlib
import re
from typing import Any, Final
from urllib.parse import unquote

import msgspec
import trio

from sessionlog_store.projections.ui_stream import UiReplyFold, ui_messages
from sessionlog_store.server.domain.errors import BadRequest, Conflict, NotFound
from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.edge.http import Exchange, Request
from sessionlog_store.server.edge.logstream import LogTaps, durable_records, next_durable
from sessionlog_store.server.edge.operations import Operations
from sessionlog_store.server.edge.streams import HEARTBEAT_SECONDS

PATH: Final = "/v1/ai/chat"
_RESUME: Final = re.compile(r"^/v1/ai/chat/(?P<chat_id>[^/]+)/stream$")
_HISTORY: Final = re.compile(r"^/v1/ai/chat/(?P<chat_id>[^/]+)/messages$")
# What the AI SDK's UI message stream answers carry (its `x-vercel-ai-ui-message-stream: v1`).
SSE_HEADERS: Final = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "x-vercel-ai-ui-message-stream": "v1"}
ALLOW_HEADERS: Final = "Authorization, Content-Type"
MAX_CHAT_ID: Final = 200
# After a stop began, how long a stream waits for its reply's last record
# (the stop's `aborted` "server shutdown" finalize) before it ends without it.
STOP_WAIT_SECONDS: Final = 2.0
_ENCODE: Final = msgspec.json.Encoder()


class UiPart(msgspec.Struct, kw_only=True):
    type: str
    text: str = ""


class UiMessage(msgspec.Struct, kw_only=True):
    id: str = ""
    role: str
    parts: list[UiPart] = []


class UiChatRequest(msgspec.Struct, kw_only=True):
    """What DefaultChatTransport posts (fields an app adds are let through)."""
    id: str
    messages: list[UiMessage]
    trigger: str = "submit-message"
    messageId: str | None = None


def is_ai_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def chat_session(user: str, chat_id: str) -> str:
    """The session of `user`'s chat `chat_id` (a session id: "ai" and 20 base64url characters)."""
    if not chat_id or len(chat_id) > MAX_CHAT_ID:
        raise BadRequest("bad_field", f"a chat id is 1 to {MAX_CHAT_ID} characters")
    digest = hashlib.sha256(f"{user}\0{chat_id}".encode("utf-8", "surrogatepass")).digest()
    return "ai" + base64.urlsafe_b64encode(digest[:15]).decode()


def _last_user_text(body: UiChatRequest) -> str:
    if not body.messages or body.messages[-1].role != "user":
        raise BadRequest("bad_request", "the last message must be the user's (trigger submit-message)")
    text = "".join(part.text for part in body.messages[-1].parts if part.type == "text")
    if not text.strip():
        raise BadRequest("bad_field", "the user's message has no text")
    return text


class AiChat:
    """One request to the AI SDK's door, for one user (`ops`)."""

    def __init__(self, ex: Exchange, ops: Operations, taps: LogTaps) -> None:
        self.ex, self.ops, self.taps = ex, ops, taps

    async def answer(self, req: Request, body: bytes) -> None:
        if req.path == PATH:
            if req.method != "POST":
                raise BadRequest("method_not_allowed", f"{req.method} {PATH}: POST only")
            await self._chat(msgspec.json.decode(body, type=UiChatRequest))
            return
        resume, history = _RESUME.match(req.path), _HISTORY.match(req.path)
        if (resume or history) is None:
            raise NotFound("not_found", f"no such endpoint: {req.method} {req.path}")
        if req.method != "GET" or body:  # (no HEAD: a stream has no length to say)
            raise BadRequest("method_not_allowed", f"{req.method} {req.path}: GET only, without a body")
        sid = chat_session(self.ops.principal.user, unquote((resume or history)["chat_id"]))  # type: ignore[index]
        if history is not None:
            await self.ex.reply(200, _ENCODE.encode(ui_messages(await self._branch(sid))), "application/json",
                                headers={"Cache-Control": "no-store"})
            return
        running = [m for m in await self._branch(sid)
                   if m["status"] in ("running", "pending") and m["role"] == "assistant" and not m.get("caller")]
        if not running:
            await self.ex.reply(204)  # no active stream: the AI SDK does not resume
            return
        await self._stream(sid, running[-1]["msg_id"])

    async def _branch(self, sid: str) -> list[dict[str, Any]]:
        """The chat's current branch (nothing for a chat not made yet)."""
        try:
            _, loaded = await self.ops.run(p.LoadSession(session_id=sid))
        except NotFound:
            return []
        return list(loaded["messages"])

    async def _chat(self, body: UiChatRequest) -> None:
        if body.trigger != "submit-message":
            raise BadRequest("bad_request", f"trigger {body.trigger[:40]!r}: only submit-message (regenerate "
                             "with sessionlog's retry: POST /v1/sessions/{id}/messages/{msg_id}/retry)")
        sid = chat_session(self.ops.principal.user, body.id)
        text = _last_user_text(body)
        for _ in range(2):
            try:
                self.ops.own(sid)
                exists = True
            except NotFound:
                exists = False
            try:
                _, ack = await self.ops.chat(p.Chat(content=text, session_id=sid if exists else None,
                                                    source="ai-sdk"), new_id=None if exists else sid)
                break
            except Conflict as e:  # the chat's first message, sent twice at once: the other made it
                if e.code != "session_exists":
                    raise
        else:
            raise Conflict("reply_running", "another first message of this chat is being answered")
        await self._stream(ack["session_id"], ack["reply_id"])

    async def _stream(self, sid: str, reply_id: str) -> None:
        """The reply as a UI message stream from its start: the log's durable
        records folded, then each new one as it is durable, to the reply's end."""
        ex, es, fold = self.ex, self.taps.es, UiReplyFold(reply_id, {"sessionId": sid})
        tap = self.taps.open(sid)  # (before the read: no record falls between)
        try:
            await ex.start_stream(200, "text/event-stream", SSE_HEADERS)
            records: list[Any] | None = await durable_records(es, sid, 0)
            pos = 0
            while True:
                if records is None:  # fell behind, the log was rebased, or a stop: read on from where it was
                    if self.taps.stopping:
                        await self._last_words(sid, pos, fold)
                        break
                    self.taps.close(sid, tap)
                    tap = self.taps.open(sid)
                    records = await durable_records(es, sid, pos)
                pos = await self._send(records, fold, pos)
                if fold.ended:
                    await ex.send(b"data: [DONE]\n\n")
                    break
                with trio.move_on_after(HEARTBEAT_SECONDS) as idle:
                    records = await next_durable(es, sid, pos, tap)
                if idle.cancelled_caught:
                    await ex.send(b": keep-alive\n\n")
                    records = []
        finally:
            self.taps.close(sid, tap)
        await ex.end_stream()

    async def _send(self, records: list[Any], fold: UiReplyFold, pos: int) -> int:
        """Fold `records` and send the chunks they make; the last seq folded."""
        chunks: list[Any] = []
        for rec in records:
            pos = rec.seq
            chunks += fold.feed(rec.event)
        if chunks:
            await self.ex.send(b"".join(b"data: " + _ENCODE.encode(c) + b"\n\n" for c in chunks))
        return pos

    async def _last_words(self, sid: str, pos: int, fold: UiReplyFold) -> None:
        """A stop began: the reply's finalize (`aborted` "server shutdown") is
        written after the readers are woken. Wait for it (a while), so that
        the page learns how its reply ended; then end."""
        es = self.taps.es
        tap = self.taps.open(sid, stopping_too=True)  # (before the read: no record falls between)
        try:
            with trio.move_on_after(STOP_WAIT_SECONDS):
                records: list[Any] | None = await durable_records(es, sid, pos)
                while records is not None:
                    pos = await self._send(records, fold, pos)
                    if fold.ended:
                        await self.ex.send(b"data: [DONE]\n\n")
                        return
                    records = await next_durable(es, sid, pos, tap)
        finally:
            self.taps.close(sid, tap)
