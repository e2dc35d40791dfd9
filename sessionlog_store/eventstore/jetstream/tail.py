"""A JetStream log's tail (streamlog.py): an ordered consumer of the log's
subjects, from now on or, for a start's replay, from the stream's first
message (or a checkpoint's sequence). Its messages cross from nats-py's
asyncio thread into trio in runs (one crossing for all that came while the
last one waited) and reach the log there, in stream order. It also says
when everything the stream held at a moment has been delivered
(`caught_up`: read-your-writes across workers)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import trio

from .natsio import WRITER_HEADER, AsyncioThread

# (subject, data, stream sequence, whether this log's writer wrote it)
Deliver = Callable[[str, bytes, int, bool], None]


def stream_seq(msg: Any) -> int:
    """A delivered message's stream sequence, read from its ack subject
    (`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.…`; with a domain
    and an account hash after `$JS.ACK` in the newer form, ADR-15). nats-py's
    `msg.metadata` decodes the whole subject into dataclasses, times
    included: a quarter of the tail's CPU a message (bench/README.md)."""
    tokens = msg.reply.split(".") if msg.reply else []
    if len(tokens) == 9 and tokens[1] == "ACK":
        return int(tokens[5])
    if len(tokens) >= 11 and tokens[1] == "ACK":
        return int(tokens[7])
    return int(msg.metadata.sequence.stream)  # (any other form: nats-py's reading, or its error)


class Tail:
    """Use `await Tail(...).start()` once; `deliver` runs on the trio thread.
    `own_data()`: whether this writer's own messages are wanted whole (else
    only their place: their data is known)."""

    def __init__(self, bridge: AsyncioThread, js: Any, stream: str, subjects: str, writer: str,
                 deliver: Deliver, own_data: Callable[[], bool]) -> None:
        self.bridge, self.js, self.stream, self.subjects, self.writer = bridge, js, stream, subjects, writer
        self._deliver, self._own_data = deliver, own_data
        self.position = 0  # the stream sequence of the last message delivered (on the trio thread)
        self._moved = trio.Event()  # set (and replaced) when the tail moves while a caught_up waits
        self._sub: Any = None

    def _delivered(self, subject: str, data: bytes, stream_seq: int, own: bool) -> None:
        self.position = max(self.position, stream_seq)
        self._deliver(subject, data, stream_seq, own)
        if self._moved.statistics().tasks_waiting:
            self._moved.set()
            self._moved = trio.Event()

    async def start(self, replay: bool = False, start: int = 0) -> int:
        """Tail the stream from now on; with `replay`, from its first message
        (or from stream sequence `start`), returning once every message there
        was at the start has been delivered (what a worker's start does: its
        registry from the stream, or from a checkpoint and then the stream).
        Returns how many messages the replay delivered."""
        token = trio.lowlevel.current_trio_token()
        js, writer, own_data = self.js, self.writer, self._own_data
        got = [0]  # messages the tail got (on the asyncio thread)
        queue: list[tuple[str, bytes, int, bool]] = []
        lock, scheduled = threading.Lock(), [False]

        def drain() -> None:
            with lock:
                items, queue[:], scheduled[0] = list(queue), [], False
            for item in items:
                self._delivered(*item)

        async def subscribe() -> Any:
            from nats.js.api import ConsumerConfig, DeliverPolicy

            async def on_message(msg: Any) -> None:
                got[0] += 1
                own = (msg.headers or {}).get(WRITER_HEADER) == writer
                data = b"" if own and not own_data() else msg.data or b""
                with lock:
                    queue.append((msg.subject, data, stream_seq(msg), own))
                    wake, scheduled[0] = not scheduled[0], True
                if wake:
                    token.run_sync_soon(drain)
            policy = DeliverPolicy.ALL if replay else DeliverPolicy.NEW
            config = None
            if replay and start > 1:
                config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start)
            return await js.subscribe(self.subjects, stream=self.stream, cb=on_message, ordered_consumer=True,
                                      **({"config": config} if config else {"deliver_policy": policy}))
        self._sub = sub = await self.bridge.run(subscribe)
        while replay:
            # Caught up: nothing left on the server for the consumer, and every
            # message it sent taken by on_message (the server's count of what
            # it delivered: a message purged meanwhile is in neither). Their
            # drain was queued before this crossing's own wake-up: all have
            # run when it returns.
            async def progress() -> tuple[int, int, int]:
                info = await sub.consumer_info()
                return int(info.num_pending or 0), int(info.delivered.consumer_seq or 0), got[0]
            pending, sent, n = await self.bridge.run(progress)
            if pending == 0 and n >= sent:
                return n
            await trio.sleep(0.02)
        return 0

    async def caught_up(self) -> None:
        """Return once every message the stream held when called has been
        delivered: the stream's last sequence, as its leader answers (the
        tail's consumer may sit on a follower that lags it), reached by the
        tail; or, after a wait, nothing pending for the consumer and all it
        sent delivered (the last messages were purged: never delivered)."""
        sub, js, stream = self._sub, self.js, self.stream
        assert sub is not None, "the tail has not started"
        target = int((await self.bridge.run(lambda: js.stream_info(stream))).state.last_seq or 0)
        while True:
            with trio.move_on_after(1.0):
                while self.position < target:
                    await self._moved.wait()
                return
            info = await self.bridge.run(sub.consumer_info)
            if int(info.num_pending or 0) == 0 and self.position >= int(info.delivered.stream_seq or 0):
                return
