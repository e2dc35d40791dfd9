"""The registry: one row per session, ordered by updated_at (newest first).

Pure and in memory: listing with filters, offset and limit touches no disk.
Each session also carries the (seq, end) of the last record applied and the
seq at which its meta last changed, which is what a checkpoint needs.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Final

import msgspec
from sortedcontainers import SortedList

from sessionlog_store.eventstore.events import MessageProgress
from sessionlog_store.eventstore.record import Record

from .session import SessionMeta, apply_meta

# Row fields a listing may filter on by equality.
FILTERABLE: Final = frozenset({"agent_id", "source", "status", "pinned", "unread", "project_id", "owner"})

# Every stored row field, in order (the 15 stored + preview); `project` is the 17th.
# (`owner` is not shown: a row is only ever seen by its owner, or an admin
# who filters by it.)
ROW_ATTRS: Final = tuple((f.name, f.encode_name) for f in msgspec.structs.fields(SessionMeta)
                         if f.name not in ("open_msgs", "owner"))  # (attribute, wire name)
ROW_FIELDS: Final = tuple(wire for _, wire in ROW_ATTRS)


class Mark(msgspec.Struct, kw_only=True, gc=False):
    seq: int = 0          # last record applied
    end: int = 0          # byte offset just past it
    meta_seq: int = 0     # the record at which the meta last changed


class InvalidFilter(ValueError):
    """The caller filtered on a field that does not exist or cannot be filtered."""


class Registry:
    """Session rows keyed by id, plus a sorted index by updated_at descending."""

    def __init__(self) -> None:
        self.rows: dict[str, SessionMeta] = {}
        self.marks: dict[str, Mark] = {}
        # Rows in the list's own order (SessionMeta.__lt__: newest first, then
        # by id): no sort key a row (a key tuple and its float were ~100 bytes
        # a session, 10 MB at 100,000 sessions: issue 29).
        self._order: SortedList = SortedList()
        self.owned: Counter[str] = Counter()  # rows per owner (the per-user session limit)
        self.archived = 0  # archived rows (kept as rows change: a metrics scrape counts nothing)

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self.rows

    def get(self, session_id: str) -> SessionMeta | None:
        return self.rows.get(session_id)

    def put(self, meta: SessionMeta | None, session_id: str, mark: Mark | None = None) -> None:
        """Set (or with None, drop) a session's row."""
        old = self.rows.get(session_id)
        if old is not None:
            self._unorder(old)
            self._disown(old)
        if meta is None:
            self.rows.pop(session_id, None)
            self.marks.pop(session_id, None)
            return
        self.rows[session_id] = meta
        self._order.add(meta)
        self._own(meta)
        if mark is not None:
            self.marks[session_id] = mark

    def apply(self, session_id: str, record: Record, end: int) -> None:
        """Fold one record of a session into its row."""
        if type(record.event) is MessageProgress:  # the hot path: no row change (see apply_meta)
            mark = self.marks.get(session_id)
            if mark is not None:
                mark.seq = record.seq
                mark.end = end
                return
        old = self.rows.get(session_id)
        new = apply_meta(old, record)
        mark = self.marks.get(session_id)
        if mark is None:
            mark = self.marks[session_id] = Mark()
        mark.seq = record.seq
        mark.end = end
        if new is old:
            return
        mark.meta_seq = record.seq
        if old is not None:
            self._unorder(old)
            self._disown(old)
        if new is None:
            del self.rows[session_id]
            return
        self.rows[session_id] = new
        self._order.add(new)
        self._own(new)

    def _unorder(self, meta: SessionMeta) -> None:
        """Take a row out of the order index: that very object (rows that sort
        as equals, the same time and id, can differ in other fields: a
        session folder copied under another name and migrated)."""
        order = self._order
        i = order.bisect_left(meta)
        while order[i] is not meta:
            i += 1
        del order[i]

    def _own(self, meta: SessionMeta) -> None:
        self.owned[meta.owner] += 1
        self.archived += meta.archived

    def _disown(self, meta: SessionMeta) -> None:
        self.archived -= meta.archived
        self.owned[meta.owner] -= 1
        if not self.owned[meta.owner]:
            del self.owned[meta.owner]

    def select(self, *, filters: dict[str, Any] | None = None, include_archived: bool = False,
               archived: bool | None = None, offset: int = 0, limit: int | None = None,
               owner: str | None = None) -> tuple[list[SessionMeta], int]:
        """Rows newest first: archived hidden unless include_archived, only
        archived ones with archived=True; equality filters; only `owner`'s
        rows unless it is None; then offset/limit. Returns (rows, total
        matching before offset/limit)."""
        filters = filters or {}
        for key in filters:
            if key not in FILTERABLE:
                raise InvalidFilter(f"cannot filter on {key!r}; filterable: {sorted(FILTERABLE)}")
        if offset < 0 or (limit is not None and limit < 0):
            raise InvalidFilter("offset and limit must not be negative")
        items = [m for m in self._order
                 if (owner is None or m.owner == owner)
                 and (m.archived if archived is True else (include_archived or not m.archived))
                 and (archived is not False or not m.archived)
                 and all(getattr(m, k) == v for k, v in filters.items())]
        total = len(items)
        end = None if limit is None else offset + limit
        return items[offset:end], total

    def check(self) -> None:
        """Invariants: the order index holds exactly the rows, sorted by updated_at."""
        assert len(self._order) == len(self.rows), (len(self._order), len(self.rows))
        ordered = list(self._order)
        assert ordered == sorted(self.rows.values(), key=lambda m: (-m.updated_at, m.id)), "order index out of sort"
        for sid, meta in self.rows.items():
            assert meta.id == sid, (sid, meta.id)
        assert self.owned == Counter(m.owner for m in self.rows.values()), "owner counts out of step"
        assert self.archived == sum(m.archived for m in self.rows.values()), "archived count out of step"
