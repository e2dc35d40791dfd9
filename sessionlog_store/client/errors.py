"""What the client raises: the server's refusal as it said it."""
from __future__ import annotations

import httpx
import msgspec

from sessionlog_store.server.edge import apitypes as t


class ApiError(Exception):
    """The server refused a request: its status, its error code (docs/HTTP.md:
    errors) and message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


class ReplyStopped(Exception):
    """The reply ended while it was being produced (a user's Stop, or the
    producer timeout): `status` and `reason` as the server ended it."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(f"the reply ended {status}: {reason}")
        self.status, self.reason = status, reason


def refused(r: httpx.Response) -> ApiError:
    """The server's refusal as it said it (its JSON error), or the status."""
    try:
        detail = msgspec.json.decode(r.content, type=t.Error).error
        return ApiError(r.status_code, detail.code, detail.message)
    except msgspec.DecodeError:
        return ApiError(r.status_code, "http_error", r.text[:200] or r.reason_phrase)
