"""Session ids: validated by a full-match pattern before any path is built."""
from __future__ import annotations

import re
import secrets
from typing import Final

from .errors import InvalidSessionId

# Letters, digits, '-' and '_', 1..64 characters, and not starting with '-' or
# '_' (so an id is never mistaken for a CLI flag or a hidden/temp file).
# No '.', '/', NUL or anything else that could reach outside a session's folder.
MAX_ID_LEN: Final = 64
ID_PATTERN: Final = f"[A-Za-z0-9][A-Za-z0-9_-]{{0,{MAX_ID_LEN - 1}}}"
_ID_RE: Final = re.compile(ID_PATTERN)


def validate_session_id(session_id: object) -> str:
    """Return `session_id` if it is a valid id, else raise InvalidSessionId."""
    if not isinstance(session_id, str) or _ID_RE.fullmatch(session_id) is None:
        shown = repr(session_id)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise InvalidSessionId(
            f"invalid session id {shown}: use 1-{MAX_ID_LEN} letters, digits, '-' or '_', "
            "starting with a letter or digit")
    return session_id


def new_session_id() -> str:
    """A fresh server-generated id (22 url-safe characters, 128 random bits)."""
    while True:
        sid = secrets.token_urlsafe(16)
        if sid[0].isalnum():
            return sid


def is_valid_session_id(name: str) -> bool:
    return _ID_RE.fullmatch(name) is not None
