"""What startup maintenance removes, decided purely from the registry rows
(spec "Startup", steps 3-6). The server carries the plan out by appending
events; this module only decides."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .session import SessionMeta

DAY = 86400.0


@dataclass(frozen=True)
class MaintenanceConfig:
    """The spec's retention rules; 0 turns one off."""
    empty_shell_age: float = 3600.0      # a session with no message older than this is removed
    archive_ttl: float = 90 * DAY        # archived and not updated for this long: removed
    max_sessions: int = 1000             # registry cap per owner: its oldest archived removed first


@dataclass
class MaintenancePlan:
    to_idle: list[str] = field(default_factory=list)
    empty_shells: list[str] = field(default_factory=list)
    expired_archives: list[str] = field(default_factory=list)
    over_capacity: list[str] = field(default_factory=list)

    def summary(self, aborted: int = 0) -> str:
        """One line: what maintenance does (or would do) and why."""
        return (f"maintenance: removed {len(self.empty_shells)} empty shell(s), {len(self.expired_archives)} "
                f"expired archive(s), {len(self.over_capacity)} archived session(s) over capacity; "
                f"{len(self.to_idle)} session(s) back to idle, {aborted} message(s) aborted")

    def removals(self) -> list[tuple[str, str]]:
        return ([(s, "empty shell") for s in self.empty_shells]
                + [(s, "archive expired") for s in self.expired_archives]
                + [(s, "over capacity") for s in self.over_capacity])


def plan_maintenance(rows: Iterable[SessionMeta], now: float, cfg: MaintenanceConfig) -> MaintenancePlan:
    plan = MaintenancePlan()
    alive: list[SessionMeta] = []
    for m in rows:
        if m.status == "running":
            plan.to_idle.append(m.id)
        if cfg.empty_shell_age > 0 and m.message_count == 0 and now - m.created_at > cfg.empty_shell_age:
            plan.empty_shells.append(m.id)
        elif cfg.archive_ttl > 0 and m.archived and now - m.updated_at > cfg.archive_ttl:
            plan.expired_archives.append(m.id)
        else:
            alive.append(m)
    # The cap is per owner: one user's sessions never push out another's.
    by_owner: dict[str, list[SessionMeta]] = {}
    for m in alive:
        by_owner.setdefault(m.owner, []).append(m)
    for owned in by_owner.values():
        excess = len(owned) - cfg.max_sessions
        if cfg.max_sessions > 0 and excess > 0:
            archived = sorted((m for m in owned if m.archived), key=lambda m: (m.updated_at, m.id))
            plan.over_capacity += [m.id for m in archived[:excess]]
    return plan
