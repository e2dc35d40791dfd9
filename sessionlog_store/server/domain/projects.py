"""The project registry: its own log (backend.ProjectLog: on the local engine
`<root>/projects/log.jsonl`, eventstore/local/projects.py; a worker's on a
shared stream, the stream's, eventstore/jetstream/projects.py), folded into
id -> Project. The default project is the home directory; it is never
stored, refuses to relocate, and its path is restored on every read.

Every other project has an owner and is visible to that owner only; its
folder must be an existing directory under one of the project roots (the
home directory unless configured). Whatever is wrong with a path, the answer
is the same (`bad_path`, PATH_REFUSED): a client cannot probe the server's
disk through it (docs/SECURITY.md)."""
from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Sequence
from typing import Final

import msgspec
import trio

from sessionlog_store.eventstore.backend import ProjectLog
from sessionlog_store.eventstore.errors import CorruptRecord, ProjectsMoved, TornTail
from sessionlog_store.eventstore.events import ProjectCreated, ProjectDeleted, ProjectMoved, ProjectOwnerChanged
from sessionlog_store.eventstore.record import Record
from sessionlog_store.server.domain.errors import BadRequest, Conflict, ServiceError, unknown_project

DEFAULT_PROJECT_ID: Final = "default"
# The one answer for a project path that is not absolute, does not exist, is
# not a directory, or lies (after symlinks) outside every project root.
# An append to a shared project log, refused this many times for other
# workers' (each time caught up and checked again), gives up.
SHARED_TRIES: Final = 20
PATH_REFUSED: Final = "project folder refused: it must be an existing folder under a project root"
ProjectEvent = ProjectCreated | ProjectMoved | ProjectOwnerChanged | ProjectDeleted


class Project(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    path: str
    is_default: bool = False
    owner: str = ""


class ProjectView(msgspec.Struct, frozen=True, kw_only=True):
    """What list_projects returns: a project and whether its folder is gone."""
    id: str
    name: str
    path: str
    is_default: bool
    path_missing: bool


class ProjectRegistry:
    def __init__(self, root: str, home: str, roots: tuple[str, ...] = (), many_users: bool = False) -> None:
        # Never a project folder, nor anything under it: the data root (other
        # users' sessions live there; a project on one would tell it exists).
        self.data_root = os.path.realpath(root)
        self.home = home
        # Folders a project may lie under (the home directory when none is given).
        self.roots = tuple(os.path.realpath(r) for r in (roots or (home,)))
        # Many users: the default project's path (the server's home) is shown
        # as "", and every refused path gets PATH_REFUSED.
        self.many_users = many_users
        self._projects: dict[str, Project] = {}
        self._lock = trio.Lock()
        self.log: ProjectLog | None = None  # (set by load)

    @property
    def broken(self) -> OSError | None:
        """The failed write or sync of the project log, or None."""
        return None if self.log is None else self.log.broken

    @property
    def torn(self) -> TornTail | None:
        """The torn last line the load cut, or None."""
        return None if self.log is None else self.log.torn

    @property
    def damage(self) -> CorruptRecord | None:
        """Damage before the log's end: the projects up to it are served, the
        log is read-only until `sessionlog repair projects`."""
        return None if self.log is None else self.log.damage

    async def load(self, log: ProjectLog) -> None:
        """The projects as `log` holds them, kept up to date by what its
        listeners are told (another writer's records on a shared stream)."""
        self.log = log
        # Listening first: another writer's record the tail brings while
        # catch_up waits is told here (catch_up leaves out what it was told).
        log.listeners.append(self._take)
        self._take(await log.catch_up())

    def _take(self, records: Sequence[Record]) -> None:
        for rec in records:
            self._apply(rec.event)

    def _apply(self, ev: object) -> None:
        match ev:
            case ProjectCreated(project_id=pid, name=name, path=path, owner=owner):
                self._projects[pid] = Project(id=pid, name=name, path=path, owner=owner)
            case ProjectMoved(project_id=pid, path=path) if pid in self._projects:
                self._projects[pid] = msgspec.structs.replace(self._projects[pid], path=path)
            case ProjectOwnerChanged(project_id=pid, owner=owner) if pid in self._projects:
                self._projects[pid] = msgspec.structs.replace(self._projects[pid], owner=owner)
            case ProjectDeleted(project_id=pid):
                self._projects.pop(pid, None)

    def default(self) -> Project:
        return Project(id=DEFAULT_PROJECT_ID, name="Home", path=self.home, is_default=True)

    def get(self, project_id: str, owner: str | None = None) -> Project:
        """The project; with `owner`, another owner's is as unknown as none."""
        if project_id == DEFAULT_PROJECT_ID:
            return self.default()
        p = self._projects.get(project_id)
        if p is None or (owner is not None and p.owner != owner):
            raise unknown_project(project_id)
        return p

    def __contains__(self, project_id: str) -> bool:
        return project_id == DEFAULT_PROJECT_ID or project_id in self._projects

    def view(self, project_id: str) -> ProjectView:
        """A project with whether its folder is gone (one stat)."""
        p = self.get(project_id)
        path = "" if p.is_default and self.many_users else p.path
        return ProjectView(id=p.id, name=p.name, path=path, is_default=p.is_default,
                           path_missing=not os.path.isdir(p.path))

    def list(self, owner: str | None = None) -> list[ProjectView]:
        """The default project and `owner`'s (everyone's when None)."""
        return [self.view(pid) for pid, p in [(DEFAULT_PROJECT_ID, None), *self._projects.items()]
                if p is None or owner is None or p.owner == owner]

    def workdir_for(self, project_id: str | None) -> str | None:
        """The project's folder, or None when it vanished (never the home
        directory in its place)."""
        p = self.get(project_id or DEFAULT_PROJECT_ID)
        return p.path if os.path.isdir(p.path) else None

    async def _append(self, ev: ProjectEvent, check: Callable[[], None] | None = None) -> None:
        """Append one record durably. `check` runs under the registry's lock
        just before the write (a check that must not race another writer; on
        a shared stream, again after another worker's append came first)."""
        if self.log is None:
            raise RuntimeError("the project registry is not loaded")
        async with self._lock:
            for _ in range(SHARED_TRIES):
                if check is not None:
                    check()
                try:
                    await self.log.append(ev)
                except ProjectsMoved:  # another worker's first: what it wrote, then the checks again
                    self._take(await self.log.catch_up())
                    continue
                self._apply(ev)
                return
        raise ServiceError("unavailable", "other workers kept writing the project log; try again")

    async def create(self, name: str, path: str, owner: str = "", check: Callable[[], None] | None = None) -> Project:
        path = self._checked_dir(path)
        pid = "p-" + secrets.token_hex(6)

        def checks() -> None:
            if check is not None:
                check()
            self._check_free(path, owner)
        await self._append(ProjectCreated(project_id=pid, name=name or os.path.basename(path), path=path,
                                          owner=owner), check=checks)
        return self._projects[pid]

    def _check_free(self, path: str, owner: str) -> None:
        """Two projects of one owner never point at one folder (nor at the home
        folder). Another owner's projects are not looked at: that would tell
        whether someone else uses a folder."""
        if any(q.path == path and q.owner == owner for q in self._projects.values()):
            raise Conflict("path_in_use", "another of your projects already points at that folder")

    def _checked_dir(self, path: str) -> str:
        """The real path of an existing directory under a project root (not
        the home, nor in or around the data root), or BadRequest "bad_path":
        with many users PATH_REFUSED whatever is wrong; for the single user,
        which thing is."""
        def refuse(detail: str) -> BadRequest:
            return BadRequest("bad_path", PATH_REFUSED if self.many_users else f"project path {path!r} {detail}")
        if not isinstance(path, str) or not path or "\x00" in path or not os.path.isabs(path):
            raise refuse("is not an absolute path")
        real = os.path.realpath(path)
        if not os.path.exists(real):
            raise refuse("does not exist")
        if not os.path.isdir(real):
            raise refuse("is not a directory")
        if not any(_under(real, r) for r in self.roots):
            raise refuse("is not under a project root (--project-root; the home directory by default)")
        if _under(real, self.data_root) or _under(self.data_root, real) or real == os.path.realpath(self.home):
            raise refuse("is the home directory, or holds or lies in the data directory")
        return real

    def owned(self, owner: str | None = None) -> tuple[Project, ...]:
        """The projects of `owner` (everyone's when None), the default project not among them."""
        return tuple(p for p in self._projects.values() if owner is None or p.owner == owner)

    async def transfer(self, project_id: str, owner: str) -> None:
        """The project becomes `owner`'s (an appended record; its id, name and folder kept)."""
        p = self.get(project_id)
        if p.is_default:
            raise Conflict("default_project", "the default project belongs to no one")
        await self._append(ProjectOwnerChanged(project_id=p.id, owner=owner, previous=p.owner))

    async def delete(self, project_id: str) -> None:
        """Forget the project (an appended record: the log keeps its earlier ones)."""
        p = self.get(project_id)
        if p.is_default:
            raise Conflict("default_project", "the default project cannot be deleted")
        await self._append(ProjectDeleted(project_id=p.id))

    def count(self, owner: str) -> int:
        """Projects of `owner` (the default project not counted)."""
        return sum(1 for p in self._projects.values() if p.owner == owner)

    async def relocate(self, project_id: str, path: str, owner: str | None = None) -> tuple[str, str]:
        """Point a project at a new folder, keeping its id. Returns (old, new)."""
        p = self.get(project_id, owner)
        if p.is_default:
            raise BadRequest("default_project", "the default project cannot be relocated: "
                             "its path is the home directory")
        if os.path.isdir(p.path):
            raise Conflict("project_not_missing", f"project {project_id!r} still has its folder; relocation "
                           "only repairs a project whose folder is missing")
        new = self._checked_dir(path)

        # Checked under the log's lock: two relocations cannot both take one folder.
        await self._append(ProjectMoved(project_id=project_id, old_path=p.path, path=new),
                           check=lambda: self._check_free(new, p.owner))
        return p.path, new


def _under(path: str, folder: str) -> bool:
    """`path` is `folder` or inside it (both real paths)."""
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)
