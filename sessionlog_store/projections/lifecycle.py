"""The message lifecycle, read as a spec: status -> statuses it may move to next.

pending = id assigned, work not started; running = producing output; done,
error and aborted are terminal. A step not in this table is illegal: the
service raises IllegalTransition and appends nothing; a fold that meets one
in a log (which the service never writes) ignores it.
"""
from __future__ import annotations

from typing import Final

from sessionlog_store.eventstore.events import Status

MESSAGE_TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    "pending": frozenset({"running", "done", "error", "aborted"}),
    "running": frozenset({"done", "error", "aborted"}),
    "done": frozenset(),
    "error": frozenset(),
    "aborted": frozenset(),
}

OPEN_STATUSES: Final = frozenset({"pending", "running"})
TERMINAL_STATUSES: Final = frozenset({"done", "error", "aborted"})


class IllegalTransition(ValueError):
    """A caller asked a message to move where the lifecycle table forbids;
    nothing was changed."""


def can_move(current: Status | str, new: Status | str) -> bool:
    return new in MESSAGE_TRANSITIONS.get(current, frozenset())


def check_move(msg_id: str, current: str, new: str) -> None:
    if not can_move(current, new):
        raise IllegalTransition(f"message {msg_id} can't move from {current!r} to {new!r}")
