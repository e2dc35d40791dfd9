"""What a client may do, as its user, whatever carries the request: the
WebSocket (connection.py frames each answer with its request id) and the
HTTP API (api.py sends it as the body). Each action is one store call (or
a few) with the user's scoping (another user's session is as unknown as
none: docs/SECURITY.md), its quotas and an admin's audit line; nothing
here knows a transport.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sessionlog_store.eventstore.ids import new_session_id
from sessionlog_store.projections.session import SessionMeta, SessionState
from sessionlog_store.server.domain.errors import NotFound, ServiceError, unknown_session
from sessionlog_store.server.edge import protocol as p
from sessionlog_store.server.edge.auth import Principal

if TYPE_CHECKING:
    from sessionlog_store.server.domain.store import SessionStore
    from sessionlog_store.server.edge.producers import ExternalReply, Producers
    from sessionlog_store.server.edge.limits import Quotas

# Every read an admin makes of another user's sessions (docs/SECURITY.md).
audit = logging.getLogger("sessionlog.audit")


class OperationsHost(Protocol):
    """What the operations ask of their server (edge/ws.py's Server)."""
    store: SessionStore
    quotas: Quotas

    producer_timeout: float  # (the producers' silence bound)
    producers: Producers

    def push_projects(self, owner: str) -> None: ...
    async def start_reply(self, session_id: str, parent_id: str | None, user: str = "",
                          reserved: bool = False, reply_id: str | None = None) -> str: ...
    async def open_external_reply(self, session_id: str, user: str, *, kind: str, parent_id: str | None,
                                  role: str | None = None, metadata: dict[str, Any] | None = None,
                                  caller: str | None) -> ExternalReply: ...


class Operations:
    """One principal's actions (`run`). `watch(session_id)` is told of each
    session the client loaded or chatted in (the WebSocket pushes their new
    messages to it; the HTTP API ignores it)."""

    def __init__(self, server: OperationsHost, principal: Principal, remote: str = "?",
                 watch: Callable[[str], None] = lambda sid: None) -> None:
        self.server, self.store, self.principal, self.remote, self.watch = \
            server, server.store, principal, remote, watch

    # -- scoping (docs/SECURITY.md) -------------------------------------------

    def own(self, sid: str) -> SessionMeta:
        """A session this client may change: its user's, else unknown_session
        (as for an id that does not exist)."""
        return self.store.get_meta(sid, self.principal.user)

    def readable(self, sid: str, action: str) -> SessionMeta:
        """A session this client may read: its user's, or anyone's for an admin
        (logged)."""
        meta = self.store.get_meta(sid, self.principal.reads)
        if meta.owner != self.principal.user:
            audit.warning("admin %r: %s of session %s of user %r", self.principal.user, action, sid, meta.owner,
                          extra={"remote": self.remote})
        return meta

    def owners_shown(self, rows: list[dict[str, Any]], key: str = "id") -> list[dict[str, Any]]:
        """Rows an admin is sent say whose session each is (`owner`); a user's
        rows do not (they are all its own)."""
        if self.principal.admin:
            for row in rows:
                meta = self.store.registry.get(row[key])
                row["owner"] = meta.owner if meta is not None else ""
        return rows

    def _audit_all(self, action: str) -> None:
        if self.principal.admin:
            audit.warning("admin %r: %s over every user", self.principal.user, action, extra={"remote": self.remote})

    def projects_data(self) -> dict[str, Any]:
        return {"projects": p.to_wire(self.store.list_projects(self.principal.reads))}

    async def _create(self, **kw: Any) -> tuple[SessionMeta, str | None]:
        """A new session of this client's user, within its session limit."""
        user, quotas = self.principal.user, self.server.quotas
        quotas.check_sessions(user, self.store.registry.owned[user])
        quotas.creating[user] += 1
        try:
            return await self.store.create_session(owner=user, **kw)
        finally:
            quotas.creating[user] -= 1

    async def run(self, req: p.ClientAction) -> tuple[str, dict[str, Any]]:
        """Carry out one action as this user: the answer's kind and data (the
        WebSocket frames them with the request's id; the HTTP API sends the
        data as its body). Raises what the store or a check refuses."""
        store, user = self.store, self.principal.user
        match req:  # (every action of p.ClientAction but the WebSocket's own: subscriptions)
            case p.ListSessions() as r:
                self._audit_all("list_sessions")
                if r.since is not None:
                    changes = store.changes_since(r.since, self.principal.reads, owners=self.principal.admin)
                    if changes is not None:
                        return "sessions_changes", {"since": r.since, "rev": store.feed.position,
                                                    "changes": [{"type": k, "data": d} for k, d in changes]}
                rev = store.feed.position
                rows, total = store.list_sessions(filters=r.filters, include_archived=r.include_archived,
                                                  archived=r.archived, offset=r.offset, limit=r.limit,
                                                  owner=self.principal.reads)
                return "sessions_list", {"rows": self.owners_shown(rows), "total": total, "rev": rev,
                                             "relist": r.since is not None}
            case p.CreateSession() as r:
                meta, _ = await self._create(agent_id=r.agent_id, source=r.source, title=r.title,
                                             project_id=r.project_id)
                return "session_created", {"session": self.owners_shown([store.get_row(meta.id)])[0]}
            case p.LoadSession(session_id=sid, msg_id=through):
                meta = self.readable(sid, "load_session")
                state = await store.load_session(sid)
                head = None
                if through is not None:
                    if through not in state.messages:
                        raise NotFound("unknown_message", f"unknown message {through!r}")
                    head = state.leaf_of(through)
                if meta.owner == user:  # an admin's read of another's session is one read: it watches nothing
                    self.watch(sid)
                return "session_loaded", self.session_payload(sid, state, head)
            case p.SwitchBranch(session_id=sid, msg_id=mid):
                self.own(sid)
                head = await store.switch_branch(sid, mid)
                return "ok", {"action": "switch_branch", "session_id": sid, "head": head}
            case p.ListRunning():
                self._audit_all("list_running")
                return "running_list", {"running": self.owners_shown(store.list_running(self.principal.reads),
                                                                         "session_id")}
            case p.Search(query=text, limit=limit, offset=offset):
                self._audit_all("search")
                if store.search is None:
                    raise ServiceError("unavailable", "search is kept by the local store only (docs/PROTOCOL.md)")
                found = await store.search.search(text, owner=self.principal.reads, limit=limit, offset=offset)
                readable = {sid for sid in {h["session_id"] for h in found["hits"]}
                            if (m := store.registry.get(sid)) is not None  # (deleted since: not a hit)
                            and (self.principal.reads is None or m.owner == self.principal.reads)}  # (given away since)
                of_hit = {sid: store.get_row(sid) for sid in readable}
                found["hits"] = [{**h, "title": of_hit[h["session_id"]]["title"] or of_hit[h["session_id"]]["preview"] or "",
                                  "archived": of_hit[h["session_id"]]["archived"]}
                                 for h in found["hits"] if h["session_id"] in of_hit]
                return "search_results", found
            case p.Chat() as r:
                return await self.chat(r)
            case p.Stop(session_id=sid, msg_id=mid):
                self.own(sid)
                if not await store.stop_anywhere(sid, mid):
                    raise ServiceError("not_running", f"message {mid} is not running")
                return "ok", {"action": "stop", "msg_id": mid}
            case p.Retry(session_id=sid, msg_id=mid):
                self.own(sid)
                target = await store.retry_target(sid, mid)
                store.claim_turn(sid)
                try:
                    reserved = await store.reserve_reply(sid)  # (a shared stream: the turn across workers)
                    try:
                        reply_id = await self.server.start_reply(sid, target.parent_id or "", user,  # "": root
                                                                 reply_id=reserved)
                    except BaseException:
                        await store.reply_released(sid, reserved)
                        raise
                finally:
                    store.end_turn(sid)
                return "retry_started", {"session_id": sid, "retried": mid, "reply_id": reply_id}
            case p.RenameSession(session_id=sid, title=title, regenerate=regen):
                self.own(sid)
                if regen:
                    changed = await store.regenerate_title(sid)
                elif title is not None:
                    changed = await store.rename_session(sid, title)
                else:
                    raise ServiceError("bad_request", "rename_session needs a title or regenerate: true")
                return "ok", {"action": "rename_session", "changed": changed}
            case p.SetArchived(session_id=sid, archived=flag):
                return "ok", {"action": "set_archived", "changed": await self._update(sid, archived=flag)}
            case p.SetPinned(session_id=sid, pinned=flag):
                return "ok", {"action": "set_pinned", "changed": await self._update(sid, pinned=flag)}
            case p.SetUnread(session_id=sid, unread=flag):
                return "ok", {"action": "set_unread", "changed": await self._update(sid, unread=flag)}
            case p.DeleteSession(session_id=sid):
                self.own(sid)
                if not await store.delete_session(sid):
                    raise unknown_session(sid)
                return "ok", {"action": "delete_session", "session_id": sid}
            case p.SetSessionProject(session_id=sid, project_id=pid):
                self.own(sid)
                changed = await store.set_session_project(sid, pid)
                return "ok", {"action": "set_session_project", "changed": changed}
            case p.ListProjects():
                self._audit_all("list_projects")
                return "projects_list", self.projects_data()
            case p.CreateProject(name=name, path=path):
                quotas = self.server.quotas
                view = await store.create_project(  # the cap checked under the project log's lock
                    name, path, owner=user, check=lambda: quotas.check_projects(user, store.projects.count(user)))
                self.server.push_projects(user)
                return "project_created", {"project": p.to_wire(view)}
            case p.RelocateProject(session_id=sid, project_id=pid, path=path):
                self.own(sid)
                out = await store.relocate_project(sid, pid, path)
                self.server.push_projects(user)
                return "project_relocated", out
            case _:  # (the WebSocket's own actions: connection.py)
                raise ServiceError("bad_request", f"{type(req).__name__} is not an operation")

    async def append_message(self, sid: str, content: str, *, role: str = "user", kind: str = "chat",
                             parent_id: str | None = None, metadata: dict[str, Any] | None = None) -> str:
        """A finished message on the session's current branch (or under
        `parent_id`), durable on return: its id."""
        self.own(sid)
        if not content.strip() and role == "user":
            raise ServiceError("bad_field", "a user message must not be empty")
        return await self.store.append_message(sid, content, role=role, kind=kind, parent_id=parent_id,
                                               metadata=metadata)

    async def open_reply(self, sid: str, *, kind: str, parent_id: str | None, caller: str | None,
                         role: str | None = None, metadata: dict[str, Any] | None = None) -> ExternalReply:
        """A reply of this user's session that an external producer streams
        (edge/producers.py); its placeholder is durable on return."""
        self.own(sid)
        return await self.server.open_external_reply(sid, self.principal.user, kind=kind, parent_id=parent_id,
                                                     caller=caller, role=role, metadata=metadata)

    async def _update(self, sid: str, **fields: Any) -> dict[str, Any]:
        self.own(sid)
        return await self.store.update_session(sid, **fields)

    def session_payload(self, sid: str, state: SessionState, head: str | None = None) -> dict[str, Any]:
        """A session and one branch of its messages (the current one, or the one
        ending at `head`); each conversational message carries `siblings`: the
        ids sharing its parent, in creation order ("‹ 2/3 ›")."""
        messages = p.to_wire(state.branch(head))
        for m in messages:
            if m["caller"] is None:
                m["siblings"] = state.siblings(m["msg_id"])
        return {"session": self.owners_shown([self.store.get_row(sid)])[0], "messages": messages,
                "head": head or state.head,
                "seq": state.seq, "durable_seq": self.store.es.durable_seq(sid)}

    async def chat(self, r: p.Chat, new_id: str | None = None) -> tuple[str, dict[str, Any]]:
        """A user's message and the agent's reply; without `r.session_id` in a
        new session (named `new_id` when given: the AI SDK's chat id)."""
        store = self.store
        if not r.content.strip():
            raise ServiceError("bad_field", "a chat message must not be empty")
        user, quotas = self.principal.user, self.server.quotas
        quotas.start_reply(user)  # reserved before the user's message is written; the reply gives it back
        sid, reply_id, claimed = r.session_id, None, False
        try:
            if sid is not None:
                self.own(sid)
                store.claim_turn(sid)
                claimed = True
            else:
                sid = new_id or new_session_id()
            # On a shared stream, the reply's lease first (an election: refused, nothing written)
            reply_id = await store.reserve_reply(sid)
            if r.session_id is None:
                meta, msg_id = await self._create(session_id=sid, agent_id=r.agent_id or "default",
                                                  project_id=r.project_id, source=r.source or "web",
                                                  first_message=r.content)
            else:
                meta = self.own(sid)
                if r.project_id is not None and r.project_id != (meta.project_id or "default"):
                    await store.set_session_project(sid, r.project_id)
                msg_id = await store.append_message(sid, r.content)
        except BaseException:
            quotas.end_reply(user)
            if claimed and sid is not None:
                store.end_turn(sid)
            if sid is not None:
                await store.reply_released(sid, reply_id)
            raise
        assert msg_id is not None
        self.watch(sid)
        try:
            reply_id = await self.server.start_reply(sid, msg_id, user, reserved=True, reply_id=reply_id)
        except BaseException:
            await store.reply_released(sid, reply_id)  # (a reply that never started: its lease goes)
            raise
        finally:
            if claimed:
                store.end_turn(sid)  # (its placeholder is written: the running reply holds the turn now)
        return "chat_ack", {"session_id": sid, "msg_id": msg_id, "reply_id": reply_id}
