"""The event log's contract: what the session store needs of a backend.

`EventStore` (local/commit.py: a JSONL log per session, group commit,
the write-ahead journal) is the reference implementation; `JetStreamLog`
(jetstream/streamlog.py, a replicated NATS JetStream stream) the second.
`tests/test_backend_contract.py` holds the semantics every backend must
pass, as one abstract test class to subclass per backend.

The semantics, in short:
- A session is created with its first records, durably (`create`); an id
  that exists is `SessionExists`.
- Each record gets the session's next `seq`, from 1, without gaps, in the
  order of the calls; `append_many` returns once its records are durable,
  `append_nowait` at once (the progress class), `wait_durable` waits for one.
- `listeners` see every record as it is appended, in seq order per session,
  before any await (the live projections).
- `read` returns the acknowledged records after a seq; `remove` forgets a
  session (after its tombstone is durable): it is then `UnknownSession`.
- Several writers (workers sharing a replicated log) may append to one
  session: the backend orders them, renumbering a writer's unacknowledged
  records after another's (a waiter's seq follows them), and tells
  `reset_listeners` the session's records as they now stand, since what the
  listeners saw of it is void; an empty list: another writer deleted it.
  The local log has one writer (its flock) and never calls them.
- A failed write or sync is fatal: `broken()` says why, every later write
  raises `StoreBroken`, `failure_listeners` are told once.
Not yet in the contract (the local store's startup reads its files itself:
domain/startup.py, projections/recovery.py): reopening, and tailing every
session from a position across processes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

from .errors import CorruptRecord
from .events import Event
from .record import Record


class Appended(NamedTuple):
    record: Record
    end: int  # byte offset just past this record in the session's log


class CommitStatistics(NamedTuple):
    batches: int
    records: int
    largest_batch: int
    files_synced: int
    waiting_appenders: int
    sync_mode: str
    log_syncs: int = 0          # journal rounds: logs synced, segments removed
    segments_removed: int = 0


RecordListener = Callable[[str, Record, int], None]  # (session id, record, its end in the session's log)


class EventLog(Protocol):
    listeners: list[RecordListener]
    reset_listeners: list[Callable[[str, list[Record], int], None]]
    failure_listeners: list[Callable[[BaseException], None]]
    quarantined: set[str]  # sessions read-only for damage (kept as it changes: a scrape counts it)

    def __contains__(self, session_id: str) -> bool: ...
    def session_ids(self) -> list[str]: ...
    def last_seq(self, session_id: str) -> int: ...
    def durable_seq(self, session_id: str) -> int: ...
    def corruption(self, session_id: str) -> CorruptRecord | None: ...
    @property
    def broken(self) -> BaseException | None: ...

    async def create(self, session_id: str, events: Sequence[Event]) -> list[Appended]: ...
    async def append_many(self, session_id: str, events: Sequence[Event]) -> list[Appended]: ...
    def append_nowait(self, session_id: str, event: Event) -> Appended: ...
    async def wait_durable(self, session_id: str, seq: int) -> int: ...
    async def flush(self) -> None: ...
    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]: ...
    async def remove(self, session_id: str) -> None: ...


class SharedProjectLog(Protocol):
    """The project registry's log when several writers share it (a worker's
    on a shared stream): `listeners` see every writer's records once each,
    in order; `append` is durable on return and raises ProjectsMoved if
    another writer appended since this one caught up."""
    listeners: list[Callable[[list[Record]], None]]

    async def catch_up(self) -> list[Record]: ...
    async def append(self, event: Event) -> Record: ...
