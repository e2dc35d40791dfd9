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
Not in the contract: opening and reopening (the local engine's start reads
its files itself, server/local/; a worker's replays its stream,
server/scaleout/), and what a store keeps beside its log (its checkpoints
and reads: server/domain/keeping.py's Keeper, one per backend).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from .errors import CorruptRecord, StoreBroken, StoreClosed, TornTail
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
# An item of append_progress refused: (its index, its records appended, the error).
Failed = tuple[int, int, BaseException]


class EventLog(Protocol):
    listeners: list[RecordListener]
    append_listeners: list[Callable[[str], None]]  # (session id) after an append's records were told
    # (records, perf_counter() of the batch's first record, perf_counter() when durable): metrics, bench/
    batch_listeners: list[Callable[[int, float, float], None]]
    reset_listeners: list[Callable[[str, list[Record], int], None]]
    failure_listeners: list[Callable[[BaseException], None]]
    quarantined: set[str]  # sessions read-only for damage (kept as it changes: a scrape counts it)

    def __contains__(self, session_id: str) -> bool: ...
    def session_ids(self) -> list[str]: ...
    def last_seq(self, session_id: str) -> int: ...
    def durable_seq(self, session_id: str) -> int: ...
    def written_seq(self, session_id: str) -> int: ...  # the last seq in the log's own file (or stream)
    def durable_end(self, session_id: str) -> int: ...  # the byte offset past the durable records
    def unwritten(self, session_id: str) -> bytes: ...  # acknowledged lines only a journal holds
    def quarantine(self, session_id: str, corrupt: CorruptRecord) -> None: ...
    def corruption(self, session_id: str) -> CorruptRecord | None: ...
    @property
    def broken(self) -> BaseException | None: ...
    @property
    def bytes_appended(self) -> int: ...
    def statistics(self) -> CommitStatistics: ...

    async def create(self, session_id: str, events: Sequence[Event]) -> list[Appended]: ...
    async def append_many(self, session_id: str, events: Sequence[Event]) -> list[Appended]: ...
    def append_nowait(self, session_id: str, event: Event) -> Appended: ...
    # append_nowait for many sessions' records at once (the saver's tick):
    # an item refused stops there and is returned, the others go on.
    def append_progress(self, items: Sequence[tuple[str, Sequence[Event]]]) -> list[Failed]: ...
    def wait_durable(self, session_id: str, seq: int) -> Awaitable[int]: ...  # (awaitable made at the call)
    async def flush(self, session_id: str | None = None) -> None: ...
    async def read(self, session_id: str, after_seq: int = 0) -> list[Record]: ...
    # the session's acknowledged lines, as its log file holds them (`flush` first for the latest)
    async def log_bytes(self, session_id: str) -> bytes: ...
    async def remove(self, session_id: str) -> None: ...


class ProjectLog(Protocol):
    """The project registry's log. `catch_up` returns the records not yet
    returned (its first call: all of them); `append` is durable on return
    and, when several writers share the log (workers on a shared stream),
    raises ProjectsMoved if another appended since this one caught up; their
    records reach `listeners` once each, in order. A log with one writer
    (the local engine's) never tells its listeners. `torn` (a torn last line
    cut at load), `damage` (the log read-only before its end) and `broken`
    (a failed write: every later append raises StoreBroken) are None where
    they cannot happen."""
    listeners: list[Callable[[list[Record]], None]]
    torn: TornTail | None
    damage: CorruptRecord | None
    broken: OSError | None

    async def catch_up(self) -> list[Record]: ...
    async def append(self, event: Event) -> Record: ...


def append_each(log: EventLog, items: Sequence[tuple[str, Sequence[Event]]]) -> list[Failed]:
    """append_progress as one append_nowait per record (a backend without a
    batch path of its own): StoreBroken and StoreClosed raise."""
    failed: list[Failed] = []
    for i, (session_id, events) in enumerate(items):
        for k, ev in enumerate(events):
            try:
                log.append_nowait(session_id, ev)
            except (StoreBroken, StoreClosed):
                raise
            except Exception as e:
                failed.append((i, k, e))
                break
    return failed
