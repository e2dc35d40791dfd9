"""Moving sessions between the local logs and a JetStream stream, and
checking a stream: `sessionlog migrate`, `verify --backend`, `rebuild
--backend` (docs/SCALEOUT.md).

A migration copies each session's log byte for byte (every record keeps its
seq and time) and reads it back to compare: a session is counted copied only
when the copy is identical. It is safe to run again: a session the target
holds already, identical, is skipped; one that differs is reported and left.
The project log is copied too, byte for byte, to a target that has none.
Deleted sessions (a tombstone last) are not copied; a damaged or torn log is
reported and not copied (repair it first). Running replies are copied as
they are: on a stream, a worker's sweeper aborts a running reply that no
worker holds a lease for; locally, the next start does.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from sessionlog_store.eventstore.events import MessageCreated, MessageFinalized, SessionCreated, SessionDeleted
from sessionlog_store.eventstore.local.fsio import FileOps
from sessionlog_store.eventstore.backend import RecordListener
from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog, open_jetstream_log
from sessionlog_store.eventstore.jetstream import imports
from sessionlog_store.eventstore.jetstream.natsio import default_prefix
from sessionlog_store.eventstore.local.journal import apply_journal
from sessionlog_store.eventstore.jetstream.leases import Leases, lease_key
from sessionlog_store.eventstore.record import Record
from sessionlog_store.eventstore.local.log import SESSIONS_DIR, list_session_ids, log_path, project_log_path, read_log, session_dir
from sessionlog_store.eventstore.record import scan
from sessionlog_store.eventstore.errors import ProjectsMoved, UnknownSession
from sessionlog_store.eventstore.jetstream.projects import StreamProjectLog
from sessionlog_store.projections.lifecycle import lifecycle_problems

Progress = Callable[[int, int], None]


@dataclass
class StreamTarget:
    """A stream to read or write: the servers, its name and subject prefix."""
    servers: tuple[str, ...]
    stream: str = "SESSIONLOG"
    replicas: int = 3

    @property
    def prefix(self) -> str:
        return default_prefix(self.stream)  # as a worker names its subjects

    def open(self, *, create: bool = True, listeners: Sequence[RecordListener] = ()) -> Any:
        """The stream replayed (every session known); made if missing with `create`."""
        return open_jetstream_log(list(self.servers), stream=self.stream, prefix=self.prefix,
                                  replicas=self.replicas, replay=True, create=create, listeners=listeners)


@dataclass
class MigrateReport:
    copied: int = 0
    records: int = 0
    already: int = 0              # identical in the target: skipped
    deleted: int = 0              # tombstoned in the source: not copied
    projects: int = 0             # the project log's records (copied, or there already)
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self, source: str, target: str) -> str:
        return (f"migrated {source} -> {target}: {self.copied} sessions copied ({self.records} records, each "
                f"read back identical), {self.already} already there, {self.deleted} with a tombstone left out, "
                f"{self.projects} project record(s), "
                f"{len(self.problems)} problem(s), in {self.seconds:.2f} s")


def _copyable(sid: str, data: bytes, report: MigrateReport) -> bytes | None:
    """The log's bytes to copy, or None (deleted, empty or damaged: told)."""
    s = scan(sid, data, expect_seq=1)
    if s.corrupt is not None:
        report.problems.append(f"{sid}: not copied: {s.corrupt} (repair it first)")
        return None
    if s.torn_bytes:
        report.problems.append(f"{sid}: not copied: a torn tail of {s.torn_bytes} bytes (start the store once, "
                               "or repair it)")
        return None
    if not s.records:
        report.problems.append(f"{sid}: not copied: an empty log")
        return None
    if isinstance(s.records[-1].event, SessionDeleted):
        report.deleted += 1
        return None
    return data


async def local_to_stream(fs: FileOps, root: str, target: StreamTarget,
                          progress: Progress | None = None) -> MigrateReport:
    """Copy every session of the store at `root` (its lock held by the caller)
    onto the stream."""
    t0 = time.monotonic()
    report = MigrateReport()
    await trio.to_thread.run_sync(apply_journal, fs, root)  # acknowledged records the journal alone holds
    ids = await trio.to_thread.run_sync(list_session_ids, fs, root)
    async with target.open() as log:
        for i, sid in enumerate(ids, 1):
            data = await trio.to_thread.run_sync(read_log, fs, root, sid)
            copy = _copyable(sid, data, report)
            if copy is not None:
                await _put(log, sid, copy, report)
            if progress is not None:
                progress(i, len(ids))
        path = project_log_path(root)
        if await trio.to_thread.run_sync(fs.exists, path):
            await _put_projects(log, await trio.to_thread.run_sync(fs.read_bytes, path), report)
    report.seconds = time.monotonic() - t0
    return report


async def _put_projects(log: JetStreamLog, data: bytes, report: MigrateReport) -> None:
    """The project log, byte for byte, onto a stream that has none."""
    s = scan("projects", data, expect_seq=1)
    if s.corrupt is not None or s.torn_bytes:
        report.problems.append("projects: not copied: the project log is damaged or torn (repair it first)")
        return
    projects = StreamProjectLog(log)
    have = await projects.raw()
    if not have and data:
        try:
            await projects.import_raw(data)
        except ProjectsMoved:
            pass  # (made meanwhile: compared below)
        have = await projects.raw()
    if have != data:
        report.problems.append("projects: not copied: the stream holds another project log")
    report.projects = len(s.records)


async def _put(log: JetStreamLog, sid: str, data: bytes, report: MigrateReport) -> None:
    try:
        if sid in log:
            have = await log.log_bytes(sid)
            if have == data:
                report.already += 1
                return
            if not (have and have.endswith(b"\n") and data.startswith(have)):
                report.problems.append(f"{sid}: not copied: the stream holds another session of that id")
                return
            await imports.import_log(log, sid, data, after=len(have))  # an interrupted copy: the rest
        else:
            await imports.import_log(log, sid, data)
    except Exception as e:  # noqa: BLE001 - told, and the run goes on with the next session
        report.problems.append(f"{sid}: not copied: {type(e).__name__}: {e} (run migrate again to finish it)")
        return
    if await log.log_bytes(sid) != data:
        report.problems.append(f"{sid}: the copy on the stream differs from the source")
        return
    report.copied += 1
    report.records += data.count(b"\n")


async def stream_to_local(fs: FileOps, root: str, source: StreamTarget,
                          progress: Progress | None = None) -> MigrateReport:
    """Copy every session on the stream into the store at `root` (made if
    missing; its lock held by the caller). The store's next start folds
    them (they are not in its index.json: each is replayed in full)."""
    t0 = time.monotonic()
    report = MigrateReport()
    sessions = os.path.join(root, SESSIONS_DIR)
    if not fs.exists(sessions):
        fs.makedirs(sessions)
        fs.fsync_dir(root)
    async with source.open(create=False) as log:
        ids = sorted(log.session_ids())
        for i, sid in enumerate(ids, 1):
            data = await log.log_bytes(sid)
            copy = _copyable(sid, data, report)
            if copy is not None:
                await trio.to_thread.run_sync(_write_log, fs, root, sid, copy, report)
            if progress is not None:
                progress(i, len(ids))
        projects = await StreamProjectLog(log).raw()
        if projects:
            await trio.to_thread.run_sync(_write_projects, fs, root, projects, report)
    report.seconds = time.monotonic() - t0
    return report


def _write_log(fs: FileOps, root: str, sid: str, data: bytes, report: MigrateReport) -> None:
    path = log_path(root, sid)
    if fs.exists(path):
        if fs.read_bytes(path) == data:
            report.already += 1
        else:
            report.problems.append(f"{sid}: not copied: {root} holds another session of that id")
        return
    folder = session_dir(root, sid)
    fs.makedirs(folder)
    fs.write_file(path, data)
    fs.fsync_dir(folder)
    fs.fsync_dir(os.path.dirname(folder))
    if fs.read_bytes(path) != data:
        report.problems.append(f"{sid}: the copy in {root} differs from the stream")
        return
    report.copied += 1
    report.records += data.count(b"\n")


def _write_projects(fs: FileOps, root: str, data: bytes, report: MigrateReport) -> None:
    path = project_log_path(root)
    if fs.exists(path):
        if fs.read_bytes(path) != data:
            report.problems.append(f"projects: not copied: {root} holds another project log")
    else:
        fs.makedirs(os.path.dirname(path))
        fs.write_file(path, data)
        fs.fsync_dir(os.path.dirname(path))
        fs.fsync_dir(root)
    report.projects = data.count(b"\n")


async def verify_stream(target: StreamTarget, progress: Progress | None = None) -> tuple[int, list[str], list[str]]:
    """Check every session on the stream: its records decode, seqs run from 1
    without a gap or a repeat, the first makes the session, nothing follows a
    tombstone, nothing of a message follows its finalize (no progress, no
    second finalize), and a session flagged running has a message running.
    Returns (sessions, problems, notes): a running reply whose lease no
    worker holds is a note (a worker's sweeper aborts it)."""
    problems: list[str] = []
    notes: list[str] = []
    async with target.open(create=False) as log:
        held = set(await Leases.held(log))
        ids = sorted(log.session_ids())
        for i, sid in enumerate(ids, 1):
            try:
                data = await log.log_bytes(sid)
            except UnknownSession:  # deleted (and purged) by a worker while this ran
                notes.append(f"{sid}: deleted while verify ran (not checked)")
                continue
            s = scan(sid, data, expect_seq=1)
            if s.corrupt is not None or s.torn_bytes:
                problems.append(f"{sid}: {s.corrupt or f'{s.torn_bytes} bytes after the last whole record'}")
            elif not s.records or not isinstance(s.records[0].event, SessionCreated):
                problems.append(f"{sid}: its first record does not make the session")
            elif any(isinstance(r.event, SessionDeleted) for r in s.records[:-1]):
                problems.append(f"{sid}: records after its tombstone")
            else:
                problems += [f"{sid}: {p}" for p in lifecycle_problems(s.records)]
                running = {r.event.msg_id for r in s.records
                           if isinstance(r.event, MessageCreated) and r.event.status in ("pending", "running")}
                running -= {r.event.msg_id for r in s.records if isinstance(r.event, MessageFinalized)}
                notes += [f"{sid}: reply {m} is running without a lease (a worker's sweeper aborts it)"
                          for m in sorted(running) if lease_key(sid, m) not in held]
            if progress is not None:
                progress(i, len(ids))
        return len(ids), problems, notes


async def replay_stream(target: StreamTarget) -> tuple[int, int, float]:
    """What a worker's start does: every record through a registry fold.
    Returns (sessions, records, seconds)."""
    from sessionlog_store.projections.registry import Registry
    registry = Registry()
    count = [0]

    def fold(sid: str, rec: Record, end: int) -> None:
        count[0] += 1
        registry.apply(sid, rec, end)
    t0 = time.monotonic()
    async with target.open(create=False, listeners=[fold]):
        return len(registry), count[0], time.monotonic() - t0
