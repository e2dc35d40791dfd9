"""A small Python client of the WebSocket protocol, for scripts and tests.

    async with open_client("127.0.0.1", port, token) as c:
        ack = await c.request("chat", content="hello")
        await c.follow(ack["session_id"])        # load, subscribe to what runs, patch
        await c.wait_done(ack["session_id"], ack["reply_id"])
        print(c.content[(ack["session_id"], ack["reply_id"])])

`follow()` is the page's re-join: load the session, then subscribe to every
running message with the content it already has, and patch on each
`msg_update`, so a reconnecting client receives exactly what it is missing.
"""
from __future__ import annotations

import base64
import itertools
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, open_websocket

from sessionlog_store.server.edge.auth import PROTOCOL, TOKEN_SUBPROTOCOL

TERMINAL = frozenset({"done", "error", "aborted"})


class ServerError(Exception):
    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(f"{data.get('code')}: {data.get('message')}")
        self.code = data.get("code")
        self.data = data


class Client:
    def __init__(self, ws: WebSocketConnection, record: bool = False) -> None:
        self.ws = ws
        # Every frame received, as text, when recording (tests that check what reached a client).
        self.frames: list[str] | None = [] if record else None
        self._ids = itertools.count(1)
        self._waiting: dict[int, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.pushes: list[dict[str, Any]] = []       # every frame without a request_id
        self.content: dict[tuple[str, str], str] = {}
        self.status: dict[tuple[str, str], str] = {}
        self.duplicated_or_missing: list[tuple[str, str, int, int]] = []
        self._changed = trio.Event()

    async def _reader(self) -> None:
        try:
            while True:
                text = await self.ws.get_message()
                if self.frames is not None:
                    self.frames.append(str(text))
                frame = msgspec.json.decode(text)
                rid = frame.get("request_id")
                if rid in self._waiting and frame["type"] != "msg_update":
                    self._waiting.pop(rid).send_nowait(frame)
                    continue
                self.pushes.append(frame)
                if frame["type"] == "msg_update":
                    self._patch(frame["data"])
                self._changed.set()
                self._changed = trio.Event()
        except ConnectionClosed:
            pass

    def _patch(self, u: dict[str, Any]) -> None:
        key = (u["session_id"], u["msg_id"])
        have = self.content.get(key, "")
        if u["offset"] != len(have):
            self.duplicated_or_missing.append((*key, u["offset"], len(have)))
            have = have[: u["offset"]]
        self.content[key] = have + u["content_delta"]
        self.status[key] = u["status"]

    async def request(self, action: str, **fields: Any) -> dict[str, Any]:
        """Send one action and return its reply's data (raises ServerError)."""
        rid = next(self._ids)
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[rid] = send
        await self.ws.send_message(msgspec.json.encode({"action": action, "request_id": rid, **fields}).decode())
        with trio.fail_after(30):
            frame = await recv.receive()
        if frame["type"] == "error":
            raise ServerError(frame["data"])
        return frame["data"]

    async def follow(self, session_id: str) -> dict[str, Any]:
        """Load a session and subscribe to each running message with what we have."""
        loaded = await self.request("load_session", session_id=session_id)
        for m in loaded["messages"]:
            key = (session_id, m["msg_id"])
            have = self.content.get(key)
            if have is None or len(have) > len(m["content"]):
                self.content[key] = have = m["content"]
            self.status[key] = m["status"]
            if m["status"] in ("pending", "running"):
                await self.request("subscribe_msg", session_id=session_id, msg_id=m["msg_id"], offset=len(have))
        return loaded

    async def wait_done(self, session_id: str, msg_id: str) -> str:
        """Wait for the message's terminal status; returns it."""
        key = (session_id, msg_id)
        while self.status.get(key) not in TERMINAL:
            await self._changed.wait()
        return self.status[key]

    async def wait_for(self, predicate: Any) -> dict[str, Any]:
        """Wait for a push matching predicate(frame)."""
        seen = 0
        while True:
            for frame in self.pushes[seen:]:
                if predicate(frame):
                    return frame
            seen = len(self.pushes)
            await self._changed.wait()


@asynccontextmanager
async def open_client(host: str, port: int, token: str, *, origin: str | None = None,
                      ssl_context: ssl.SSLContext | None = None, root_path: str = "",
                      record: bool = False) -> AsyncIterator[Client]:
    """A client of `host:port` (`ssl_context`: over TLS, wss://; `root_path`:
    the server is reached under that prefix, e.g. behind a proxy; `record`:
    keep every frame received in `frames`)."""
    headers = [(b"Origin", origin.encode())] if origin else None
    # the token in its subprotocol, as the page sends it: never in a URL (a
    # proxy's access log keeps those); edge/auth.py
    sent = base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")
    async with open_websocket(host, port, f"{root_path.rstrip('/')}/ws",
                              use_ssl=ssl_context if ssl_context is not None else False,
                              subprotocols=[PROTOCOL, TOKEN_SUBPROTOCOL + sent], extra_headers=headers) as ws:
        client = Client(ws, record)
        async with trio.open_nursery() as n:
            n.start_soon(client._reader)
            try:
                yield client
            finally:
                n.cancel_scope.cancel()
