"""A Python client of sessionlog's HTTP API (docs/API.md), on httpx and
anyio: one code base under asyncio and under trio.

    async with Client("http://127.0.0.1:8765", token) as sl:
        session = await sl.create_session(title="demo")
        async with sl.reply(session.id) as reply:   # a producer
            reply.write("Hello")
        async for chunk in sl.read_message(session.id, reply.reply_id):
            print(chunk.text, end="")

Install with `pip install 'sessionlog-store[client]'`."""
from __future__ import annotations

try:
    import anyio  # noqa: F401
    import httpx  # noqa: F401
except ImportError as e:  # (the extra not installed)
    raise ImportError("sessionlog_store.client needs httpx: pip install 'sessionlog-store[client]'") from e

from sessionlog_store.client.errors import ApiError, ReplyStopped
from sessionlog_store.client.producer import Reply
from sessionlog_store.client.reading import Chunk
from sessionlog_store.client.sessions import Client

__all__ = ["ApiError", "Chunk", "Client", "Reply", "ReplyStopped"]
