"""The client's entry point: sessions and messages over the HTTP API
(docs/HTTP.md), their answers decoded into the API's own types
(server/edge/apitypes.py: what the OpenAPI document is made from)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, TypeVar

import anyio
import msgspec

import httpx

from sessionlog_store.client.errors import refused
from sessionlog_store.client.producer import Reply
from sessionlog_store.client.reading import Chunk, read_stream
from sessionlog_store.server.edge import apitypes as t

A = TypeVar("A")
# What the client sends: the protocol's major version is the path (/v1/).
API: str = "/v1"


class Client:
    """One server, one credential (a bearer token). Use as `async with`."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0,
                 headers: dict[str, str] | None = None, http: httpx.AsyncClient | None = None) -> None:
        sent = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
        self.http = http or httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=sent, timeout=timeout)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, answer: type[A], body: Any = None,
                    params: dict[str, Any] | None = None) -> A:
        content = msgspec.json.encode(body) if body is not None else None
        r = await self.http.request(method, API + path, content=content, params=params,
                                    headers={"Content-Type": "application/json"} if content is not None else None)
        if r.status_code >= 400:
            raise refused(r)
        return msgspec.json.decode(r.content, type=answer) if r.content else None  # type: ignore[return-value]

    # -- sessions ------------------------------------------------------------

    async def list_sessions(self, **query: Any) -> t.SessionList:
        """`GET /v1/sessions` with its filters (`limit`, `offset`,
        `include_archived`, `status`, `project_id`, ...)."""
        return await self._call("GET", "/sessions", t.SessionList, params=_query(query))

    async def follow_sessions(self, *, interval: float = 1.0) -> AsyncIterator[t.Change]:
        """Every change to the session list from now on (created, updated,
        deleted), in order, asked for every `interval` seconds with `since`
        (a list that must be read again, `relist`, is told as one
        `session_updated` change per row)."""
        rev = (await self.list_sessions(limit=0)).rev
        while True:
            await anyio.sleep(interval)
            r = await self.http.get(API + "/sessions", params={"since": rev})
            if r.status_code >= 400:
                raise refused(r)
            answer = msgspec.json.decode(r.content, type=t.SessionChanges | t.SessionList)
            if isinstance(answer, t.SessionList):
                for row in answer.rows:
                    yield t.Change(type="session_updated", data=msgspec.to_builtins(row))
            else:
                for change in answer.changes:
                    yield change
            rev = answer.rev

    async def create_session(self, *, title: str = "", project_id: str | None = None,
                             agent_id: str = "default", source: str = "api") -> t.SessionRow:
        body = t.NewSession(title=title, project_id=project_id, agent_id=agent_id, source=source)
        return (await self._call("POST", "/sessions", t.SessionCreated, body)).session

    async def get_session(self, session_id: str) -> t.SessionLoaded:
        """The session's row, its messages on the current branch, its head."""
        return await self._call("GET", f"/sessions/{session_id}", t.SessionLoaded)

    async def update_session(self, session_id: str, **patch: Any) -> dict[str, Any]:
        """`title`, `archived`, `pinned`, `unread`, `project_id`: what changed."""
        return (await self._call("PATCH", f"/sessions/{session_id}", t.Changed, t.SessionPatch(**patch))).changed

    async def delete_session(self, session_id: str) -> None:
        await self._call("DELETE", f"/sessions/{session_id}", dict)

    # -- messages ------------------------------------------------------------

    async def add_message(self, session_id: str, content: str, *, role: str = "user",
                          metadata: dict[str, Any] | None = None) -> str:
        """Append a finished message under the head; its id."""
        body = t.NewMessage(content=content, role=role, metadata=metadata)  # type: ignore[arg-type]
        return (await self._call("POST", f"/sessions/{session_id}/messages", t.MessageAppended, body)).msg_id

    async def chat(self, content: str, *, session_id: str | None = None) -> t.ChatAck:
        """A user's message and the server's own agent's reply to it."""
        return await self._call("POST", "/chat", t.ChatAck, t.NewChat(content=content, session_id=session_id))

    async def stop(self, session_id: str, msg_id: str) -> None:
        """A user's Stop of a running reply (it ends `aborted`)."""
        await self._call("POST", f"/sessions/{session_id}/messages/{msg_id}/stop", dict)

    def read_message(self, session_id: str, msg_id: str, *, offset: str = "-1", live: bool = True,
                     mode: str = "sse") -> AsyncIterator[Chunk]:
        """A message's text from `offset` (its start; or a chunk's `offset`,
        to resume) as it is written, until it ends (the last chunk has its
        `status`), followed by SSE (`mode="long-poll"`: by long-poll). A cut
        connection is taken up again from the last offset read, with
        backoff: the caller sees one gapless text."""
        return read_stream(self.http, f"{API}/stream/sessions/{session_id}/messages/{msg_id}", offset=offset,
                           live=live, mode=mode)

    def reply(self, session_id: str, *, interval: float = 0.25, kind: str = "llm_reply",
              metadata: dict[str, Any] | None = None) -> Reply:
        """Produce a reply (`async with client.reply(sid) as r: r.write(...)`):
        see Reply."""
        return Reply(self.http, API, session_id, interval=interval, kind=kind, metadata=metadata or {})


def _query(query: dict[str, Any]) -> dict[str, str]:
    return {k: ("true" if v is True else "false" if v is False else str(v)) for k, v in query.items() if v is not None}
