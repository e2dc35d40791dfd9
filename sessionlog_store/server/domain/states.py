"""Loaded sessions: the message DAGs the store holds in memory (an LRU), and
the loads under way.

A session's state is loaded on demand (`SessionStore.load_session`: its
snapshot and its log's tail, or on a shared stream the stream's messages)
and kept current by the store's record listener. While a load reads, the
records appended meanwhile are buffered (`buffer`) and applied after, so a
load never misses one; two loads of one session share the first's read
(`begin` / `wait`). The LRU drops the least recently used states past the
cache's size, keeping those with a running message (their producers write
into them).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import trio

from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.session import SessionState


class LoadedStates:
    """The loaded states of a store's sessions (see the module's header)."""

    def __init__(self) -> None:
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._buffers: dict[str, list[tuple[Record, int]]] = {}
        self._done: dict[str, trio.Event] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, sid: str) -> bool:
        return sid in self._states

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def get(self, sid: str) -> SessionState | None:
        return self._states.get(sid)

    def touch(self, sid: str) -> SessionState | None:
        """The state, marked most recently used."""
        state = self._states.get(sid)
        if state is not None:
            self._states.move_to_end(sid)
        return state

    def put(self, sid: str, state: SessionState) -> None:
        self._states[sid] = state

    def drop(self, sid: str) -> SessionState | None:
        return self._states.pop(sid, None)

    def clear(self) -> None:
        self._states.clear()

    # -- loads under way ------------------------------------------------------

    def loading(self, sid: str) -> bool:
        return sid in self._buffers

    def buffer(self, sid: str) -> list[tuple[Record, int]] | None:
        """Where a record of a session being loaded goes meanwhile (None: not loading)."""
        return self._buffers.get(sid)

    def pending(self, sid: str) -> trio.Event | None:
        """The event a load under way sets when it ends."""
        return self._done.get(sid)

    def begin(self, sid: str) -> list[tuple[Record, int]]:
        self._done[sid] = trio.Event()
        buf = self._buffers[sid] = []
        return buf

    def end(self, sid: str) -> None:
        del self._buffers[sid]
        self._done.pop(sid).set()

    # -- the LRU --------------------------------------------------------------

    def evict(self, keep: int, spare: str | None = None) -> None:
        """Drop least recently used states past `keep`; states with running
        messages stay (moved to the back, so the front of the LRU keeps the
        candidates and a pass stays short), and `spare`'s (the session just
        loaded or made, for the caller that asked for it)."""
        states = self._states
        excess = len(states) - keep
        looked = 0
        while excess > 0 and looked < len(states):
            sid, st = next(iter(states.items()))
            looked += 1
            if (st.meta is not None and st.meta.open_msgs) or sid == spare:
                states.move_to_end(sid)
                if looked > excess + 64:
                    return  # mostly running sessions: try again on a later load
                continue
            del states[sid]
            excess -= 1
