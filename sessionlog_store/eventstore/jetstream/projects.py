"""The project log on a shared stream (issue 17): the records the local
`<root>/projects/log.jsonl` holds, as messages of the subject
`<prefix>._projects` (no session id starts with "_"), so that every worker
knows every project. Each append is fenced on the subject's last stream
sequence, as a session's are: of two workers appending at once one is
refused (`ProjectsMoved`), catches up with the subject and checks again
before it tries again (server/domain/projects.py). Other workers' appends
reach `listeners` through the log's tail; a record is taken once, whether
the tail or a catch-up brings it first.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from ..errors import CorruptRecord, ProjectsMoved, TornTail
from ..events import Event
from ..record import scan
from .natsio import DIRECT_GETS, WRITER_HEADER, WRONG_LAST_SEQUENCE, publish_answered, read_subject, unanswered
from ..record import Record, encode_record

if TYPE_CHECKING:
    from .streamlog import JetStreamLog

PROJECTS: Final = "_projects"  # the subject's last token
MOVED_POLL: Final = 0.05  # s between reads while a refusal's cause is not readable yet
# The longest wait for it (a leader election takes 4-9 s): a refusal that
# does not clear (the subject purged, the stream made again) is waited for
# once, then refused at once, so the registry's tries end in seconds.
MOVED_WAIT: Final = 15.0


class StreamProjectLog:
    def __init__(self, log: JetStreamLog) -> None:
        self.log = log
        self.subject = f"{log.prefix}.{PROJECTS}"
        self.seq = 0          # the last record's seq
        self.stream_seq = 0   # the stream sequence of the subject's last message (the fence)
        # Another worker's records (from the tail, in order).
        self.listeners: list[Callable[[list[Record]], None]] = []
        self.torn: TornTail | None = None        # (a stream has no torn line,
        self.damage: CorruptRecord | None = None  # no damage it would serve
        self.broken: OSError | None = None       # and no write that breaks it)
        # What the tail brings while a catch-up reads: returned by that
        # catch-up in order (told to the listeners, a later record would be
        # taken before the earlier ones the read brings).
        self._reading = 0
        self._held: list[tuple[bytes, int]] = []
        self._moved = trio.Event()  # set (and replaced) as this log learns of a newer message
        self.refused = 0  # appends the fence refused (a metric; tests wait on it)
        self._waited_out = -1  # a fence waited past in vain (never waited for again)
        self.waited_out = 0    # how many waits ended so (a metric)
        self.moved_wait = MOVED_WAIT
        log.subject_listeners[PROJECTS] = self._take

    async def catch_up(self) -> list[Record]:
        """The records of the project log this log has not seen yet (its
        first call: all of them), as the stream holds them now."""
        js, stream, subject, start = self.log.js, self.log.stream, self.subject, self.stream_seq + 1
        self._reading += 1
        try:
            data, last, _ = await self.log.bridge.run(lambda: read_subject(js, stream, subject, DIRECT_GETS, start))
        finally:
            self._reading -= 1
        records = self._new(data, last)
        held, self._held = self._held, []
        for more, stream_seq in held:
            records += self._new(more, stream_seq)
        return records

    def _new(self, data: bytes, stream_seq: int) -> list[Record]:
        """The records of `data` (read up to `stream_seq`) not seen yet."""
        if stream_seq <= self.stream_seq:
            return []
        self.stream_seq = stream_seq
        self._moved.set()
        self._moved = trio.Event()
        records = [r for r in scan("projects", data).records if r.seq > self.seq]
        if records:
            self.seq = records[-1].seq
        return records

    async def append(self, event: Event) -> Record:
        """Durable on return; ProjectsMoved if another worker appended first,
        once what it appended can be read (catch_up brings it)."""
        self.log.check_open()
        rec = Record(self.seq + 1, time.time(), event)
        line = encode_record(rec.seq, rec.ts, event)
        fence = self.stream_seq
        try:
            ack = await self._publish(line, f"{PROJECTS}:{self.log.worker}:{rec.seq}:{fence}", fence)
        except ProjectsMoved:
            await self._until_past(fence)
            raise
        self.seq, self.stream_seq = rec.seq, max(self.stream_seq, ack.seq)
        return rec

    async def _until_past(self, fence: int) -> None:
        """Until the subject holds a message past `fence`. The fence can
        refuse a write before the write that caused it can be read: another
        worker's, still being replicated (error 10164, answered at once);
        caught up at once, the retry was refused again, and a worker ran
        through its tries in milliseconds while a busy cluster replicated
        the other's (the CI's failure). Looked for on the tail and by a read,
        for at most MOVED_WAIT (then the caller catches up, as before)."""
        from nats.js.errors import NotFoundError
        self.refused += 1
        if fence == self._waited_out:
            return  # (waited for this fence once in vain: a refusal that does not clear, the caller's tries end)
        js, stream, subject = self.log.js, self.log.stream, self.subject

        async def readable() -> bool:  # (on the asyncio loop)
            try:
                await js.get_msg(stream, seq=fence + 1, subject=subject, next=True)
            except NotFoundError:
                return False
            except Exception as e:  # noqa: BLE001 - no answer now (a leader being elected): not yet
                if unanswered(e):
                    return False
                raise
            return True
        deadline = trio.current_time() + min(self.log.retry_for, self.moved_wait)
        while self.stream_seq <= fence:
            if await self.log.bridge.run(readable):
                return
            if trio.current_time() >= deadline:
                self._waited_out = fence
                self.waited_out += 1
                return
            with trio.move_on_after(MOVED_POLL):  # (the tail's word, or a read again)
                await self._moved.wait()

    async def _publish(self, data: bytes, msg_id: str, fence: int) -> Any:
        """One message, fenced on `fence`, sent again while unanswered (its
        id makes a retry stored once); ProjectsMoved if the fence refused it."""
        js, log = self.log.js, self.log
        headers = {"Nats-Msg-Id": msg_id, "Nats-Expected-Last-Subject-Sequence": str(fence),
                   WRITER_HEADER: log.worker}
        [ack] = await log.bridge.run(lambda: publish_answered(js, [(self.subject, data, headers)], log.retry_for,
                                                               log.retried))
        if isinstance(ack, BaseException):
            if getattr(ack, "err_code", None) in WRONG_LAST_SEQUENCE:
                raise ProjectsMoved()
            raise ack
        return ack

    async def raw(self) -> bytes:
        """The project log's lines as the stream holds them (as its file would)."""
        js, stream, subject = self.log.js, self.log.stream, self.subject
        data, _, _ = await self.log.bridge.run(lambda: read_subject(js, stream, subject, DIRECT_GETS))
        return data

    async def import_raw(self, data: bytes) -> None:
        """Put a local project log on the stream as it is (`sessionlog
        migrate`), in one message; ProjectsMoved if the stream has one."""
        await self._publish(data, f"{PROJECTS}:import:{len(data)}", 0)

    def _take(self, data: bytes, stream_seq: int) -> None:
        """Another worker's message (the tail, on the trio thread)."""
        if self._reading:
            self._held.append((data, stream_seq))
            return
        records = self._new(data, stream_seq)
        if records:
            for listener in self.listeners:
                listener(records)
