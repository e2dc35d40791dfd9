"""Requests between workers on a shared stream, by core NATS request/reply
on `<prefix>-control.stop` (outside the stream's subjects: nothing is
stored, nothing is refused): a stop sent to the worker that streams the
reply (server/scaleout/worker.py). That worker ends its producer, which
writes the reply's finalize itself: the reply's one writer stays its one
writer, however often it writes (a finalize written by the asking worker
can be refused by the fence for as long as the streaming worker writes
back to back). A request that no worker answers (the streaming worker died,
or is cut off) is False: the asker writes the finalize itself.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

if TYPE_CHECKING:
    from .streamlog import JetStreamLog

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(tuple[str, str])
STOPPED: Final = b"stopped"


class StopRequests:
    def __init__(self, log: JetStreamLog) -> None:
        self.log = log
        self.subject = f"{log.prefix}-control.stop"
        self._sub: Any = None

    async def serve(self, on_stop: Callable[[str, str], bool]) -> None:
        """Answer the stop requests of replies `on_stop` ends (it runs on
        the trio thread: True if a producer of that reply ran here)."""
        token, nc = trio.lowlevel.current_trio_token(), self.log.js._nc

        async def on_request(msg: Any) -> None:
            try:
                session_id, msg_id = _DECODER.decode(msg.data)
            except msgspec.DecodeError:
                return  # not ours to answer
            loop = asyncio.get_running_loop()
            done: asyncio.Future[bool] = loop.create_future()

            def on_trio() -> None:
                try:
                    stopped = on_stop(session_id, msg_id)
                except Exception:  # noqa: BLE001 - not stopped here: the asker writes the finalize
                    stopped = False
                loop.call_soon_threadsafe(done.set_result, stopped)
            token.run_sync_soon(on_trio)
            if await done:
                await msg.respond(STOPPED)
        self._sub = await self.log.bridge.run(lambda: nc.subscribe(self.subject, cb=on_request))

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await self.log.bridge.run(sub.unsubscribe)
            except Exception:  # noqa: BLE001 - a connection already lost: nothing to unsubscribe
                pass

    async def request(self, session_id: str, msg_id: str, timeout: float = 2.0) -> bool:
        """Ask the worker that streams the reply to stop it; True once one did."""
        nc, data = self.log.js._nc, _ENCODER.encode((session_id, msg_id))

        async def ask() -> bool:
            import nats.errors
            try:
                return bool((await nc.request(self.subject, data, timeout=timeout)).data == STOPPED)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError, asyncio.TimeoutError):
                return False
        return await self.log.bridge.run(ask)
