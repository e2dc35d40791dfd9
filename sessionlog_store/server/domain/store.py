"""The session store: the library API (commands -> events, queries -> projections).

    async with open_session_store(root) as store:
        meta, first_id = await store.create_session(agent_id="a", first_message="hi")
        async with store.inflight(meta.id, kind="llm_reply") as msg:
            msg.write("Hello")

Every operation appends events to the session's log through the event store;
every read is a projection (the registry in memory, a session's state loaded
from its snapshot plus the log's tail). See docs/API.md.
"""
from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
import trio

from sessionlog_store.eventstore import (Appended, EventStore, EventStoreError, FileOps, OS_FILES, Record, SessionExists,
                        SessionReadOnly, StoreBroken,
                        SyncMode, UnknownSession, new_session_id, open_event_store, validate_session_id)
from sessionlog_store.eventstore.events import (Event, HeadMoved, MessageCreated, MessageFinalized, MessageProgress, ProjectBound,
                               ProjectRelocated, SessionCreated, SessionDeleted, SessionFlags,
                               SessionRenamed)
from sessionlog_store.eventstore.log import read_log, scan
from sessionlog_store.eventstore.record import decode_record
from sessionlog_store.projections.checkpoint import (IndexCheckpoint, SessionEntry, encode_index, encode_snapshot,
                                    write_index, write_snapshot)
from sessionlog_store.projections.lifecycle import OPEN_STATUSES, TERMINAL_STATUSES, check_move
from sessionlog_store.projections.maintenance import MaintenanceConfig, MaintenancePlan, plan_maintenance
from sessionlog_store.projections.recovery import RecoveryReport, check_prefix, fold_until, load_session_state, recover_registry
from sessionlog_store.projections.registry import ROW_ATTRS, InvalidFilter, Registry
from sessionlog_store.projections.session import MessageSnapshot, SessionMeta, SessionState

from sessionlog_store.server.domain.errors import BadRequest, Conflict, NotFound
from sessionlog_store.server.domain.feed import ChangeFeed
from sessionlog_store.server.domain.inflight import PROGRESS_INTERVAL, SLOTS, STALL_TIMEOUT, InflightMessage, ThrottledSaver, scrub_surrogates
from sessionlog_store.server.domain.projects import DEFAULT_PROJECT_ID, ProjectRegistry, ProjectView
from sessionlog_store.server.domain.subscriptions import MsgUpdate, Subscription, SubscriptionHub
from sessionlog_store.server.domain.titles import KeywordTitler, TitleGenerator, maybe_auto_title, recent_messages

log = logging.getLogger("sessionlog.store")

FROZEN_ERROR = "project is frozen after the first turn"
# Snapshots written at a graceful stop (of the sessions whose messages had
# ended since the last debounce); the rest are rebuilt from the logs' tails.
STOP_SNAPSHOTS = 64
# A producer's exception is logged in its finalize record, cut to this length.
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class StoreConfig:
    """Every tunable of a store, with the spec's values as defaults."""
    checkpoint_interval: float = 5.0      # index.json debounce (spec: 5 s)
    snapshot_interval: float = 2.0        # snapshot.json debounce for running sessions
    progress_interval: float = PROGRESS_INTERVAL
    progress_slots: int | None = None     # phases of the saver's interval (None: SLOTS with the journal, else 1;
                                          # see server/domain/inflight.py SLOTS)
    stall_timeout: float = STALL_TIMEOUT
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    sync_mode: SyncMode = "journal"       # see eventstore/commit.py and journal.py
    journal_sync_interval: float = 1.0    # logs synced and journal segments removed this often
    home: str = field(default_factory=lambda: os.path.expanduser("~"))
    state_cache: int = 256                # loaded sessions kept in memory besides running ones
    # After startup, check in the background the part of each log that the
    # checkpoint let startup skip (damage there quarantines the session).
    check_after_start: bool = True


class UpdateFields(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fields update_session accepts (all optional)."""
    title: str | msgspec.UnsetType = msgspec.UNSET
    status: Literal["idle", "running"] | msgspec.UnsetType = msgspec.UNSET
    pinned: bool | msgspec.UnsetType = msgspec.UNSET
    archived: bool | msgspec.UnsetType = msgspec.UNSET
    unread: bool | msgspec.UnsetType = msgspec.UNSET
    user_titled: bool | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_user_titled")
    auto_titled: bool | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_auto_titled")
    title_gen_count: int | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="_title_gen_count")


_TITLE_FIELDS = {"title": "title", "user_titled": "_user_titled", "auto_titled": "_auto_titled",
                 "title_gen_count": "_title_gen_count"}
_FLAG_FIELDS = ("pinned", "unread", "archived", "status")

Watcher = Callable[[str, dict[str, Any]], None]
_FEED_KINDS = frozenset({"session_created", "session_updated", "session_deleted"})


def row_of(meta: SessionMeta, project: ProjectView | None, damaged: str | None = None) -> dict[str, Any]:
    """The 17-field listing row: the stored fields, preview and project; a
    quarantined session's row has an 18th, `damaged` (what is wrong)."""
    row = msgspec.to_builtins(meta)
    del row["open_msgs"]
    if damaged is not None:
        row["damaged"] = damaged
        row["status"] = "idle"  # a damaged session is never written to: nothing runs in it
    row["project"] = None if project is None else {
        "id": project.id, "name": project.name, "path": project.path, "path_missing": project.path_missing}
    return row


class SessionStore:
    """Use `open_session_store()`."""

    def __init__(self, root: str, es: EventStore, fs: FileOps, config: StoreConfig,
                 titler: TitleGenerator) -> None:
        self.root = root
        self.es = es
        self.fs = fs
        self.config = config
        self.titler = titler
        self.registry = Registry()
        self.projects = ProjectRegistry(fs, root, config.home)
        self.hub = SubscriptionHub()
        slots = config.progress_slots or (SLOTS if es.journal else 1)
        self.saver = ThrottledSaver(es, config.progress_interval, config.stall_timeout, slots)
        es.failure_listeners.append(self._store_failed)
        self.watchers: list[Watcher] = []
        self.feed = ChangeFeed()
        self._creating: set[str] = set()
        self._row_before: dict[str, SessionMeta] = {}
        self.recovery: RecoveryReport | None = None
        self.removed_at_start: list[tuple[str, str]] = []
        self.aborted_at_start: list[tuple[str, str]] = []
        self._states: OrderedDict[str, SessionState] = OrderedDict()
        self._loading: dict[str, list[tuple[Record, int]]] = {}
        self._load_done: dict[str, trio.Event] = {}
        self._ckpt_dirty = trio.Event()
        self._snap_dirty: set[str] = set()
        self._snap_wake = trio.Event()
        self._ckpt_lock = trio.Lock()
        self._snap_lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._unchecked: dict[str, None] = {}   # sessions whose skipped log prefix is not checked yet
        self._checking: dict[str, trio.Event] = {}
        self.checked = trio.Event()    # the background check of the skipped log prefixes is done
        self.shutting_down = False
        self.publishing = 0  # terminal updates waiting for their record to be durable
        es.listeners.append(self._on_record)
        es.append_listeners.append(self._after_append)

    # -- the live projection ------------------------------------------------

    def _on_record(self, sid: str, rec: Record, end: int) -> None:
        old_row = self.registry.rows.get(sid) if type(rec.event) is not MessageProgress else None
        self.registry.apply(sid, rec, end)
        state = self._states.get(sid)
        if state is not None:
            state.apply(rec, end)
        buf = self._loading.get(sid)
        if buf is not None:
            buf.append((rec, end))
        ev = rec.event
        if type(ev) is MessageProgress:
            if self.hub.wants(sid, ev.msg_id):
                self.hub.publish(MsgUpdate(
                    session_id=sid, msg_id=ev.msg_id, seq=rec.seq, offset=ev.offset,
                    content_delta=ev.content_delta, status="running", tree=ev.context_tree,
                    tokens=ev.partial_tokens_used, durable_seq=self.es.durable_seq(sid)))
            return
        if not self._ckpt_dirty.is_set():
            self._ckpt_dirty.set()
        if old_row is not None and sid not in self._row_before:
            self._row_before[sid] = old_row
        if isinstance(ev, MessageFinalized | MessageCreated | ProjectRelocated):
            self._snap_dirty.add(sid)
            self._snap_wake.set()
            if not isinstance(ev, MessageFinalized) and state is not None and self.watchers:
                node = state.messages.get(ev.msg_id if isinstance(ev, MessageCreated) else ev.node_id)
                if node is not None:
                    self._notify("message_created", {"session_id": sid, "message": node,
                                                     "siblings": state.siblings(node.msg_id)})
        if isinstance(ev, MessageFinalized) and self.hub.wants(sid, ev.msg_id):
            m = state.messages.get(ev.msg_id) if state is not None else None
            content = m.content if m is not None else (ev.content or "")
            update = MsgUpdate(
                session_id=sid, msg_id=ev.msg_id, seq=rec.seq, offset=0, content_delta=content,
                status=ev.status, tokens=ev.tokens, error=ev.error, aborted_reason=ev.aborted_reason,
                tree=m.metadata.get("context_tree") if m is not None else None, durable_seq=rec.seq)
            if self._nursery is not None:
                # A terminal status is published only once it is durable: a
                # subscriber that saw "done" never sees "aborted" after a crash.
                self.publishing += 1
                self._nursery.start_soon(self._publish_when_durable, sid, update)

    async def _publish_when_durable(self, sid: str, update: MsgUpdate) -> None:
        try:
            await self.es.wait_durable(sid, update.seq)
        except EventStoreError as e:  # the store broke (or the session went): the record may be lost
            self.hub.end(sid, "session deleted" if isinstance(e, UnknownSession) else "store failure",
                         msg_id=update.msg_id)
            return
        finally:
            self.publishing -= 1
        self.hub.publish(update)

    def _store_failed(self, error: BaseException) -> None:
        """The log store broke: end every producer and every subscription."""
        self.saver.store_failed(error)
        self.hub.end(None, "store failure")

    def _after_append(self, sid: str) -> None:
        """Every change of a row goes out as one `session_updated` per append,
        with only the changed fields: renames and flags, and what the fold
        changes by itself (a reply starting or ending: status; a message:
        preview, updated_at, message_count)."""
        old = self._row_before.pop(sid, None)
        if old is None:  # progress records, and appends that changed no row
            return
        new = self.registry.rows.get(sid)
        if new is None or new is old or sid in self._creating:
            return
        changed = self._row_changes(old, new)
        if changed:
            self._notify("session_updated", {"id": sid, **changed})

    def _row_changes(self, old: SessionMeta, new: SessionMeta) -> dict[str, Any]:
        changed = {wire: getattr(new, attr) for attr, wire in ROW_ATTRS
                   if getattr(new, attr) != getattr(old, attr)}
        if "project_id" in changed:
            changed["project"] = row_of(new, self._project_view(new.project_id))["project"]
        return changed

    def _notify(self, kind: str, data: dict[str, Any]) -> None:
        if kind in _FEED_KINDS:
            self.feed.add(kind, data)
        for w in list(self.watchers):
            w(kind, data)

    def changes_since(self, position: str) -> list[tuple[str, dict[str, Any]]] | None:
        """The registry changes (push kind, data) after `position`, or None: re-list."""
        return self.feed.since(position)

    # -- lookups ------------------------------------------------------------

    def get_meta(self, session_id: str) -> SessionMeta:
        validate_session_id(session_id)
        meta = self.registry.get(session_id)
        if meta is None:
            raise NotFound("unknown_session", f"unknown session {session_id!r}")
        return meta

    def get_row(self, session_id: str) -> dict[str, Any]:
        meta = self.get_meta(session_id)
        return row_of(meta, self._project_view(meta.project_id), self._damage(session_id))

    def _damage(self, session_id: str) -> str | None:
        corrupt = self.es.corruption(session_id) if session_id in self.es else None
        return None if corrupt is None else f"line {corrupt.line_no}: {corrupt.reason}"

    def _project_view(self, project_id: str | None) -> ProjectView | None:
        pid = project_id or DEFAULT_PROJECT_ID
        return self.projects.view(pid) if pid in self.projects else None

    async def load_session(self, session_id: str) -> SessionState:
        """The session's full state (meta + message DAG), from memory, or from its
        snapshot plus the log's tail."""
        self.get_meta(session_id)
        state = self._states.get(session_id)
        if state is not None:
            self._states.move_to_end(session_id)
            return state
        pending = self._load_done.get(session_id)
        if pending is not None:
            await pending.wait()
            return await self.load_session(session_id)
        done = self._load_done[session_id] = trio.Event()
        buf = self._loading[session_id] = []
        try:
            await self._flush_for_read()
            loaded, _ = await trio.to_thread.run_sync(load_session_state, self.fs, self.root, session_id)
            state = loaded
            self._add_unwritten(session_id, state)
            for rec, end in buf:
                if rec.seq > state.seq:
                    state.apply(rec, end)
        finally:
            del self._loading[session_id]
            del self._load_done[session_id]
            done.set()
        if session_id not in self.registry:
            raise NotFound("unknown_session", f"session {session_id!r} was deleted")
        if state.meta is None:  # quarantined without a readable meta: what the registry knows
            state.meta = self.registry.get(session_id)
        self._states[session_id] = state
        self._evict_states()
        return state

    def _add_unwritten(self, session_id: str, state: SessionState) -> None:
        """After a failed log write, acknowledged records that only the journal
        holds (until a restart writes them back) are folded in from memory."""
        extra = self.es.unwritten(session_id) if session_id in self.es else b""
        end = self.es.durable_end(session_id) if extra else 0
        for line in extra.splitlines(keepends=True):
            end += len(line)
            rec = decode_record(line)
            if rec.seq > state.seq:
                state.apply(rec, end)

    async def _flush_for_read(self) -> None:
        """Before a read of a log: everything appended so far is in the file.
        Reads keep working after a write failure: they read what the log holds."""
        try:
            await self.es.flush()
        except StoreBroken:
            pass

    def _evict_states(self) -> None:
        """Drop least recently used loaded sessions past the cache size; sessions
        with running messages stay (they are moved to the back, so the front
        of the LRU keeps the candidates and a pass stays short). Sessions with
        a producer here do not count against the cache, so 5,000 streams
        starting do not each scan 5,000 cached states (that was quadratic)."""
        excess = len(self._states) - self.config.state_cache - len(self.saver.sessions)
        looked = 0
        while excess > 0 and looked < len(self._states):
            sid, st = next(iter(self._states.items()))
            looked += 1
            if st.meta is not None and st.meta.open_msgs:
                self._states.move_to_end(sid)
                if looked > excess + 64:
                    return  # mostly running sessions: try again on a later load
                continue
            del self._states[sid]
            excess -= 1

    async def get_messages(self, session_id: str) -> list[MessageSnapshot]:
        """The messages of the current branch, root first (works while archived)."""
        return (await self.load_session(session_id)).branch()

    # -- create / append --------------------------------------------------

    async def create_session(self, session_id: str | None = None, *, agent_id: str = "default",
                             source: str = "web", title: str = "", project_id: str | None = None,
                             first_message: str | None = None) -> tuple[SessionMeta, str | None]:
        """Create a session, durable at birth: when this returns its log and the
        folders above it are fsynced. With `first_message`, the user's first
        message is in the same write (no empty shell). Returns (meta, msg_id)."""
        sid = new_session_id() if session_id is None else validate_session_id(session_id)
        if project_id is not None:
            self.projects.get(project_id)
        if sid in self.registry:
            raise Conflict("session_exists", f"session {sid!r} already exists")
        now = time.time()
        # A title given at creation is the user's title: auto-naming leaves it alone.
        events: list[Event] = [SessionCreated(session_id=sid, agent_id=agent_id, source=source, title=title,
                                              project_id=project_id, created_at=now,
                                              user_titled=bool(title.strip()))]
        msg_id = None
        if first_message is not None:
            msg_id = new_session_id()
            events.append(MessageCreated(msg_id=msg_id, role="user", kind="chat", content=first_message,
                                         started_at=now))
        self._states[sid] = SessionState()
        self._creating.add(sid)
        try:
            await self.es.create(sid, events)
        except SessionExists:
            self._states.pop(sid, None)
            raise Conflict("session_exists", f"session {sid!r} already exists") from None
        except BaseException:
            self._states.pop(sid, None)
            raise
        finally:
            self._creating.discard(sid)
            self._row_before.pop(sid, None)
        self._evict_states()
        meta = self.get_meta(sid)
        self._notify("session_created", {"session": self.get_row(sid)})
        return meta, msg_id

    async def append_message(self, session_id: str, content: str, *, role: str = "user",
                             kind: str = "chat", parent_id: str | None = None,
                             metadata: dict[str, Any] | None = None) -> str:
        """Append a finished message (durably) on the current branch; a user
        message updates the preview and updated_at. Returns its id."""
        state = await self.load_session(session_id)
        if parent_id is not None and parent_id not in state.messages:
            raise NotFound("unknown_message", f"unknown message {parent_id!r}")
        if not _valid_kind(role, kind) or not isinstance(content, str):
            raise BadRequest("bad_field", f"bad role {role!r}, kind {kind!r} or content")
        msg_id = new_session_id()
        await self._append(session_id, MessageCreated(
            msg_id=msg_id, role=role, kind=kind, parent_id=parent_id or state.head,  # type: ignore[arg-type]
            content=content, started_at=time.time(), metadata=metadata or {}))
        if role == "assistant":
            self._after_reply(session_id)
        return msg_id

    async def _append(self, session_id: str, *events: Event) -> list[Appended]:
        if self._unchecked or self._checking:
            await self._ensure_checked(session_id)
        try:
            return await self.es.append_many(session_id, events)
        except UnknownSession:
            raise NotFound("unknown_session", f"unknown session {session_id!r}") from None

    # -- updates ------------------------------------------------------------

    async def update_session(self, session_id: str, **fields: Any) -> dict[str, Any]:
        """Change title, status, pinned, archived, unread and the title flags
        (`_user_titled`, `_auto_titled`, `_title_gen_count`). Only the fields
        passed; returns exactly those that changed (what `session_updated`
        carries). Unknown fields and wrong types raise BadRequest and change
        nothing."""
        meta = self.get_meta(session_id)
        try:
            upd = msgspec.convert(fields, UpdateFields, strict=True)
        except msgspec.ValidationError as e:
            raise BadRequest("bad_field", f"update_session: {e}") from None
        changed: dict[str, Any] = {}
        title_kw: dict[str, Any] = {}
        for attr, wire in _TITLE_FIELDS.items():
            v = getattr(upd, attr)
            if v is not msgspec.UNSET and v != getattr(meta, attr):
                changed[wire] = v
                title_kw[attr] = v
        flag_kw = {}
        for attr in _FLAG_FIELDS:
            v = getattr(upd, attr)
            if v is not msgspec.UNSET and v != getattr(meta, attr):
                changed[attr] = v
                flag_kw[attr] = v
        events: list[Event] = []
        if title_kw:
            events.append(SessionRenamed(title=title_kw.pop("title", meta.title), **title_kw))
        if flag_kw:
            events.append(SessionFlags(**flag_kw))
        if events:
            await self._append(session_id, *events)  # the row's change is pushed by _after_append
        return changed

    async def rename_session(self, session_id: str, title: str) -> dict[str, Any]:
        """A manual rename: sets `_user_titled`, after which auto-naming stops for good."""
        if not isinstance(title, str) or not title.strip():
            raise BadRequest("bad_field", "a title must be a non-empty string")
        return await self.update_session(session_id, title=title.strip(), _user_titled=True)

    async def regenerate_title(self, session_id: str) -> dict[str, Any]:
        """Have the title generator name the session now; does not lock the title."""
        state = await self.load_session(session_id)
        title = await self.titler.generate(recent_messages(state))
        return await self.update_session(session_id, title=title or state.meta.title)  # type: ignore[union-attr]

    async def set_archived(self, session_id: str, flag: bool) -> bool:
        """Archive or unarchive; False for an unknown session. updated_at is kept."""
        try:
            await self.update_session(session_id, archived=flag)
        except NotFound:
            return False
        return True

    async def delete_session(self, session_id: str) -> bool:
        """A durable tombstone, then the registry row, then the folder. A crash
        in between finishes at the next start. False for an unknown session."""
        validate_session_id(session_id)
        if session_id not in self.registry:
            return False
        for msg in [m for (sid, _), m in self.saver.active.items() if sid == session_id]:
            msg.abort_reason = "session deleted"
            msg.scope.cancel()
        # A damaged log takes no tombstone: its folder is removed at once (the
        # user asked). A crash during that removal leaves the session listed as
        # damaged again, or an orphan folder that verify reports.
        damaged = session_id in self.es and self.es.corruption(session_id) is not None
        seq = 0 if damaged else (await self._append(session_id, SessionDeleted()))[0].record.seq
        self.hub.end(session_id, "session deleted", seq=seq)
        self._states.pop(session_id, None)
        self._snap_dirty.discard(session_id)
        # A snapshot being written into the folder finishes first; none starts
        # after (write_snapshot checks, under the same lock, that the session
        # is still there): the folder is removed whole, nothing is left behind.
        try:
            async with self._snap_lock:
                await self.es.remove(session_id)
        finally:
            # The tombstone is durable: the session is gone for every client even
            # if removing its folder failed (the next start finishes that).
            if damaged:
                self.registry.put(None, session_id)
            self._notify("session_deleted", {"session_id": session_id})
        return True

    # -- listing ------------------------------------------------------------

    def list_sessions(self, *, filters: dict[str, Any] | None = None, include_archived: bool = False,
                      archived: bool | None = None, offset: int = 0, limit: int | None = None
                      ) -> tuple[list[dict[str, Any]], int]:
        """Rows newest first (pure in memory). Returns (rows, total before paging)."""
        try:
            metas, total = self.registry.select(filters=filters, include_archived=include_archived,
                                                archived=archived, offset=offset, limit=limit)
        except InvalidFilter as e:
            raise BadRequest("bad_filter", str(e)) from None
        views = {p.id: p for p in self.projects.list()}
        return [row_of(m, views.get(m.project_id or DEFAULT_PROJECT_ID), self._damage(m.id)) for m in metas], total

    # -- projects ---------------------------------------------------------

    def list_running(self) -> list[dict[str, Any]]:
        """Every message running in this process, across sessions, oldest first:
        session, message, kind, role, caller, started_at and its length so far."""
        out = [{"session_id": m.session_id, "msg_id": m.msg_id, "kind": m.kind, "role": m.role,
                "caller": m.caller, "started_at": m.started_at, "length": m.length}
               for m in self.saver.active.values() if not m.finished]
        return sorted(out, key=lambda r: r["started_at"])

    def list_projects(self) -> list[ProjectView]:
        return self.projects.list()

    async def create_project(self, name: str, path: str) -> ProjectView:
        p = await self.projects.create(name, path)
        view = self._project_view(p.id)
        assert view is not None
        return view

    def project_workdir_for(self, session_id: str) -> str | None:
        """The bound project's folder, or None when it vanished."""
        return self.projects.workdir_for(self.get_meta(session_id).project_id)

    async def set_session_project(self, session_id: str, project_id: str) -> dict[str, Any]:
        """Bind while the session has no message; naming the bound project again
        is accepted at any age; another one after the first turn is refused."""
        meta = self.get_meta(session_id)
        self.projects.get(project_id)
        current = meta.project_id or DEFAULT_PROJECT_ID
        if current == project_id:
            return {}
        if meta.message_count > 0:
            raise Conflict("project_frozen", FROZEN_ERROR)
        await self._append(session_id, ProjectBound(project_id=project_id))
        return {"project_id": project_id}

    async def relocate_project(self, session_id: str, project_id: str, path: str) -> dict[str, Any]:
        """Repair a moved project folder: validate the new directory, rewrite the
        project's path (its id kept, every bound session follows) and record a
        relocation node in the session's graph that never moves head."""
        meta = self.get_meta(session_id)
        # The session's node is written after the project's move: check first
        # that it can be (an error must leave nothing changed).
        if self.es.corruption(session_id) is not None:
            raise SessionReadOnly(f"session {session_id} is quarantined (damaged log); repair it first")
        if self.failure() is not None:
            raise StoreBroken("the store failed to write or sync and accepts nothing more; restart it")
        if (meta.project_id or DEFAULT_PROJECT_ID) != project_id:
            raise Conflict("project_not_bound", f"session {session_id} is not bound to project {project_id!r}; "
                           "relocate it from a session of that project")
        await self.load_session(session_id)  # loaded: watchers are told of the node (message_created)
        old, new = await self.projects.relocate(project_id, path)
        node_id = new_session_id()
        await self._append(session_id, ProjectRelocated(node_id=node_id, project_id=project_id,
                                                        old_path=old, path=new))
        # Every bound session's row shows the project's new path: say so.
        project = row_of(self.get_meta(session_id), self._project_view(project_id))["project"]
        for sid, m in list(self.registry.rows.items()):
            if (m.project_id or DEFAULT_PROJECT_ID) == project_id:
                self._notify("session_updated", {"id": sid, "project": dict(project)})
        return {"ok": True, "old_path": old, "path": new, "node_id": node_id}

    # -- in-flight ----------------------------------------------------------

    @asynccontextmanager
    async def inflight(self, session_id: str, *, kind: str = "llm_reply", role: str = "assistant",
                       parent_id: str | None = None, caller: str | None = None,
                       metadata: dict[str, Any] | None = None) -> AsyncIterator[InflightMessage]:
        """Run in-flight work as a message: a durable placeholder before the block,
        throttled progress while it runs, and a durable terminal state after it:
        done on a normal exit, error on an exception, aborted on cancellation
        (with the reason: "stopped by user", "stalled", "server shutdown").
        `parent_id`: None = the current head, "" = a root message."""
        state = await self.load_session(session_id)
        if not _valid_kind(role, kind) or kind in ("chat", "relocate"):
            raise BadRequest("bad_field", f"bad in-flight kind {kind!r} or role {role!r}")
        if parent_id and parent_id not in state.messages:
            raise NotFound("unknown_message", f"unknown message {parent_id!r}")
        if self.shutting_down:
            raise Conflict("shutting_down", "the server is shutting down")
        msg_id = new_session_id()
        parent = state.head if parent_id is None else (parent_id or None)  # "": a root message
        moves_head = caller is None and parent != state.head  # a retry: a sibling branch becomes current
        placeholder = MessageCreated(msg_id=msg_id, role=role, kind=kind,  # type: ignore[arg-type]
                                     parent_id=parent, caller=caller, status="running",
                                     started_at=time.time(), metadata=metadata or {})
        events: list[Event] = [placeholder]
        if state.meta is not None and state.meta.status != "running":
            events.append(SessionFlags(status="running"))
        msg = InflightMessage(self.saver, session_id, msg_id, kind, role, parent, caller,
                              placeholder.started_at or 0.0)
        with trio.CancelScope(shield=True):  # once queued, see it durable; a cancel lands in the body
            appended = await self._append(session_id, *events)
        if moves_head:
            self._notify("head_moved", {"session_id": session_id, "head": msg_id, "seq": appended[0].record.seq})
        # Live (stoppable, watched) only once its placeholder is durable.
        msg.last_activity = trio.current_time()
        self.saver.start(msg)
        if self.shutting_down:  # a stop began while the placeholder was written: it ends at once
            msg.abort_reason = "server shutdown"
            msg.scope.cancel()
        status, error, reason = "done", None, None
        try:
            with msg.scope:
                yield msg
            if msg.scope.cancelled_caught:
                status, reason = "aborted", msg.abort_reason or "stopped by user"
        except trio.Cancelled:
            status, reason = "aborted", msg.abort_reason or "server shutdown"
            raise
        except BaseException as e:
            status, error = "error", scrub_surrogates(f"{type(e).__name__}: {e}"[:MAX_ERROR_CHARS])
            raise
        finally:
            with trio.CancelScope(shield=True):
                await self._finalize(msg, status, error=error, reason=reason)

    async def _finalize(self, msg: InflightMessage, status: str, *, error: str | None = None,
                        reason: str | None = None) -> None:
        if msg.finished:
            return
        self.saver.flush(msg)
        msg.finished = True
        self.saver.end(msg)
        if (msg.session_id not in self.registry or self.es.broken is not None
                or msg.session_id not in self.es or self.es.corruption(msg.session_id) is not None):
            return  # deleted, the store failed, or quarantined: no finalize can be written
        tokens = dict(msg.tokens) if any(msg.tokens.values()) else None
        events: list[Event] = [MessageFinalized(msg_id=msg.msg_id, status=status,  # type: ignore[arg-type]
                                                error=error, aborted_reason=reason, tokens=tokens)]
        meta = self.registry.get(msg.session_id)
        if meta is not None and set(meta.open_msgs) <= {msg.msg_id} and meta.status == "running":
            events.append(SessionFlags(status="idle"))
        await self._append(msg.session_id, *events)
        if status == "done" and msg.role == "assistant" and msg.kind == "llm_reply":
            self._after_reply(msg.session_id)

    async def finalize_message(self, session_id: str, msg_id: str, status: str, *,
                               content: str | None = None, error: str | None = None,
                               reason: str | None = None) -> None:
        """Finalize a message that has no live producer in this process (a
        placeholder created elsewhere). Illegal transitions raise and change nothing."""
        state, m = await self._message(session_id, msg_id)
        check_move(msg_id, m.status, status)
        live = self.saver.active.get((session_id, msg_id))
        if live is not None:
            self.saver.flush(live)
            live.finished = True
            self.saver.end(live)
        await self._append(session_id, MessageFinalized(msg_id=msg_id, status=status,  # type: ignore[arg-type]
                                                        content=content, error=error, aborted_reason=reason))

    def stop(self, session_id: str, msg_id: str) -> bool:
        """Cancel a running message; it is finalized aborted "stopped by user".
        False when no producer of it runs here."""
        msg = self.saver.active.get((session_id, msg_id))
        if msg is None:
            return False
        msg.abort_reason = "stopped by user"
        msg.scope.cancel()
        return True

    async def _message(self, session_id: str, msg_id: str) -> tuple[SessionState, MessageSnapshot]:
        """A loaded session and one of its messages (NotFound when unknown)."""
        state = await self.load_session(session_id)
        m = state.messages.get(msg_id)
        if m is None:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        return state, m

    async def retry_target(self, session_id: str, msg_id: str) -> MessageSnapshot:
        """The message to retry (a finished conversational reply); the retry runs
        as a new in-flight message with the same parent (a sibling branch)."""
        state, m = await self._message(session_id, msg_id)
        if m.status not in TERMINAL_STATUSES:
            raise Conflict("message_running", f"message {msg_id} is still {m.status}")
        if m.role != "assistant" or m.caller is not None:
            raise Conflict("not_retryable", f"message {msg_id} is not an assistant reply")
        return m

    async def switch_branch(self, session_id: str, msg_id: str) -> str:
        """Show the branch through `msg_id` (a sibling a retry or regenerate
        made, or any conversational message): head moves to the tip that branch
        had when it was last shown (`SessionState.leaf_of`), durably. Returns
        the new head; every client watching the session is told (`head_moved`)."""
        state, m = await self._message(session_id, msg_id)
        if m.caller is not None:
            raise BadRequest("not_conversational", f"message {msg_id} is a {m.kind} node, not on a branch")
        head = state.leaf_of(msg_id)
        if head != state.head:
            appended = await self._append(session_id, HeadMoved(head=head))
            self._notify("head_moved", {"session_id": session_id, "head": head, "seq": appended[0].record.seq})
        return head

    @asynccontextmanager
    async def retry(self, session_id: str, msg_id: str) -> AsyncIterator[InflightMessage]:
        """A new reply on a sibling branch of `msg_id` (same parent); head moves to it."""
        m = await self.retry_target(session_id, msg_id)
        async with self.inflight(session_id, kind=m.kind, role=m.role, parent_id=m.parent_id or "") as msg:
            yield msg

    async def subscribe(self, session_id: str, msg_id: str, *, offset: int | None = None,
                        after_seq: int | None = None) -> Subscription:
        """Subscribe to a message's updates. Say what you have (`offset`: characters
        of content; or `after_seq`: the seq your copy is as of) and the first update
        holds exactly the rest, then the live tail; it ends at a terminal status."""
        state = await self.load_session(session_id)
        if msg_id not in state.messages:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        have = 0
        if offset is not None:
            have = offset
        elif after_seq is not None:
            have = await self._length_at(session_id, msg_id, after_seq)
        m = state.messages.get(msg_id)
        if m is not None and m.status in TERMINAL_STATUSES and m.seq > self.es.durable_seq(session_id):
            await self.es.wait_durable(session_id, m.seq)  # terminal states are shown once durable
            m = state.messages.get(msg_id)
        if m is None:
            raise NotFound("unknown_message", f"unknown message {msg_id!r}")
        if have < 0 or have > len(m.content):
            raise BadRequest("bad_offset", f"offset {have} is outside the message's {len(m.content)} characters")
        if session_id not in self.registry or session_id not in self.es:  # deleted while we waited
            raise NotFound("unknown_session", f"session {session_id!r} was deleted")
        sub = self.hub.add(session_id, msg_id, have)
        sub.push(MsgUpdate(session_id=session_id, msg_id=msg_id, seq=m.seq, offset=0, content_delta=m.content,
                           status=m.status, tree=m.metadata.get("context_tree"),
                           tokens=m.metadata.get("partial_tokens_used") if m.tokens is None else m.tokens,
                           error=m.error, aborted_reason=m.metadata.get("aborted_reason"),
                           durable_seq=self.es.durable_seq(session_id)))
        if m.status in OPEN_STATUSES and (session_id, msg_id) not in self.saver.active:
            # No producer here will ever finalize it: say so now rather than never.
            why = ("store failure" if self.failure() is not None
                   else "session quarantined" if self.es.corruption(session_id) is not None
                   else "server shutdown" if self.shutting_down else None)
            if why is not None:
                self.hub.end(session_id, why, msg_id=msg_id, seq=m.seq)
        return sub

    async def _length_at(self, session_id: str, msg_id: str, seq: int) -> int:
        """How long the message's content was as of `seq` (read from the log)."""
        await self._flush_for_read()
        data = await trio.to_thread.run_sync(read_log, self.fs, self.root, session_id)
        extra = self.es.unwritten(session_id)
        if extra:  # a failed log write: what only the journal holds follows the written part
            data = data[:self.es.durable_end(session_id)] + extra
        state = fold_until(scan(session_id, data).records, data, seq)
        m = state.messages.get(msg_id)
        return len(m.content) if m is not None else 0

    # -- titles -------------------------------------------------------------

    def _after_reply(self, session_id: str) -> None:
        if self._nursery is not None and not self.shutting_down:
            self._nursery.start_soon(maybe_auto_title, self, session_id)

    # -- checkpoints --------------------------------------------------------

    async def write_checkpoint(self) -> int:
        """Write index.json with every row whose state is durable. Returns rows written."""
        async with self._ckpt_lock:
            await self.es.flush()
            entries = {}
            es = self.es
            for sid, meta in self.registry.rows.items():
                mark = self.registry.marks.get(sid)
                if mark is None or sid not in es or es.corruption(sid) is not None:
                    continue  # a quarantined session is never checkpointed: startup replays it
                if mark.meta_seq <= es.written_seq(sid):
                    entries[sid] = SessionEntry(seq=es.written_seq(sid), end=es.durable_end(sid), meta=meta)
            data = encode_index(IndexCheckpoint(written_at=time.time(), sessions=entries))
            await trio.to_thread.run_sync(write_index, self.fs, self.root, data)
            return len(entries)

    async def write_snapshot(self, session_id: str) -> bool:
        """Write a loaded session's snapshot.json as of a durable seq."""
        state = self._states.get(session_id)
        if state is None or session_id not in self.es:
            return False
        if state.seq > self.es.durable_seq(session_id):
            await self.es.wait_durable(session_id, state.seq)
        state = self._states.get(session_id)
        if state is None or session_id not in self.es or state.seq > self.es.durable_seq(session_id):
            return False
        data = encode_snapshot(state)
        async with self._snap_lock:
            if session_id not in self.es or self._states.get(session_id) is not state:
                return False  # deleted (or reloaded) while waiting
            await trio.to_thread.run_sync(write_snapshot, self.fs, self.root, session_id, data)
        return True

    async def _checkpoint_loop(self) -> None:
        while True:
            await self._ckpt_dirty.wait()
            await trio.sleep(self.config.checkpoint_interval)
            self._ckpt_dirty = trio.Event()
            await self._cache_write(self.write_checkpoint)

    async def _snapshot_loop(self) -> None:
        while True:
            await self._snap_wake.wait()
            await trio.sleep(self.config.snapshot_interval)
            self._snap_wake = trio.Event()
            dirty, self._snap_dirty = self._snap_dirty, set()
            for sid in dirty:
                await self._cache_write(self.write_snapshot, sid)

    async def _cache_write(self, write: Callable[..., Any], *args: Any) -> None:
        """Checkpoints are caches: a failed write leaves the old file (the temp
        file is never renamed over it), is logged, and a later debounce writes a
        new file. A broken log store ends the attempts."""
        if self.es.broken is not None:
            return
        try:
            await write(*args)
        except (OSError, EventStoreError) as e:
            log.error("writing a checkpoint failed (the logs are intact; startup will replay more): %s", e)

    # -- startup / shutdown -------------------------------------------------

    async def _start(self) -> None:
        registry, found, report = await trio.to_thread.run_sync(recover_registry, self.fs, self.root)
        report.journal = self.es.journal_recovery  # applied when the event store opened
        self.recovery = report
        for sid, rec in found.items():
            self.es.register(sid, rec.seq, rec.end, rec.corrupt)
        self.registry = registry
        if self.config.check_after_start:
            self._unchecked = dict.fromkeys(report.tail_replayed)
        await trio.to_thread.run_sync(self.projects.load_sync)
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
        if self.projects.torn is not None:
            log.warning("%s", self.projects.torn)
        if self.projects.damage is not None:
            log.error("%s: the project log is read-only (projects up to the damage are served) until "
                      "`sessionlog repair projects`", self.projects.damage)
        # The abort sweep: nothing is running whose writer is gone. A session
        # is checked (the part of its log the checkpoint let recovery skip)
        # before it is written to; one found damaged is left alone.
        for sid, meta in list(registry.rows.items()):
            if meta.open_msgs and await self._writable_at_start(sid):
                events: list[Event] = [MessageFinalized(msg_id=m, status="aborted", aborted_reason="worker restart")
                                       for m in meta.open_msgs]
                await self._append(sid, *events)
                self.aborted_at_start += [(sid, m) for m in meta.open_msgs]
        # Maintenance in the spec's order, over the healthy sessions (what
        # `sessionlog maintenance --dry-run` plans too).
        healthy = [m for sid, m in self.registry.rows.items() if self.es.corruption(sid) is None]
        plan = plan_maintenance(healthy, time.time(), self.config.maintenance)
        done = MaintenancePlan()
        for sid in plan.to_idle:
            if await self._writable_at_start(sid):
                await self._append(sid, SessionFlags(status="idle"))
                done.to_idle.append(sid)
        kinds = {"empty shell": done.empty_shells, "archive expired": done.expired_archives,
                 "over capacity": done.over_capacity}
        for sid, why in plan.removals():
            if await self._writable_at_start(sid):
                await self.delete_session(sid)
                self.removed_at_start.append((sid, why))
                kinds[why].append(sid)
                log.debug("removed session %s at startup: %s", sid, why)
        log.info("%s", done.summary(len(self.aborted_at_start)))
        await self._cache_write(self.write_checkpoint)
        r = self.recovery
        log.info("started: %d sessions, %d records replayed (%d full replays, %d tails), %d torn tails, "
                 "%d quarantined, %d records written back from the journal, %d removed by maintenance, "
                 "%d replies aborted, in %.2f s", len(self.registry), r.records, r.full_replays, r.tail_replays,
                 len(r.torn), len(r.quarantined), r.journal.records, len(self.removed_at_start),
                 len(self.aborted_at_start), r.seconds)

    async def _writable_at_start(self, sid: str) -> bool:
        if sid not in self.es:
            return False
        await self._ensure_checked(sid)
        return self.es.corruption(sid) is None

    async def check_logs(self) -> int:
        """The background check: read the part of each log that startup skipped
        (before its checkpoint offset) and quarantine a session damaged there,
        as a full replay would have. A session that is written to before the
        check reaches it is checked first (`_append`), so no write is
        acknowledged into a log with damage. Returns how many were quarantined."""
        found = 0
        while self._unchecked:
            found += await self._ensure_checked(next(iter(self._unchecked)))
        return found

    async def _ensure_checked(self, sid: str) -> int:
        pending = self._checking.get(sid)
        if pending is not None:
            await pending.wait()
            return 0
        if sid not in self._unchecked:
            return 0
        del self._unchecked[sid]
        done = self._checking[sid] = trio.Event()
        try:
            return await self._check_one(sid)
        finally:
            del self._checking[sid]
            done.set()

    async def _check_one(self, sid: str) -> int:
        if sid not in self.es or self.es.corruption(sid) is not None:
            return 0
        end = self.es.durable_end(sid)
        try:
            corrupt = await trio.to_thread.run_sync(check_prefix, self.fs, self.root, sid, end)
        except FileNotFoundError:
            return 0  # deleted meanwhile
        if corrupt is None or sid not in self.es:
            return 0
        self.es.quarantine(sid, corrupt)
        self.saver.quarantined(sid)
        self.hub.end(sid, "session quarantined")
        log.error("%s: found by the check after startup; session quarantined (read-only) "
                  "until `sessionlog repair`", corrupt)
        row = self.get_row(sid)
        self._notify("session_updated", {"id": sid, "damaged": row["damaged"], "status": row["status"]})
        return 1

    async def _check_loop(self) -> None:
        try:
            await self.check_logs()
        finally:
            self.checked.set()

    def failure(self) -> BaseException | None:
        """Why the store accepts no more writes (a log or the project log
        failed to write or sync), or None."""
        return self.es.broken or self.projects.broken

    async def abort_running(self, reason: str) -> int:
        """Finalize every running message of this process `aborted` with
        `reason` (their pending text first). Returns how many. Their producers
        see nothing: a later finalize of theirs is a no-op."""
        n = 0
        for msg in list(self.saver.active.values()):
            msg.abort_reason = msg.abort_reason or reason
            try:
                await self._finalize(msg, "aborted", reason=msg.abort_reason)
            except (NotFound, EventStoreError) as e:  # deleted meanwhile, or the store failed
                log.warning("could not finalize message %s at stop: %s", msg.msg_id, e)
                continue
            n += 1
        return n

    async def _shutdown(self) -> None:
        """Flush every saver, abort what still runs ("server shutdown"), write
        the registry checkpoint and the snapshots of the sessions whose
        messages just ended (at most STOP_SNAPSHOTS of them)."""
        self.shutting_down = True
        if self.es.broken is not None:
            return
        await self.abort_running("server shutdown")
        # Other snapshots are left to the debounce: a session without a fresh
        # one is loaded by replaying its log's tail, and writing thousands of
        # them here would make a stop slow. index.json is what startup reads.
        dirty, self._snap_dirty = list(self._snap_dirty), set()
        for sid in dirty[:STOP_SNAPSHOTS]:
            await self._cache_write(self.write_snapshot, sid)
        await self._cache_write(self.write_checkpoint)


_ROLES = {"user", "assistant", "tool", "system"}
_KINDS = {"chat", "llm_reply", "tool_call", "agentic_fn", "task_spawn", "merge", "relocate"}


def _valid_kind(role: object, kind: object) -> bool:
    return role in _ROLES and kind in _KINDS


@asynccontextmanager
async def open_session_store(root: str, *, config: StoreConfig | None = None, fs: FileOps = OS_FILES,
                             titler: TitleGenerator | None = None) -> AsyncIterator[SessionStore]:
    """Open (recovering first) the session store at `root`; background work
    (commit, throttled saver, checkpoints, titles) lives until the block exits,
    and a normal or cancelled exit shuts down gracefully."""
    config = config or StoreConfig()
    root = os.path.abspath(root)
    async with open_event_store(root, fs=fs, sync_mode=config.sync_mode,
                                journal_sync_interval=config.journal_sync_interval) as es:
        store = SessionStore(root, es, fs, config, titler or KeywordTitler())
        await store._start()
        try:
            async with trio.open_nursery() as nursery:
                store._nursery = nursery
                nursery.start_soon(store.saver.run)
                nursery.start_soon(store._checkpoint_loop)
                nursery.start_soon(store._snapshot_loop)
                nursery.start_soon(store._check_loop)
                try:
                    yield store
                finally:
                    with trio.CancelScope(shield=True):
                        await store._shutdown()
                        await trio.lowlevel.checkpoint()  # let durable terminal updates go out first
                    # Every subscription ends with a terminal update, even when
                    # its message gets none here.
                    store.hub.end(None, "store failure" if es.broken is not None else "server shutdown")
                    nursery.cancel_scope.cancel()
        finally:
            store._nursery = None


