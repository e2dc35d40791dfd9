"""The message lifecycle, read as a spec: status -> statuses it may move to next.

pending = id assigned, work not started; running = producing output; done,
error and aborted are terminal. A step not in this table is illegal: the
service raises IllegalTransition and appends nothing; a fold that meets one
in a log (which the service never writes) ignores it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from sessionlog_store.eventstore.events import (MessageCreated, MessageFinalized, MessageProgress, SessionCreated,
                                                SessionFlags, Status)
from sessionlog_store.eventstore.record import Record

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


def lifecycle_problems(records: Iterable[Record]) -> list[str]:
    """What a session's records break of the lifecycle (what `verify`
    reports of a shared stream, where several writers append): anything of
    a message after its finalize (a progress, a second finalize), a
    progress or finalize of a message never made, and a session flagged
    `running` at its end with no message running."""
    problems: list[str] = []
    made: dict[str, str] = {}  # msg_id -> its status
    flagged = "idle"
    for r in records:
        ev = r.event
        if isinstance(ev, MessageCreated):
            made[ev.msg_id] = ev.status
        elif isinstance(ev, MessageProgress | MessageFinalized):
            status = made.get(ev.msg_id)
            what = "a progress" if isinstance(ev, MessageProgress) else "a finalize"
            if status is None:
                problems.append(f"seq {r.seq}: {what} of message {ev.msg_id}, never made")
            elif status in TERMINAL_STATUSES:
                problems.append(f"seq {r.seq}: {what} of message {ev.msg_id} after its finalize")
            elif isinstance(ev, MessageFinalized):
                made[ev.msg_id] = ev.status
        elif isinstance(ev, SessionFlags) and ev.status is not None:
            flagged = ev.status
        elif isinstance(ev, SessionCreated):
            flagged = "idle"
    if flagged == "running" and not any(s in OPEN_STATUSES for s in made.values()):
        problems.append("flagged running, with no message running")
    return problems
