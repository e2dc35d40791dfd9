"""The Vercel AI SDK's UI message stream of one reply, folded from its
session's log (sans-I/O: events in, the protocol's chunks out; the edge
sends them as SSE, server/edge/aisdk.py).

The reply's placeholder is the stream's `start` (its `messageId` is the
reply's id) and `start-step`; its text the `text-start` / `text-delta` /
`text-end` of a block; each tool call or agentic function it makes (a
message of its own under it) ends the block and is a dynamic tool part:
`tool-input-available` (name, arguments) when it is created, and
`tool-output-available` (its text) or `tool-output-error` when it ends; text
after a tool starts a new step. The reply's finalize is `finish` (done),
`error` (with its message) or `abort` (with its reason: a Stop, a restart).
A fold fed the log from its start gives a full replay: what
`useChat({resume: true})` rebuilds a reply from after a reload.
"""
from __future__ import annotations

import json
from typing import Any

from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress,
                                                MessageProgressV1, SessionDeleted)

Chunk = dict[str, Any]
TOOL_KINDS = ("tool_call", "agentic_fn")


class UiReplyFold:
    """Feed a session's log events in order; each returns the chunks they add."""

    def __init__(self, reply_id: str, metadata: dict[str, Any] | None = None) -> None:
        self.reply_id = reply_id
        self.metadata = metadata  # the `start` chunk's messageMetadata
        self.started = False
        self.ended = False
        self.length = 0               # the reply's characters sent
        self._text_id: str | None = None
        self._blocks = 0
        self._after_tool = False
        self._calls: dict[str, tuple[str, str]] = {}  # a tool message's id -> (toolCallId, its text)

    def feed(self, ev: object) -> list[Chunk]:
        if self.ended:
            return []
        if isinstance(ev, MessageCreated):
            if ev.msg_id == self.reply_id:
                self.started = True
                start: Chunk = {"type": "start", "messageId": ev.msg_id}
                if self.metadata is not None:
                    start["messageMetadata"] = self.metadata
                return [start, {"type": "start-step"}, *self._text(ev.content)]
            if self.started and ev.caller == self.reply_id and ev.kind in TOOL_KINDS:
                return self._tool(ev)
            return []
        if isinstance(ev, (MessageProgress, MessageProgressV1)):
            if ev.msg_id == self.reply_id and self.started:
                # (exact: a delta is placed at its offset; what was sent is not sent again)
                return self._text(ev.content_delta[max(0, self.length - ev.offset):])
            call = self._calls.get(ev.msg_id)
            if call is not None:
                self._calls[ev.msg_id] = (call[0], call[1][:ev.offset] + ev.content_delta)
            return []
        if isinstance(ev, MessageFinalized):
            call = self._calls.pop(ev.msg_id, None)
            if call is not None:
                output = ev.content if ev.content is not None else call[1]
                if ev.status == "done":
                    return [{"type": "tool-output-available", "toolCallId": call[0], "output": output,
                             "dynamic": True}]
                return [{"type": "tool-output-error", "toolCallId": call[0], "dynamic": True,
                         "errorText": ev.error or ev.aborted_reason or ev.status}]
            if ev.msg_id == self.reply_id and self.started:
                rest = ev.content[self.length:] if ev.content is not None else ""
                out = self._text(rest) + self._end_text()
                self.ended = True
                if ev.status == "done":
                    return out + [{"type": "finish-step"}, {"type": "finish", "finishReason": "stop"}]
                if ev.status == "error":
                    return out + [{"type": "error", "errorText": ev.error or "the reply failed"}]
                return out + [{"type": "abort", "reason": ev.aborted_reason or "aborted"}]
            return []
        if isinstance(ev, SessionDeleted) and self.started:
            self.ended = True
            return self._end_text() + [{"type": "abort", "reason": "session deleted"}]
        return []

    def _text(self, delta: str) -> list[Chunk]:
        if not delta:
            return []
        out: list[Chunk] = []
        if self._text_id is None:
            if self._after_tool:
                out += [{"type": "finish-step"}, {"type": "start-step"}]
                self._after_tool = False
            self._blocks += 1
            self._text_id = f"{self.reply_id}-{self._blocks}"
            out.append({"type": "text-start", "id": self._text_id})
        out.append({"type": "text-delta", "id": self._text_id, "delta": delta})
        self.length += len(delta)
        return out

    def _end_text(self) -> list[Chunk]:
        if self._text_id is None:
            return []
        out: list[Chunk] = [{"type": "text-end", "id": self._text_id}]
        self._text_id = None
        return out

    def _tool(self, ev: MessageCreated) -> list[Chunk]:
        meta = ev.metadata
        call_id = str(meta.get("tool_call_id") or ev.msg_id)
        name = str(meta.get("tool") or meta.get("function") or ev.kind)
        self._calls[ev.msg_id] = (call_id, ev.content)
        self._after_tool = True
        return self._end_text() + [{"type": "tool-input-available", "toolCallId": call_id, "toolName": name,
                                    "input": tool_input(meta.get("arguments")), "dynamic": True}]


def tool_input(arguments: object) -> object:
    """A tool call's arguments as the UI shows them: parsed when they are JSON."""
    if not arguments:
        return {}
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def ui_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A loaded branch (load_session's messages) as the AI SDK's UIMessages:
    the conversational ones, each reply with its tool calls as dynamic tool
    parts before its text. A running reply is there with what it has so
    far: the resume route's replay (from its `start`, same id) rebuilds it
    whole, and a reply that ends between the two requests is not lost."""
    tools: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        if m["kind"] in TOOL_KINDS and m.get("caller"):
            meta = m.get("metadata") or {}
            part: dict[str, Any] = {"type": "dynamic-tool", "toolName": str(meta.get("tool") or meta.get("function")
                                                                            or m["kind"]),
                                    "toolCallId": str(meta.get("tool_call_id") or m["msg_id"]),
                                    "input": tool_input(meta.get("arguments"))}
            if m["status"] == "done":
                part.update(state="output-available", output=m["content"])
            elif m["status"] in ("running", "pending"):
                part.update(state="input-available")
            else:
                part.update(state="output-error", errorText=m.get("error") or m["status"])
            tools.setdefault(m["caller"], []).append(part)
    out = []
    for m in messages:
        if m.get("caller") or m["kind"] in TOOL_KINDS or m["role"] not in ("user", "assistant"):
            continue
        parts = [*tools.get(m["msg_id"], []), *([{"type": "text", "text": m["content"]}] if m["content"] else [])]
        out.append({"id": m["msg_id"], "role": m["role"], "parts": parts})
    return out
