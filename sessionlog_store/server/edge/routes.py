"""A route of the HTTP API (api.py's table, openapi.py's document): its
method and path, its handler, and the msgspec types of its query, body and
answer."""
from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sessionlog_store.server.edge.operations import Operations


@dataclass(frozen=True)
class Call:
    """One request as a route sees it."""
    ops: Operations
    args: dict[str, str]   # the path's parameters
    query: Any             # the route's query type, decoded (None without one)
    body: Any              # the route's body type, decoded (None without one)


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str                 # with {parameters}, as the OpenAPI document shows it
    name: str                 # its operationId
    summary: str
    handler: Handler
    answer: Any               # its type (or a union of types); None: no body
    status: int = 200
    query: Any = None
    body: Any = None
    errors: tuple[int, ...] = (400, 401, 404)

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path) + "$")
