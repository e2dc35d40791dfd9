"""The full-text search projection, sans I/O: which messages a session's
records make searchable, and how a person's query becomes an FTS5 query.

A message is indexed once it is finished (a user's message is created
finished; a reply when its finalize comes), with the text it ended with:
a running reply's text is read from the loaded session when it ends, not
indexed as it grows, so a search never finds half a sentence that a retry
or a crash later changed, and the throttle path pays nothing per progress
record here. A deleted session's messages leave the index. The
index itself (SQLite FTS5) is server/local/search.py; it is a projection
of the logs: deleting it loses nothing (`sessionlog rebuild` or the next
start writes it again)."""
from __future__ import annotations

import re
from collections.abc import Callable

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


class SearchFold:
    """Records in, index operations out. A finished message's text is its
    finalize's, or else `content_of(session, msg_id)`: the loaded
    session's, as the store folded it (its record listener runs first).
    So a progress record costs this fold nothing (issue 29: it held a copy
    of every running reply's text, 1.8 us a record on the throttle path,
    and its memory). A message whose text is not known here (begun before
    the fold, or its session not loaded) is indexed again from its log."""

    def __init__(self, content_of: Callable[[str, str], str | None]) -> None:
        self.content_of = content_of
        self._running: dict[tuple[str, str], tuple[str, str, float]] = {}  # -> its role, kind, time

    def apply(self, sid: str, rec: Record) -> list[Op]:
        ev = rec.event
        if type(ev) is MessageProgress:
            return []
        if isinstance(ev, MessageCreated):
            if ev.status in ("pending", "running"):
                self._running[(sid, ev.msg_id)] = (ev.role, ev.kind, rec.ts)
                return []
            return [Put(sid, ev.msg_id, ev.role, ev.kind, rec.ts, ev.content)] if ev.content.strip() else []
        if isinstance(ev, MessageFinalized):
            held = self._running.pop((sid, ev.msg_id), None)
            text = None if held is None else ev.content if ev.content is not None else self.content_of(sid, ev.msg_id)
            if held is None or text is None:
                return [Redo(sid)]  # (begun before this fold, or not loaded: its text is in the log)
            role, kind, at = held
            return [Put(sid, ev.msg_id, role, kind, at, text)] if text.strip() else []
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
