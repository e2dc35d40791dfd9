"""The shapes of a session as clients change and see it: the fields
`update_session` accepts, the listing row, and the message roles and kinds."""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from sessionlog_store.projections.session import SessionMeta
from sessionlog_store.server.domain.projects import ProjectView


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


TITLE_FIELDS = {"title": "title", "user_titled": "_user_titled", "auto_titled": "_auto_titled",
                 "title_gen_count": "_title_gen_count"}
FLAG_FIELDS = ("pinned", "unread", "archived", "status")

def row_of(meta: SessionMeta, project: ProjectView | None, damaged: str | None = None) -> dict[str, Any]:
    """The 17-field listing row: the stored fields, preview and project; a
    quarantined session's row has an 18th, `damaged` (what is wrong)."""
    row = msgspec.to_builtins(meta)
    del row["open_msgs"]
    del row["owner"]  # a row is seen by its owner (or an admin) only
    if damaged is not None:
        row["damaged"] = damaged
        row["status"] = "idle"  # a damaged session is never written to: nothing runs in it
    row["project"] = None if project is None else {
        "id": project.id, "name": project.name, "path": project.path, "path_missing": project.path_missing}
    return row


_ROLES = {"user", "assistant", "tool", "system"}
_KINDS = {"chat", "llm_reply", "tool_call", "agentic_fn", "task_spawn", "merge", "relocate"}


def valid_kind(role: object, kind: object) -> bool:
    return role in _ROLES and kind in _KINDS
