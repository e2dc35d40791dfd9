"""`sessionlog users`: one user's sessions, projects and streams (the
generic namespace's, `<root>/streams/`), for an operator offboarding them
(docs/SECURITY.md, "Offboarding a user"): list the owners, export one
user's logs, delete them, or give the sessions and projects to another
user (streams are not given: export or delete them).

Each command opens the store as a start does: its lock is held (the server
must be stopped), the journal a crash left is applied, a dead server's
replies are aborted; the retention rules are off, so nothing is removed
that was not asked for. On a shared stream (`--backend nats://…`) it opens
as one more worker while the others serve: its changes reach them as any
worker's do. Changes go through the store's own paths: a
deletion is the durable tombstone `delete_session` writes, a transfer an
appended `owner_changed` record per session and `project_owner_changed` per
project (the owner is recorded in the log, so it is changed in the log:
never a file edit).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import time
import unicodedata
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import IO, Final, TypeVar

import trio

from sessionlog_store.eventstore.errors import SessionReadOnly
from sessionlog_store.eventstore.events import OwnerChanged
from sessionlog_store.eventstore.local.fsio import OS_FILES
from sessionlog_store.projections.maintenance import MaintenanceConfig
from sessionlog_store.projections.session import SessionMeta
from sessionlog_store.server.domain.projects import Project
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore
from sessionlog_store.server.stores import open_session_store, open_streams
from sessionlog_store.server.domain.streamspace import StreamSpace
from sessionlog_store.projections.dstream import StreamState
from sessionlog_store.server.edge.auth import user_id

# Exit codes (the README's table): as every command's.
EXIT_OK: Final = 0
EXIT_PROBLEMS: Final = 1   # some of the user's sessions could not be changed (damaged logs): named on stderr
EXIT_USAGE: Final = 2      # not a user id, or a transfer to the same user
EXIT_CANNOT: Final = 3     # the user owns nothing here (a typo?), the root is locked, a disk error

T = TypeVar("T")

# Retention off: an offboarding command removes nothing it was not asked to.
_NO_RETENTION: Final = MaintenanceConfig(empty_shell_age=0, archive_ttl=0, max_sessions=0)


class UsageError(ValueError):
    """A bad user on the command line (exit 2)."""


class NothingOwned(ValueError):
    """The user owns no session and no project here (exit 3)."""


def parse_user(text: str, what: str = "user") -> str:
    """A user named on the command line: "" (the single user of `--auth
    token`, whose sessions record no owner) or a user id (auth.user_id: NFC)."""
    if text == "":
        return ""
    uid = user_id(text)
    if uid is None:
        raise UsageError(f"{what} {text!r} is not a user id (docs/SECURITY.md: user ids)")
    return uid


def _same(owner: str, user: str) -> bool:
    """Whether a recorded owner is `user` (an owner recorded before ids were
    normalised may be in another normal form)."""
    return owner == user or unicodedata.normalize("NFC", owner) == user


@dataclass
class Holdings:
    """What one user owns: its sessions (oldest first), projects and generic
    streams, and which of its sessions are damaged (read-only: `sessionlog
    repair` first)."""
    user: str
    sessions: list[SessionMeta]
    projects: list[Project]
    damaged: dict[str, str] = field(default_factory=dict)  # session id -> what is wrong
    streams: list[StreamState] = field(default_factory=list)


@dataclass
class Opened:
    """A data root (or a shared stream) opened for offboarding: its sessions'
    store and its streams."""
    store: SessionStore
    space: StreamSpace


def _unknown_owner(store: SessionStore, sid: str) -> bool:
    """A session whose first line cannot be read records no owner we can trust."""
    corrupt = store.es.corruption(sid)
    return corrupt is not None and corrupt.line_no == 1


def holdings(opened: Opened, user: str) -> Holdings:
    store = opened.store
    sessions = sorted((m for sid, m in store.registry.rows.items()
                       if _same(m.owner, user) and not _unknown_owner(store, sid)), key=lambda m: m.created_at)
    damaged = {}
    for m in sessions:
        corrupt = store.es.corruption(m.id)
        if corrupt is not None:
            damaged[m.id] = f"line {corrupt.line_no}: {corrupt.reason}"
    projects = [p for p in store.projects.owned() if _same(p.owner, user)]
    streams = sorted((st for st in opened.space.logs.values() if _same(st.owner, user)), key=lambda s: s.created_at)
    h = Holdings(user, sessions, projects, damaged, streams)
    if not sessions and not projects and not streams:
        raise NothingOwned(f"user {user!r} owns no session, project or stream in this store "
                           "(`sessionlog users list` names the owners)")
    return h


@asynccontextmanager
async def open_store(root: str, config: StoreConfig | None = None) -> AsyncIterator[Opened]:
    """The store opened as a start opens it, the retention rules off, and every
    log checked whole (what a start's checkpoint let it skip too): a damaged
    session is known before anything is done to it; and the root's streams.
    A `config` with a backend: a worker's store on that shared stream, and
    the workers' stream space (`root` holds nothing of theirs)."""
    config = replace(config or StoreConfig(), maintenance=_NO_RETENTION)
    async with open_session_store(root, config=config) as store, open_streams(root, config=config) as space:
        await store.check_logs()  # (a worker's: nothing skipped, 0)
        yield Opened(store, space)


# -- the commands (each an async function of an open store) --------------------

@dataclass
class OwnerLine:
    owner: str
    sessions: int = 0
    archived: int = 0
    projects: int = 0
    last_updated: float = 0.0
    streams: int = 0


def owners(opened: Opened) -> tuple[list[OwnerLine], list[str]]:
    """Every owner of a session, a project or a stream, by name; and the
    sessions whose owner cannot be read (damaged in line 1)."""
    store = opened.store
    lines: dict[str, OwnerLine] = {}
    unknown = []
    for sid, m in store.registry.rows.items():
        if _unknown_owner(store, sid):
            unknown.append(sid)
            continue
        line = lines.setdefault(m.owner, OwnerLine(m.owner))
        line.sessions += 1
        line.archived += m.archived
        line.last_updated = max(line.last_updated, m.updated_at)
    for p in store.projects.owned():
        lines.setdefault(p.owner, OwnerLine(p.owner)).projects += 1
    for st in opened.space.logs.values():
        lines.setdefault(st.owner, OwnerLine(st.owner)).streams += 1
    return sorted(lines.values(), key=lambda x: x.owner), sorted(unknown)


async def export(opened: Opened, user: str, out: IO[bytes]) -> Holdings:
    """A tar of the user's session logs, byte for byte, in a data root's
    layout (`sessions/<id>/log.jsonl`), its streams' logs likewise
    (`streams/sessions/<log id>/log.jsonl`), and `manifest.json`: the user,
    when, each session's id, title, times and damage, the user's projects
    and streams."""
    store = opened.store
    h = holdings(opened, user)
    manifest = {
        "user": user, "exported_at": time.time(),
        "sessions": [{"id": m.id, "title": m.title, "created_at": m.created_at, "updated_at": m.updated_at,
                      "archived": m.archived, "damaged": h.damaged.get(m.id)} for m in h.sessions],
        "projects": [{"id": p.id, "name": p.name, "path": p.path} for p in h.projects],
        "streams": [{"name": st.name, "log": st.log_id, "content_type": st.content_type, "bytes": st.own_bytes,
                     "closed": st.closed, "deleted": st.soft_deleted} for st in h.streams],
    }
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        # (the tar's writes go to a file or a pipe: in a worker thread, as the reads)
        await trio.to_thread.run_sync(_add, tar, "manifest.json",
                                      json.dumps(manifest, indent=1, ensure_ascii=False).encode() + b"\n")
        for m in h.sessions:  # (each log as the store holds it: acknowledged records included)
            data = await store.log_bytes(m.id)
            await trio.to_thread.run_sync(_add, tar, f"sessions/{m.id}/log.jsonl", data)
        for st in h.streams:
            data = await opened.space.log_bytes(st.log_id)
            await trio.to_thread.run_sync(_add, tar, f"streams/sessions/{st.log_id}/log.jsonl", data)
    return h


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o600
    tar.addfile(info, io.BytesIO(data))


@dataclass
class Outcome:
    sessions: list[str] = field(default_factory=list)   # changed (or, dry run, that would be)
    projects: list[str] = field(default_factory=list)
    streams: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # not changed, and why
    notes: list[str] = field(default_factory=list)


async def delete(opened: Opened, user: str, *, dry_run: bool = False) -> Outcome:
    """Delete every session of the user (a durable tombstone each, then its
    folder), then its projects (an appended `project_deleted` each), then
    its streams (forks first: each a tombstone, then its log)."""
    store = opened.store
    h, out = holdings(opened, user), Outcome()
    for m in h.sessions:
        if dry_run or await store.delete_session(m.id):
            out.sessions.append(m.id)
    for p in h.projects:
        if not dry_run:
            await store.projects.delete(p.id)
        out.projects.append(p.id)
    if h.projects:
        out.notes.append("the project log is append-only: the deleted projects' names and folders stay in "
                         "its earlier records")
    if dry_run:
        out.streams = [st.name for st in h.streams if not st.soft_deleted]
    else:
        out.streams, problems = await remove_streams(opened.space, user)
        out.problems += problems
    return out


async def remove_streams(space: StreamSpace, user: str) -> tuple[list[str], list[str]]:
    """Delete every generic stream of `user`: forks before their sources,
    so each goes whole. Returns the names deleted and what could not be
    (damaged logs)."""
    done: list[str] = []
    problems: list[str] = []
    while True:
        mine = [st for st in space.streams.values() if _same(st.owner, user) and not st.soft_deleted
                and st.refcount == 0 and st.log_id not in space.damaged]
        if not mine:
            break
        for st in mine:
            await space.delete(st.owner, st.name)
            done.append(st.name)
    for st in list(space.logs.values()):
        if _same(st.owner, user) and st.log_id in space.damaged:
            problems.append(f"stream {st.name!r} not deleted: its log is damaged ({space.damaged[st.log_id]}); "
                            f"`sessionlog repair --root <data root>/streams {st.log_id}`, then delete again")
        elif _same(st.owner, user) and not st.soft_deleted:
            problems.append(f"stream {st.name!r} not deleted: a damaged fork of it still reads from it")
    for log_id, why in space.unreadable.items():
        problems.append(f"stream log {log_id}: damaged before its first record ({why}), its owner unknown: "
                        f"`sessionlog repair --root <data root>/streams {log_id}`")
    return done, problems


async def transfer(opened: Opened, user: str, to: str, *, dry_run: bool = False) -> Outcome:
    """Give every session and project of `user` to `to`: an appended
    `owner_changed` record per session (durable before the next), a
    `project_owner_changed` per project. A damaged session takes no record:
    it is named, and stays `user`'s until `sessionlog repair`."""
    if _same(to, user) or _same(user, to):
        raise UsageError(f"--to names the same user as USER ({user!r})")
    store = opened.store
    h, out = holdings(opened, user), Outcome()
    if h.streams:
        out.notes.append(f"{_plural(len(h.streams), 'stream')} of {user!r} not transferred (a stream's owner is "
                         "its name's scope): export or delete them")
    for m in h.sessions:
        if m.id in h.damaged:
            out.problems.append(f"session {m.id} not transferred: its log is damaged ({h.damaged[m.id]}); "
                                f"`sessionlog repair {m.id}`, then transfer again")
            continue
        if not dry_run:
            try:
                await store.append_events(m.id, OwnerChanged(owner=to, previous=m.owner))
            except SessionReadOnly as e:  # (found damaged since: checked above, so hardly ever)
                out.problems.append(f"session {m.id} not transferred: {e}")
                continue
        out.sessions.append(m.id)
    theirs = {p.path: p for p in store.projects.owned(to)}
    for p in h.projects:
        if not dry_run:
            await store.projects.transfer(p.id, to)
        out.projects.append(p.id)
        if p.path in theirs:
            out.notes.append(f"{to!r} now has two projects on {p.path} ({theirs[p.path].id} and {p.id}): both "
                             "keep working")
    return out


# -- the command line -------------------------------------------------------------

def run(args: argparse.Namespace, root: str, config: StoreConfig | None = None) -> int:
    """Run `sessionlog users ...` on the existing data root `root`, or with
    `config` naming a backend, on that shared stream."""
    try:
        user = parse_user(args.user) if args.users_command != "list" else ""
        to = parse_user(args.to, "--to") if args.users_command == "transfer" else ""
    except UsageError as e:
        print(f"sessionlog: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        match args.users_command:
            case "list":
                return _run_trio(_list, root, config)
            case "export":
                return _export(root, config, user, args.out)
            case "delete":
                out = _run_trio(_change, root, config, lambda s: delete(s, user, dry_run=args.dry_run))
                verb = "would delete" if args.dry_run else "deleted"
                return _report(out, f"{verb} {_count(out)} of user {user!r}")
            case "transfer":
                out = _run_trio(_change, root, config, lambda s: transfer(s, user, to, dry_run=args.dry_run))
                verb = "would transfer" if args.dry_run else "transferred"
                return _report(out, f"{verb} {_count(out)} of user {user!r} to {to!r}")
    except UsageError as e:
        print(f"sessionlog: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    raise AssertionError(args.users_command)


def _run_trio(fn: Callable[..., Awaitable[T]], *args: object) -> T:
    """trio.run, with an error raised inside the store's nursery (a user who
    owns nothing, a disk error) as itself rather than in an exception group."""
    try:
        return trio.run(fn, *args)
    except BaseExceptionGroup as group:
        leaves: list[BaseException] = []

        def walk(e: BaseException) -> None:
            for sub in e.exceptions if isinstance(e, BaseExceptionGroup) else ():
                walk(sub)
            if not isinstance(e, BaseExceptionGroup):
                leaves.append(e)
        walk(group)
        if len(leaves) == 1 and isinstance(leaves[0], Exception):
            raise leaves[0] from None
        raise


async def _list(root: str, config: StoreConfig | None) -> int:
    async with open_store(root, config) as opened:
        lines, unknown = owners(opened)
        unreadable = dict(opened.space.unreadable)
    for line in lines:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(line.last_updated)) if line.sessions else "-"
        print(f"{json.dumps(line.owner, ensure_ascii=False)}\t{_plural(line.sessions, 'session')}"
              f" ({line.archived} archived)\t{_plural(line.projects, 'project')}\tlast updated {when}"
              + (f"\t{_plural(line.streams, 'stream')}" if line.streams else ""))
    for sid in unknown:
        print(f"(unknown owner)\tsession {sid}: its first line is damaged (`sessionlog repair {sid}`)")
    for log_id in unreadable:
        print(f"(unknown owner)\tstream log {log_id}: its first line is damaged "
              f"(`sessionlog repair --root {os.path.join(root, 'streams')} {log_id}`)")
    return EXIT_OK


async def _change(root: str, config: StoreConfig | None, change: Callable[[Opened], Awaitable[Outcome]]) -> Outcome:
    async with open_store(root, config) as opened:
        return await change(opened)


def _export(root: str, config: StoreConfig | None, user: str, path: str | None) -> int:
    if path is None:
        if sys.stdout.isatty():
            raise ValueError("a tar is binary: give --out FILE, or redirect stdout")
        h = _run_trio(_export_to, root, config, user, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    else:
        if os.path.lexists(path):
            raise ValueError(f"--out {path} exists: not written over")
        part = f"{path}.partial"
        try:
            with open(part, "xb") as f:
                h = _run_trio(_export_to, root, config, user, f)
                f.flush()
                OS_FILES.fsync(f.fileno())  # (after trio.run: no loop to hold up)
            os.replace(part, path)
            OS_FILES.fsync_dir(os.path.dirname(os.path.abspath(path)))  # its name, durable
        finally:
            if os.path.lexists(part):
                os.unlink(part)
    for sid, why in h.damaged.items():
        print(f"  session {sid}: its log is damaged ({why}); exported as it is", file=sys.stderr)
    what = _count(Outcome(sessions=[m.id for m in h.sessions], projects=[p.id for p in h.projects],
                          streams=[st.name for st in h.streams]))
    print(f"exported {what} of user {user!r} to {path or 'stdout'}", file=sys.stderr)
    return EXIT_OK


async def _export_to(root: str, config: StoreConfig | None, user: str, out: IO[bytes]) -> Holdings:
    async with open_store(root, config) as opened:
        return await export(opened, user, out)


def _report(out: Outcome, summary: str) -> int:
    for line in out.problems + [f"note: {n}" for n in out.notes]:
        print(f"  {line}", file=sys.stderr)
    print(summary)
    return EXIT_PROBLEMS if out.problems else EXIT_OK


def _count(out: Outcome) -> str:
    streams = f" and {_plural(len(out.streams), 'stream')}" if out.streams else ""
    return f"{_plural(len(out.sessions), 'session')}{',' if streams else ' and'} " \
           f"{_plural(len(out.projects), 'project')}{streams}"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
