"""The stream's caches on the NATS servers (issue 17): an object bucket
`<stream>-cache` beside the stream, replicated as it is, holding what a
worker's start reads instead of replaying the whole stream (the registry
checkpoint, projections/stream_fold.py). A cache: deleting the bucket loses
nothing, a start then replays the stream. Objects are chunked by the
servers' object store (any size); each carries, in its description, the
stream sequence it is as of, so that a writer need not replace a newer one.

Also what a start checks a checkpoint against (`stream_facts`): the
stream's birth, its last sequence, the sessions that still have messages.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from .natsio import DIRECT_GETS, read_subject, until_led

if TYPE_CHECKING:
    from .streamlog import JetStreamLog

# The servers answer a stream's subjects in one reply up to this many
# (JSMaxSubjectDetails); past it the list is not whole.
MAX_SUBJECT_DETAILS: Final = 100_000


def _description(position: int) -> str:
    return f"as of stream sequence {position}"


def _position(description: str | None) -> int:
    try:
        return int((description or "").rsplit(" ", 1)[-1])
    except ValueError:
        return 0


class StreamObjects:
    """Use `await StreamObjects.open(log)`."""

    def __init__(self, log: JetStreamLog, store: Any) -> None:
        self.log, self._store = log, store
        self.bucket = f"{log.stream}-cache"
        self.replace = False  # the stored checkpoint was found unusable: the next put replaces it

    @classmethod
    async def open(cls, log: JetStreamLog, *, replicas: int = 3) -> StreamObjects:
        from nats.js.api import ObjectStoreConfig
        js, bucket = log.js, f"{log.stream}-cache"
        store = await log.bridge.run(lambda: until_led(js, f"OBJ_{bucket}", lambda: js.create_object_store(
            bucket, config=ObjectStoreConfig(replicas=replicas, description="sessionlog caches (deletable)"))))
        return cls(log, store)

    async def get(self, name: str) -> tuple[bytes, int] | None:
        """The object's bytes and the stream sequence they are as of, or None."""
        store = self._store

        async def get() -> tuple[bytes, int] | None:
            from nats.js.errors import ObjectNotFoundError
            try:
                got = await store.get(name)
            except ObjectNotFoundError:
                return None
            return bytes(got.data or b""), _position(got.info.description)
        return await self.log.bridge.run(get)

    async def position(self, name: str) -> int:
        """The stream sequence the stored object is as of (0: none)."""
        store = self._store

        async def info() -> int:
            from nats.js.errors import ObjectNotFoundError
            try:
                return _position((await store.get_info(name)).description)
            except ObjectNotFoundError:
                return 0
        return await self.log.bridge.run(info)

    async def put(self, name: str, data: bytes, position: int, *, replace: bool = False) -> bool:
        """Store `data` as of stream sequence `position`, unless the stored
        one is as new (another worker's) and not to be `replace`d (found
        unusable). Returns whether it was stored."""
        store = self._store
        if not replace and await self.position(name) >= position:
            return False

        async def put() -> None:
            from nats.js.api import ObjectMeta
            await store.put(name, data, meta=ObjectMeta(name=name, description=_description(position)))
        await self.log.bridge.run(put)
        return True

    async def delete(self, name: str) -> None:
        store = self._store

        async def delete() -> None:
            from nats.js.errors import NotFoundError, ObjectNotFoundError
            try:
                await store.delete(name)
            except (ObjectNotFoundError, NotFoundError):
                pass
        await self.log.bridge.run(delete)


class StreamFacts(msgspec.Struct):
    """What a start checks a checkpoint against."""
    created: str              # when the stream was made (a stream made again restarts its sequences)
    last_seq: int             # the stream sequence of its last message
    live: set[str] | None     # the ids of the sessions with messages now (None: more than one answer lists)


async def stream_facts(log: JetStreamLog) -> StreamFacts:
    js, stream, prefix = log.js, log.stream, log.prefix

    async def info() -> Any:
        return await js.stream_info(stream, subjects_filter=f"{prefix}.>")
    got = await log.bridge.run(info)
    found = got.state.subjects or {}
    live = None if len(found) >= MAX_SUBJECT_DETAILS else {subject[len(prefix) + 1:] for subject in found}
    return StreamFacts(str(got.created or ""), int(got.state.last_seq or 0), live)


async def subject_from(log: JetStreamLog, session_id: str, start: int) -> tuple[bytes, list[tuple[int, int]]]:
    """A session's messages from stream sequence `start` on, joined, and
    each one's (stream sequence, offset just past it there)."""
    js, stream, subject = log.js, log.stream, log.subject(session_id)
    data, _, marks = await log.bridge.run(lambda: read_subject(js, stream, subject, DIRECT_GETS, start))
    return data, marks


async def first_stream_seq(log: JetStreamLog, session_id: str) -> int:
    """The stream sequence of the session's first message (0: none)."""
    js, stream, subject = log.js, log.stream, log.subject(session_id)

    async def first() -> int:
        from nats.js.errors import NotFoundError
        try:
            return int((await js.get_msg(stream, seq=1, subject=subject, next=True)).seq)
        except NotFoundError:
            return 0
    return await log.bridge.run(first)
