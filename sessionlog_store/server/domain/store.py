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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import msgspec
import trio

from sessionlog_store.eventstore.backend import Appended, EventLog
from sessionlog_store.eventstore.errors import (CorruptRecord, EventStoreError, SessionExists, SessionReadOnly,
                                                StoreBroken, UnknownSession)
from sessionlog_store.eventstore.ids import new_session_id, validate_session_id
from sessionlog_store.eventstore.record import Record
from sessionlog_store.eventstore.events import (Event, MessageCreated, MessageFinalized, MessageProgress,
                                                ProjectBound, ProjectRelocated, SessionCreated, SessionDeleted,
                                                SessionFlags, SessionRenamed)
from sessionlog_store.projections.recovery import RecoveryReport
from sessionlog_store.projections.registry import ROW_ATTRS, InvalidFilter, Registry
from sessionlog_store.projections.session import MessageSnapshot, SessionMeta, SessionState
from sessionlog_store.server.domain.settings import StoreSettings
from sessionlog_store.server.domain.errors import BadRequest, Conflict, NotFound, unknown_session
from sessionlog_store.server.domain.feed import ChangeFeed
from sessionlog_store.server.domain.fields import FLAG_FIELDS, TITLE_FIELDS, UpdateFields, row_of, valid_kind
from sessionlog_store.server.domain.inflight import ThrottledSaver
from sessionlog_store.server.domain.keeping import Keeper
from sessionlog_store.server.domain.projects import DEFAULT_PROJECT_ID, ProjectRegistry, ProjectView
from sessionlog_store.server.domain.replies import Replies
from sessionlog_store.server.domain.states import LoadedStates
from sessionlog_store.server.domain.sharing import SharedLog
from sessionlog_store.server.domain.subscriptions import MsgUpdate, SubscriptionHub
from sessionlog_store.server.domain.titles import TitleGenerator, maybe_auto_title, recent_messages

log = logging.getLogger("sessionlog.store")

FROZEN_ERROR = "project is frozen after the first turn"


Watcher = Callable[[str, dict[str, Any]], None]  # (kind, data)
ScopedWatcher = Callable[[str, dict[str, Any], str], None]  # (kind, data, owner of the session)
_FEED_KINDS = frozenset({"session_created", "session_updated", "session_deleted"})


class Searcher(Protocol):
    """Full-text search over a store's finished messages (server/local/search.py)."""

    async def search(self, text: str, *, owner: str | None, limit: int = 20, offset: int = 0) -> dict[str, Any]: ...


class SessionStore:
    """Use `open_session_store()` (server/stores.py). Its collaborators come
    from the backend's opener (server/local/opening.py, server/scaleout/
    opening.py): the event log, the keeper (`keeper(store)`: what is kept
    beside the log, domain/keeping.py), on a shared log its worker."""

    def __init__(self, root: str, es: EventLog, config: StoreSettings, titler: TitleGenerator,
                 keeper: Callable[[SessionStore], Keeper], *, registry: Registry | None = None,
                 progress_slots: int = 1) -> None:
        self.root = root
        self.es = es
        self.worker: SharedLog | None = None  # on a shared stream (server/scaleout/)
        self.config = config
        self.titler = titler
        self.registry = registry if registry is not None else Registry()
        self.projects = ProjectRegistry(root, config.home, config.project_roots, config.many_users)
        self.hub = SubscriptionHub()
        slots = config.progress_slots or progress_slots
        self.saver = ThrottledSaver(es, config.progress_interval, config.stall_timeout, slots, config.progress_batch)
        es.failure_listeners.append(self._store_failed)
        self.watchers: list[Watcher] = []
        self.scoped_watchers: list[ScopedWatcher] = []  # told whose session changed too (the server)
        self.feed = ChangeFeed()
        self._creating: set[str] = set()
        self._row_before: dict[str, SessionMeta] = {}
        self.recovery: RecoveryReport | None = None
        self.removed_at_start: list[tuple[str, str]] = []
        self.aborted_at_start: list[tuple[str, str]] = []
        self.states = LoadedStates()
        self._nursery: trio.Nursery | None = None
        self.keeper = keeper(self)
        self.checked = self.keeper.checked  # what a start skipped reading is checked
        self.shutting_down = False
        # The reply and branch operations: a collaborator handed this store
        # (domain/replies.py's RepliesHost), its methods the store's own.
        replies = self.replies = Replies(self)
        self.turns = replies.turns
        self.inflight, self.retry, self.subscribe = replies.inflight, replies.retry, replies.subscribe
        self.stop, self.stop_anywhere, self.abort_running = replies.stop, replies.stop_anywhere, replies.abort_running
        self.claim_turn, self.end_turn, self.turn_free = replies.claim_turn, replies.end_turn, replies.turn_free
        self.reserve_reply, self.reply_released = replies.reserve_reply, replies.reply_released
        self.finalize_message, self.retry_target = replies.finalize_message, replies.retry_target
        self.switch_branch, self.list_running = replies.switch_branch, replies.list_running
        self.publishing = 0  # terminal updates waiting for their record to be durable
        self.search: Searcher | None = None  # full-text search, where the backend keeps it (the local one)
        es.listeners.append(self._on_record)
        es.append_listeners.append(self.after_append)

    # -- the live projection ------------------------------------------------

    def _on_record(self, sid: str, rec: Record, end: int) -> None:
        old_row = self.registry.rows.get(sid) if type(rec.event) is not MessageProgress else None
        self.registry.apply(sid, rec, end)
        state = self.states.get(sid)
        if state is not None:
            state.apply(rec, end)
        buf = self.states.buffer(sid)
        if buf is not None:
            buf.append((rec, end))
        self.tell_record(sid, rec, state, old_row)

    def tell_record(self, sid: str, rec: Record, state: SessionState | None, old_row: SessionMeta | None = None) -> None:
        """What a record folded into the projections means for subscribers
        and watchers (scaleout.py calls it for other workers' records a
        rebase folded)."""
        ev = rec.event
        if type(ev) is MessageProgress:
            if self.hub.wants(sid, ev.msg_id):
                update = MsgUpdate(
                    session_id=sid, msg_id=ev.msg_id, seq=rec.seq, offset=ev.offset,
                    content_delta=ev.content_delta, status="running", tree=ev.context_tree,
                    tokens=ev.partial_tokens_used,
                    durable_seq=self.es.durable_seq(sid) if sid in self.es else rec.seq)  # (gone: a rebase's)
                if self.worker is not None and rec.seq > update.durable_seq:
                    self.worker.hold(update)  # told once the stream has it (a conflict may void it)
                else:
                    self.hub.publish(update)
            return
        self.keeper.registry_changed()
        if old_row is not None and sid not in self._row_before:
            self._row_before[sid] = old_row
        if isinstance(ev, MessageFinalized | MessageCreated | ProjectRelocated):
            self.keeper.session_changed(sid)
            if not isinstance(ev, MessageFinalized) and state is not None and (self.watchers or self.scoped_watchers):
                node = state.messages.get(ev.msg_id if isinstance(ev, MessageCreated) else ev.node_id)
                if node is not None:
                    self.notify("message_created", {"session_id": sid, "message": node,
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
                # (the wait made now, as the record's seq is given: a rebase before the
                # task runs renumbers it, JetStreamLog.wait_durable)
                self._nursery.start_soon(self._publish_when_durable, sid, update, self.es.wait_durable(sid, rec.seq))

    async def _publish_when_durable(self, sid: str, update: MsgUpdate, durable: Awaitable[int]) -> None:
        try:
            seq = await durable
            if seq != update.seq:  # renumbered by a rebase: the seq the stream holds it at
                update = msgspec.structs.replace(update, seq=seq, durable_seq=self.es.durable_seq(sid))
        except EventStoreError as e:  # the store broke (or the session went): the record may be lost
            self.hub.end(sid, "session deleted" if isinstance(e, UnknownSession) else "store failure",
                         msg_id=update.msg_id)
            return
        finally:
            self.publishing -= 1
        self.hub.publish(update if self.worker is None else self.worker.stream_end(sid, update))

    def _store_failed(self, error: BaseException) -> None:
        """The log store broke: end every producer and every subscription."""
        self.saver.store_failed(error)
        self.hub.end(None, "store failure")

    def after_append(self, sid: str) -> None:
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
        changed = self.row_changes(old, new)
        if changed:
            self.notify("session_updated", {"id": sid, **changed})

    def row_changes(self, old: SessionMeta, new: SessionMeta) -> dict[str, Any]:
        changed = {wire: getattr(new, attr) for attr, wire in ROW_ATTRS
                   if getattr(new, attr) != getattr(old, attr)}
        if "project_id" in changed:
            changed["project"] = row_of(new, self._project_view(new.project_id))["project"]
        return changed

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> bool:
        """Start `fn(*args)` as the store's background work (it ends with the
        store); False when the store is not running."""
        if self._nursery is None:
            return False
        self._nursery.start_soon(fn, *args)
        return True

    def take_row_before(self, sid: str) -> SessionMeta | None:
        """The session's row as it was before the records folded since the
        last push (None: no row change waits to be told)."""
        return self._row_before.pop(sid, None)

    def keep_row_before(self, sid: str, row: SessionMeta) -> None:
        self._row_before[sid] = row

    def notify(self, kind: str, data: dict[str, Any], owner: str | None = None) -> None:
        """Tell the watchers (and the feed) of a change to a session of `owner`
        (by default, the owner of the session the data names)."""
        if owner is None:
            sid = data.get("id") or data.get("session_id") or data.get("session", {}).get("id")
            meta = self.registry.get(sid) if sid is not None else None
            owner = meta.owner if meta is not None else ""
        if kind in _FEED_KINDS:
            self.feed.add(kind, data, owner)
        for w in list(self.watchers):
            w(kind, data)
        for sw in list(self.scoped_watchers):
            sw(kind, data, owner)

    def changes_since(self, position: str, owner: str | None = None, *,
                      owners: bool = False) -> list[tuple[str, dict[str, Any]]] | None:
        """The registry changes (push kind, data) after `position` (of `owner`'s
        sessions only, unless it is None; with `owners`, each saying whose), or None: re-list."""
        return self.feed.since(position, owner, owners=owners)

    # -- lookups ------------------------------------------------------------

    def get_meta(self, session_id: str, owner: str | None = None) -> SessionMeta:
        """The session's meta; with `owner`, a session of anyone else is as
        unknown as one that does not exist (the same error, word for word)."""
        validate_session_id(session_id)
        meta = self.registry.get(session_id)
        if meta is None or (owner is not None and meta.owner != owner):
            raise unknown_session(session_id)
        return meta

    def loaded_content(self, session_id: str, msg_id: str) -> str | None:
        """A message's content in its loaded session, as folded so far (None:
        the session or the message is not loaded)."""
        state = self.states.get(session_id)
        m = state.messages.get(msg_id) if state is not None else None
        return m.content if m is not None else None

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
        state = self.states.touch(session_id)
        if state is not None:
            return state
        pending = self.states.pending(session_id)
        if pending is not None:
            await pending.wait()
            return await self.load_session(session_id)
        buf = self.states.begin(session_id)
        try:
            state = await self._read_state(session_id)
            for rec, end in buf:
                if rec.seq > state.seq:
                    state.apply(rec, end)
        finally:
            self.states.end(session_id)
        if session_id not in self.registry:
            raise NotFound("unknown_session", f"session {session_id!r} was deleted")
        if self.worker is not None and self.worker.reload_needed(session_id):
            return await self.load_session(session_id)  # another worker's write rebased it meanwhile
        if state.meta is None:  # quarantined without a readable meta: what the registry knows
            state.meta = self.registry.get(session_id)
        self.states.put(session_id, state)
        self._evict_states(spare=session_id)
        return state

    async def _read_state(self, session_id: str) -> SessionState:
        """A session's state as its log (or the stream) holds it."""
        return await self.keeper.read_state(session_id)

    async def log_bytes(self, session_id: str) -> bytes:
        """The session's log as it stands, acknowledged records included."""
        return await self.keeper.log_bytes(session_id)

    def _evict_states(self, spare: str) -> None:
        """Sessions with a producer here do not count against the state
        cache, so 5,000 streams starting do not each scan 5,000 cached states
        (that was quadratic). `spare`: the one just loaded or made stays (a
        reply about to start folds into it: with `state_cache` 0 it was
        dropped at once, and the search index read each finished reply's
        whole session again)."""
        self.states.evict(self.config.state_cache + len(self.saver.sessions), spare)

    async def get_messages(self, session_id: str) -> list[MessageSnapshot]:
        """The messages of the current branch, root first (works while archived)."""
        return (await self.load_session(session_id)).branch()

    # -- create / append --------------------------------------------------

    async def create_session(self, session_id: str | None = None, *, agent_id: str = "default",
                             source: str = "web", title: str = "", project_id: str | None = None,
                             first_message: str | None = None, owner: str = "") -> tuple[SessionMeta, str | None]:
        """Create a session of `owner` ("": the single-user principal), durable
        at birth: when this returns its log and the folders above it are
        fsynced. With `first_message`, the user's first message is in the same
        write (no empty shell). Returns (meta, msg_id)."""
        sid = new_session_id() if session_id is None else validate_session_id(session_id)
        if project_id is not None:
            self.projects.get(project_id, owner)
        if sid in self.registry:
            raise Conflict("session_exists", f"session {sid!r} already exists")
        now = time.time()
        # A title given at creation is the user's title: auto-naming leaves it alone.
        events: list[Event] = [SessionCreated(session_id=sid, agent_id=agent_id, source=source, title=title,
                                              project_id=project_id, created_at=now,
                                              user_titled=bool(title.strip()), owner=owner)]
        msg_id = None
        if first_message is not None:
            msg_id = new_session_id()
            events.append(MessageCreated(msg_id=msg_id, role="user", kind="chat", content=first_message,
                                         started_at=now))
        self.states.put(sid, SessionState())
        self._creating.add(sid)
        try:
            await self.es.create(sid, events)
        except SessionExists:
            self.states.drop(sid)
            raise Conflict("session_exists", f"session {sid!r} already exists") from None
        except BaseException:
            self.states.drop(sid)
            raise
        finally:
            self._creating.discard(sid)
            self._row_before.pop(sid, None)
        self._evict_states(spare=sid)
        meta = self.get_meta(sid)
        self.notify("session_created", {"session": self.get_row(sid)})
        return meta, msg_id

    async def append_message(self, session_id: str, content: str, *, role: str = "user",
                             kind: str = "chat", parent_id: str | None = None,
                             metadata: dict[str, Any] | None = None) -> str:
        """Append a finished message (durably) on the current branch; a user
        message updates the preview and updated_at. Returns its id."""
        state = await self.load_session(session_id)
        if parent_id is not None and parent_id not in state.messages:
            raise NotFound("unknown_message", f"unknown message {parent_id!r}")
        if not valid_kind(role, kind) or not isinstance(content, str):
            raise BadRequest("bad_field", f"bad role {role!r}, kind {kind!r} or content")
        msg_id = new_session_id()
        await self.append_events(session_id, MessageCreated(
            msg_id=msg_id, role=role, kind=kind, parent_id=parent_id or state.head,  # type: ignore[arg-type]
            content=content, started_at=time.time(), metadata=metadata or {}))
        if role == "assistant":
            self.after_reply(session_id)
        return msg_id

    async def append_events(self, session_id: str, *events: Event) -> list[Appended]:
        """Append events to a session durably (its skipped log prefix checked first)."""
        await self.keeper.before_write(session_id)
        try:
            return await self.es.append_many(session_id, events)
        except UnknownSession:
            raise unknown_session(session_id) from None

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
        for attr, wire in TITLE_FIELDS.items():
            v = getattr(upd, attr)
            if v is not msgspec.UNSET and v != getattr(meta, attr):
                changed[wire] = v
                title_kw[attr] = v
        flag_kw = {}
        for attr in FLAG_FIELDS:
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
            await self.append_events(session_id, *events)  # the row's change is pushed by after_append
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
        meta = self.registry.get(session_id)
        if meta is None:
            return False
        owner = meta.owner
        for msg in [m for (sid, _), m in self.saver.active.items() if sid == session_id]:
            msg.abort_reason = "session deleted"
            msg.scope.cancel()
        # A damaged log takes no tombstone: its folder is removed at once (the
        # user asked). A crash during that removal leaves the session listed as
        # damaged again, or an orphan folder that verify reports.
        damaged = session_id in self.es and self.es.corruption(session_id) is not None
        try:
            seq = 0 if damaged else (await self.append_events(session_id, SessionDeleted()))[0].record.seq
        except NotFound:
            if self.worker is None or session_id in self.registry:
                raise
            # On a shared stream another worker's deletion came first (this
            # tombstone's conflict found the session gone): deleted all the same.
            self.hub.end(session_id, "session deleted")
            self.states.drop(session_id)
            self.notify("session_deleted", {"session_id": session_id}, owner)
            return True
        self.hub.end(session_id, "session deleted", seq=seq)
        self.states.drop(session_id)
        try:
            await self.keeper.remove(session_id)
        finally:
            # The tombstone is durable: the session is gone for every client even
            # if removing its folder failed (the next start finishes that).
            if damaged:
                self.registry.put(None, session_id)
            self.notify("session_deleted", {"session_id": session_id}, owner)
        return True

    # -- listing ------------------------------------------------------------

    def list_sessions(self, *, filters: dict[str, Any] | None = None, include_archived: bool = False,
                      archived: bool | None = None, offset: int = 0, limit: int | None = None,
                      owner: str | None = None) -> tuple[list[dict[str, Any]], int]:
        """Rows newest first (pure in memory), of `owner`'s sessions only unless
        it is None. Returns (rows, total before paging)."""
        try:
            metas, total = self.registry.select(filters=filters, include_archived=include_archived,
                                                archived=archived, offset=offset, limit=limit, owner=owner)
        except InvalidFilter as e:
            raise BadRequest("bad_filter", str(e)) from None
        views: dict[str | None, ProjectView | None] = {}  # one stat per project the rows name, not per project
        for m in metas:
            if m.project_id not in views:
                views[m.project_id] = self._project_view(m.project_id)
        return [row_of(m, views[m.project_id], self._damage(m.id)) for m in metas], total

    # -- projects ---------------------------------------------------------

    def list_projects(self, owner: str | None = None) -> list[ProjectView]:
        """The default project and `owner`'s (everyone's when None)."""
        return self.projects.list(owner)

    async def create_project(self, name: str, path: str, owner: str = "",
                             check: Callable[[], None] | None = None) -> ProjectView:
        """A project of `owner`; `check` runs under the project log's lock
        just before the write (a per-user cap that two requests must not pass together)."""
        p = await self.projects.create(name, path, owner, check)
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
        self.projects.get(project_id, meta.owner)  # a project of the session's owner
        current = meta.project_id or DEFAULT_PROJECT_ID
        if current == project_id:
            return {}
        if meta.message_count > 0:
            raise Conflict("project_frozen", FROZEN_ERROR)
        await self.append_events(session_id, ProjectBound(project_id=project_id))
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
        old, new = await self.projects.relocate(project_id, path, meta.owner)
        node_id = new_session_id()
        await self.append_events(session_id, ProjectRelocated(node_id=node_id, project_id=project_id,
                                                        old_path=old, path=new))
        # Every bound session's row shows the project's new path: say so.
        project = row_of(self.get_meta(session_id), self._project_view(project_id))["project"]
        for sid, m in list(self.registry.rows.items()):
            if (m.project_id or DEFAULT_PROJECT_ID) == project_id:
                self.notify("session_updated", {"id": sid, "project": dict(project)})
        return {"ok": True, "old_path": old, "path": new, "node_id": node_id}

    # -- titles -------------------------------------------------------------

    def after_reply(self, session_id: str) -> None:
        if self._nursery is not None and not self.shutting_down:
            self._nursery.start_soon(maybe_auto_title, self, session_id)

    # -- caches and checks --------------------------------------------------

    async def write_checkpoint(self) -> int:
        """Write index.json with every row whose state is durable. Returns rows written."""
        return await self.keeper.write_checkpoint()

    async def write_snapshot(self, session_id: str) -> bool:
        """Write a loaded session's snapshot.json as of a durable seq."""
        return await self.keeper.write_snapshot(session_id)

    def loaded(self, session_id: str) -> SessionState | None:
        """The session's state if it is loaded in memory."""
        return self.states.get(session_id)

    async def check_logs(self) -> int:
        """Check now what the start skipped reading (the local engine: the log
        prefixes its checkpoint let recovery skip). Returns how many sessions
        were quarantined."""
        return await self.keeper.check_logs()

    def quarantine(self, session_id: str, corrupt: CorruptRecord) -> None:
        """Damage found in a session's log: read-only from now on, its producers
        and subscribers ended, every client told."""
        self.es.quarantine(session_id, corrupt)
        self.saver.quarantined(session_id)
        self.hub.end(session_id, "session quarantined")
        row = self.get_row(session_id)
        self.notify("session_updated", {"id": session_id, "damaged": row["damaged"], "status": row["status"]})

    # -- startup / shutdown -------------------------------------------------

    def failure(self) -> BaseException | None:
        """Why the store accepts no more writes (a log or the project log
        failed to write or sync), or None."""
        return self.es.broken or self.projects.broken

    async def _shutdown(self) -> None:
        """Flush every saver, abort what still runs ("server shutdown"), write
        the registry checkpoint and the snapshots of the sessions whose
        messages just ended (at most STOP_SNAPSHOTS of them)."""
        self.shutting_down = True
        if self.es.broken is not None:
            return
        await self.abort_running("server shutdown")
        await self.keeper.at_stop()


@asynccontextmanager
async def running(store: SessionStore) -> AsyncIterator[SessionStore]:
    """The store's background work (its keeper's too), and its graceful stop."""
    es = store.es
    try:
        async with trio.open_nursery() as nursery:
            store._nursery = nursery
            nursery.start_soon(store.saver.run)
            store.keeper.start_background(nursery)
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


