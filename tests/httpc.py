"""A small HTTP/1.1 client for the tests, on h11 over a real socket: one
connection, any number of requests on it (keep-alive), answers read whole."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import h11
import trio


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class HttpClient:
    def __init__(self, port: int, token: str | None = None, host: str | None = None) -> None:
        self.port, self.token = port, token
        self.host = host or f"127.0.0.1:{port}"
        self.stream: trio.SocketStream | None = None
        self.conn = h11.Connection(h11.CLIENT)
        self.connections = 0  # connections opened (a kept-alive one is reused)

    async def request(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
                      raw: bytes | None = None) -> Answer:
        if self.stream is None or self.conn.our_state is not h11.IDLE:
            await self.close()
            self.stream = await trio.open_tcp_stream("127.0.0.1", self.port)
            self.conn = h11.Connection(h11.CLIENT)
            self.connections += 1
        data = raw if raw is not None else b"" if body is None else json.dumps(body).encode()
        fields = {"Host": self.host, **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
                  **({"Content-Type": "application/json"} if data else {}), "Content-Length": str(len(data)),
                  **(headers or {})}
        out = self.conn.send(h11.Request(method=method, target=path, headers=list(fields.items())))
        out += self.conn.send(h11.Data(data=data)) if data else b""
        out += self.conn.send(h11.EndOfMessage())
        await self.stream.send_all(out)
        status, got, parts = 0, {}, []
        with trio.fail_after(30):
            while True:
                event = self.conn.next_event()
                if event is h11.NEED_DATA:
                    self.conn.receive_data(await self.stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                    got = {k.decode().lower(): v.decode("latin-1") for k, v in event.headers}
                elif isinstance(event, h11.Data):
                    parts.append(bytes(event.data))
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    break
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
        return Answer(status, got, b"".join(parts))

    async def close(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
