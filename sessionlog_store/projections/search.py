"""The full-text search projection, sans I/O: which messages a session's
records make searchable, and how a person's query becomes an FTS5 query.

A message is indexed once it is finished (a user's message is created
finished; a reply when its finalize comes), with the text it ended with:
progress records are folded here (a running reply's text, in memory) but
not indexed, so a search never finds half a sentence that a retry or a
crash later changed, and the throttle path pays nothing per progress
record but this fold. A deleted session's messages leave the index. The
index itself (SQLite FTS5) is server/local/search.py; it is a projection
of the logs: deleting it loses nothing (`sessionlog rebuild` or the next
start writes it again)."""
from __future__ import annotations

import re
import msgspec

from sessionlog_store.eventstore.events import (
    MessageCreated,
    MessageFinalized,
    MessageProgress,
    OwnerChanged,
    SessionDeleted,
)
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.session import SessionState


class Put(msgspec.Struct, frozen=True):
    """A finished message, searchable: its text as it ended."""
    session_id: str
    msg_id: str
    role: str
    kind: str
    at: float
    text: str


class Drop(msgspec.Struct, frozen=True):
    """A session whose messages leave the index (deleted)."""
    session_id: str


class Redo(msgspec.Struct, frozen=True):
    """A session to index again from its log: the fold has not seen all of a
    message's text (it began before the fold did), or its owner changed."""
    session_id: str


Op = Put | Drop | Redo


class _Text:
    """A running message's text as its pieces: a progress record at its end
    is an append of one piece (no copy of the whole text per record)."""
    __slots__ = ("role", "kind", "at", "parts", "length", "gap")

    def __init__(self, role: str, kind: str, at: float, text: str) -> None:
        self.role, self.kind, self.at = role, kind, at
        self.parts = [text] if text else []
        self.length = len(text)
        self.gap = False

    def put(self, offset: int, delta: str) -> None:
        if offset != self.length:  # a rewrite (rare): cut, then go on
            if offset > self.length:
                self.gap = True  # (never expected: the log knows the text)
                return
            whole = "".join(self.parts)[:offset]
            self.parts, self.length = [whole], offset
        if delta:
            self.parts.append(delta)
            self.length += len(delta)

    def text(self) -> str:
        return "".join(self.parts)


class SearchFold:
    """Records in, index operations out. Keeps the text of each running
    message (what the saver holds anyway) until it finishes."""

    def __init__(self) -> None:
        self._running: dict[tuple[str, str], _Text] = {}

    def apply(self, sid: str, rec: Record) -> list[Op]:
        ev = rec.event
        if type(ev) is MessageProgress:
            held = self._running.get((sid, ev.msg_id))
            if held is not None:
                held.put(ev.offset, ev.content_delta)
            return []
        if isinstance(ev, MessageCreated):
            if ev.status in ("pending", "running"):
                self._running[(sid, ev.msg_id)] = _Text(ev.role, ev.kind, rec.ts, ev.content)
                return []
            return [Put(sid, ev.msg_id, ev.role, ev.kind, rec.ts, ev.content)] if ev.content.strip() else []
        if isinstance(ev, MessageFinalized):
            held = self._running.pop((sid, ev.msg_id), None)
            if held is None or (held.gap and ev.content is None):
                return [Redo(sid)]  # (begun before this fold: its start is in the log only)
            text = ev.content if ev.content is not None else held.text()
            return [Put(sid, ev.msg_id, held.role, held.kind, held.at, text)] if text.strip() else []
        if isinstance(ev, SessionDeleted):
            for key in [k for k in self._running if k[0] == sid]:
                del self._running[key]
            return [Drop(sid)]
        if isinstance(ev, OwnerChanged):
            return [Redo(sid)]
        return []


def puts_of(sid: str, state: SessionState) -> list[Put]:
    """Every finished message of a session (all its branches), as indexed."""
    return [Put(sid, m.msg_id, m.role, m.kind, m.started_at or m.created_at, m.content)
            for m in state.messages.values()
            if m.status not in ("pending", "running") and m.content.strip()]


_WORD = re.compile(r"\w+", re.UNICODE)
MAX_TERMS = 12


def fts_query(text: str) -> str | None:
    """A person's words as an FTS5 query on the text: every word must
    occur, the last one as a prefix (results as you type); quotes, operators
    and column filters in the input are words like any other. None: no word
    in it."""
    words = _WORD.findall(text)[:MAX_TERMS]
    if not words:
        return None
    quoted = [f'body : "{w}"' for w in words]
    if text[-1:].isalnum() or text[-1:] == "_":
        quoted[-1] += "*"  # (still typing it)
    return " ".join(quoted)


MARK_OPEN, MARK_CLOSE = "\x02", "\x03"


def split_marks(snippet: str) -> tuple[str, list[tuple[int, int]]]:
    """A snippet with FTS5's highlight markers, as its plain text and the
    [start, end) ranges of the matches in it (clients draw them; no markup
    crosses the wire)."""
    out: list[str] = []
    marks: list[tuple[int, int]] = []
    at = 0
    start = -1
    for ch in snippet:
        if ch == MARK_OPEN:
            start = at
        elif ch == MARK_CLOSE:
            if start >= 0:
                marks.append((start, at))
            start = -1
        else:
            out.append(ch)
            at += 1
    return "".join(out), marks
