"""The service's errors. Each carries a stable `code` (docs/PROTOCOL.md lists
them) that the WebSocket layer sends back as is."""
from __future__ import annotations

from sessionlog_store.eventstore.errors import SessionlogError


class ServiceError(SessionlogError):
    """Base: `code` is stable and machine-readable, `message` is for people."""
    code = "internal"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class BadRequest(ServiceError):
    """The caller's input is wrong (unknown field, wrong type, bad path...)."""


class NotFound(ServiceError):
    """The caller named something that does not exist."""


class Conflict(ServiceError):
    """The request is well-formed but not allowed in the current state
    (a frozen project binding, a finished message)."""


def unknown_session(session_id: str) -> NotFound:
    """The one answer for a session that does not exist, or is someone else's
    (docs/SECURITY.md: no existence oracle)."""
    return NotFound("unknown_session", f"unknown session {session_id!r}")


def unknown_project(project_id: str) -> NotFound:
    """As unknown_session, for projects."""
    return NotFound("unknown_project", f"unknown project {project_id!r}")
