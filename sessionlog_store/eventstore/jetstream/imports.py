"""Putting a session's log onto the stream as it is (`sessionlog migrate`,
server/migrate.py): its records keep their seqs and times."""
from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..checksum import crc32
from ..errors import SessionExists
from ..record import scan
from .natsio import WRITER_HEADER, WRONG_LAST_SEQUENCE, publish_answered

if TYPE_CHECKING:
    from .streamlog import JetStreamLog

# A log goes on the stream in messages of at most this many bytes (the
# servers' max_payload is 1 MiB by default; a longer line goes alone).
IMPORT_CHUNK: Final = 512 * 1024


async def import_log(log: JetStreamLog, session_id: str, data: bytes, *, after: int = 0) -> None:
    """Put a session's log on the stream byte for byte (its records keep
    their seqs and times), as a new session: what `sessionlog migrate`
    does. In messages of whole lines up to IMPORT_CHUNK bytes, each fenced
    on the one before, each sent again while unanswered (its id makes a
    retry stored once); SessionExists if the stream has the session.
    `after`: the stream holds the first `after` bytes already (an
    interrupted import): the rest follows them."""
    log.check_open()
    subject, js, worker, retry_for = log.subject(session_id), log.js, log.worker, log.retry_for
    records = scan(session_id, data).records
    if not records:
        raise ValueError(f"session {session_id}: no record to import")
    fence = 0
    if after:
        fence = log.stream_seq(session_id)
    elif session_id in log:
        raise SessionExists(f"session {session_id!r} is on {subject} already")
    chunks, start = [], after
    while start < len(data):
        cut = data.rfind(b"\n", start, start + IMPORT_CHUNK) + 1 or data.index(b"\n", start) + 1
        chunks.append((start, data[start:cut]))
        start = cut
    tag = f"{crc32(data):08x}"

    async def put(fence: int) -> int:
        for offset, chunk in chunks:
            [ack] = await publish_answered(js, [(subject, chunk, {
                "Nats-Msg-Id": f"{session_id}:import:{tag}:{offset}",
                "Nats-Expected-Last-Subject-Sequence": str(fence), WRITER_HEADER: worker})],
                retry_for, log.retried)
            if isinstance(ack, BaseException):
                raise ack
            fence = ack.seq
        return fence
    try:
        last = await log.bridge.run(lambda: put(fence))
    except Exception as e:
        if getattr(e, "err_code", None) in WRONG_LAST_SEQUENCE:
            raise SessionExists(f"session {session_id!r} is on {subject} already") from None
        raise
    log.seed(session_id, records[-1].seq, len(data), last)
