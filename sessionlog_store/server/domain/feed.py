"""The registry's change feed: every `session_created`, `session_updated` and
`session_deleted` push gets a position, so a client that reconnects asks for
exactly what it missed (`list_sessions` with `since`) instead of re-listing.

A position is `"<epoch>:<rev>"`: `rev` counts changes since this process
started, `epoch` names the process (a random token per start), so a position
from before a restart, or older than the bounded history, is answered with
"re-list" rather than with a wrong patch. Pure: no I/O.
"""
from __future__ import annotations

import secrets
from collections import deque
from typing import Any, Final

# Changes kept for `since`: a client away for longer re-lists.
FEED_HISTORY: Final = 4096


class ChangeFeed:
    def __init__(self, history: int = FEED_HISTORY) -> None:
        self.epoch = secrets.token_hex(4)
        self.rev = 0
        # (rev, kind, data, the owner of the session it is about)
        self._log: deque[tuple[int, str, dict[str, Any], str]] = deque(maxlen=history)

    @property
    def position(self) -> str:
        return f"{self.epoch}:{self.rev}"

    def add(self, kind: str, data: dict[str, Any], owner: str = "") -> str:
        """Record one change of a session of `owner`; returns its position (also put in `data`)."""
        self.rev += 1
        data["rev"] = pos = f"{self.epoch}:{self.rev}"
        self._log.append((self.rev, kind, data, owner))
        return pos

    def since(self, position: str, owner: str | None = None, *,
              owners: bool = False) -> list[tuple[str, dict[str, Any]]] | None:
        """The changes after `position` (of `owner`'s sessions only, unless it is
        None), oldest first, or None when they are not all known (another epoch,
        a malformed position, or older than the history). With `owners`, each
        change (and a created session's row) says whose session it is about
        (copies: what was pushed stays as it was)."""
        epoch, _, rev_text = position.partition(":")
        if epoch != self.epoch or not (rev_text.isascii() and rev_text.isdigit()):
            return None
        rev = int(rev_text)
        if rev > self.rev:
            return None
        if rev == self.rev:
            return []
        if not self._log or self._log[0][0] > rev + 1:
            return None
        return [(kind, _with_owner(data, who) if owners else data) for r, kind, data, who in self._log
                if r > rev and (owner is None or who == owner)]


def _with_owner(data: dict[str, Any], owner: str) -> dict[str, Any]:
    out = {**data, "owner": owner}
    if isinstance(out.get("session"), dict):
        out["session"] = {**out["session"], "owner": owner}
    return out
