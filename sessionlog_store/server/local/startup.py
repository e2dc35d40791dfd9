"""What a store on the local engine does when it opens: recovery (the registry from index.json and
the logs' tails), the abort sweep (nothing left `running` whose writer is
gone), the spec's maintenance, one summary line; and, afterwards, the
background check of the log prefixes the checkpoint let recovery skip.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from sessionlog_store.eventstore.events import Event, MessageFinalized, SessionFlags
from sessionlog_store.projections.maintenance import MaintenancePlan, plan_maintenance
from sessionlog_store.projections.recovery import check_prefix, recover_registry
from sessionlog_store.server.gc_policy import gc_paused

if TYPE_CHECKING:
    from sessionlog_store.eventstore.errors import CorruptRecord
    from sessionlog_store.eventstore.local.commit import EventStore
    from sessionlog_store.eventstore.local.fsio import FileOps
    from sessionlog_store.eventstore.backend import Appended, ProjectLog
    from sessionlog_store.projections.recovery import RecoveryReport
    from sessionlog_store.projections.registry import Registry
    from sessionlog_store.server.config import StoreConfig
    from sessionlog_store.server.domain.projects import ProjectRegistry
    from sessionlog_store.server.local.caches import Caches

log = logging.getLogger("sessionlog.store")


class Starting(Protocol):
    """What a start does its work through: the store being opened."""
    registry: Registry
    projects: ProjectRegistry
    recovery: RecoveryReport | None
    aborted_at_start: list[tuple[str, str]]
    removed_at_start: list[tuple[str, str]]

    async def append_events(self, session_id: str, *events: Event) -> list[Appended]: ...
    async def delete_session(self, session_id: str) -> bool: ...


async def recover(fs: FileOps, root: str) -> tuple[Registry, dict[str, CorruptRecord], RecoveryReport]:
    """The registry from index.json and the logs' tails (the first step of a
    start, before the store is made around it)."""
    def replay() -> tuple[Registry, dict[str, CorruptRecord], RecoveryReport]:
        with gc_paused():
            return recover_registry(fs, root)
    return await trio.to_thread.run_sync(replay)


async def start(store: Starting, config: StoreConfig, es: EventStore, caches: Caches, check: PrefixCheck,
                projects: ProjectLog, damaged: dict[str, CorruptRecord], report: RecoveryReport) -> None:
    """With the registry recovered: register the logs, load the projects,
    abort what was left running, run maintenance, write index.json and log
    one summary line."""
    registry = store.registry
    report.journal = es.journal_recovery  # applied when the event store opened
    store.recovery = report
    for sid, mark in registry.marks.items():
        es.register(sid, mark.seq, mark.end, damaged.get(sid))
    if config.check_after_start:
        check.unchecked = dict.fromkeys(report.tail_replayed)
    await store.projects.load(projects)
    said: list[tuple[int, str, list[Any]]] = [
        (logging.WARNING, "%s", report.torn),
        (logging.ERROR, "%s: session quarantined (read-only) until `sessionlog repair`", report.quarantined),
        (logging.INFO, "finished the interrupted deletion of session %s", report.unfinished_deletions),
        (logging.INFO, "removed the interrupted creation of session %s (it was never acknowledged)",
         report.unfinished_creations),
        (logging.WARNING, "orphan folder: %s", report.orphans),
        (logging.INFO, "removed a left-over file: %s", report.temp_files),
        (logging.WARNING, "%s", report.journal.notes)]
    for level, fmt, items in said:
        for item in items:
            log.log(level, fmt, item)
    if store.projects.torn is not None:
        log.warning("%s", store.projects.torn)
    if store.projects.damage is not None:
        log.error("%s: the project log is read-only (projects up to the damage are served) until "
                  "`sessionlog repair projects`", store.projects.damage)
    # The abort sweep: nothing is running whose writer is gone. A session is
    # checked (the part of its log the checkpoint let recovery skip) before it
    # is written to; one found damaged is left alone.
    for sid, meta in list(registry.rows.items()):
        if meta.open_msgs and await check.writable(sid):
            events: list[Event] = [MessageFinalized(msg_id=m, status="aborted", aborted_reason="worker restart")
                                   for m in meta.open_msgs]
            await store.append_events(sid, *events)
            store.aborted_at_start += [(sid, m) for m in meta.open_msgs]
    # Maintenance in the spec's order, over the healthy sessions (what
    # `sessionlog maintenance --dry-run` plans too).
    healthy = [m for sid, m in store.registry.rows.items() if es.corruption(sid) is None]
    plan = plan_maintenance(healthy, time.time(), config.maintenance)
    done = MaintenancePlan()
    for sid in plan.to_idle:
        if await check.writable(sid):
            await store.append_events(sid, SessionFlags(status="idle", unread=True))  # (a reply ended: news)
            done.to_idle.append(sid)
    kinds = {"empty shell": done.empty_shells, "archive expired": done.expired_archives,
             "over capacity": done.over_capacity}
    for sid, why in plan.removals():
        if await check.writable(sid):
            await store.delete_session(sid)
            store.removed_at_start.append((sid, why))
            kinds[why].append(sid)
            log.debug("removed session %s at startup: %s", sid, why)
    log.info("%s", done.summary(len(store.aborted_at_start)))
    await caches.write(caches.write_index)
    r = report
    log.info("started: %d sessions, %d records replayed (%d full replays, %d tails), %d torn tails, "
             "%d quarantined, %d records written back from the journal, %d removed by maintenance, "
             "%d replies aborted, in %.2f s", len(store.registry), r.records, r.full_replays, r.tail_replays,
             len(r.torn), len(r.quarantined), r.journal.records, len(store.removed_at_start),
             len(store.aborted_at_start), r.seconds)


class PrefixCheck:
    """The background check: read the part of each log that startup skipped
    (before its checkpoint offset) and quarantine a session damaged there, as
    a full replay would have. A session written to before the check reaches
    it is checked first (`ensure`), so no write is acknowledged into a log
    with damage."""

    def __init__(self, es: EventStore, fs: FileOps, root: str,
                 quarantine: Callable[[str, CorruptRecord], None]) -> None:
        self.es, self.fs, self.root, self.quarantine = es, fs, root, quarantine
        self.unchecked: dict[str, None] = {}   # sessions whose skipped log prefix is not checked yet
        self._checking: dict[str, trio.Event] = {}
        self.done = trio.Event()    # every skipped prefix is checked

    @property
    def pending(self) -> bool:
        return bool(self.unchecked or self._checking)

    async def writable(self, sid: str) -> bool:
        """Checked, and not found damaged."""
        if sid not in self.es:
            return False
        await self.ensure(sid)
        return self.es.corruption(sid) is None

    async def check_all(self) -> int:
        """Returns how many sessions were quarantined."""
        found = 0
        while self.unchecked:
            found += await self.ensure(next(iter(self.unchecked)))
        return found

    async def ensure(self, sid: str) -> int:
        pending = self._checking.get(sid)
        if pending is not None:
            await pending.wait()
            return 0
        if sid not in self.unchecked:
            return 0
        del self.unchecked[sid]
        done = self._checking[sid] = trio.Event()
        try:
            return await self._check_one(sid)
        finally:
            del self._checking[sid]
            done.set()

    async def _check_one(self, sid: str) -> int:
        es = self.es
        if sid not in es or es.corruption(sid) is not None:
            return 0
        end = es.durable_end(sid)
        try:
            corrupt = await trio.to_thread.run_sync(check_prefix, self.fs, self.root, sid, end)
        except FileNotFoundError:
            return 0  # deleted meanwhile
        if corrupt is None or sid not in es:
            return 0
        self.quarantine(sid, corrupt)
        log.error("%s: found by the check after startup; session quarantined (read-only) "
                  "until `sessionlog repair`", corrupt)
        return 1

    async def run(self) -> None:
        try:
            await self.check_all()
        finally:
            self.done.set()
