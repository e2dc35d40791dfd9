"""What the session store reads of its configuration (server/config.py's
StoreConfig has it, with each backend's options, which the domain never
reads): the saver's interval and slots, the stall bound, the state cache,
and the project rules."""
from __future__ import annotations

from typing import Protocol


class StoreSettings(Protocol):
    @property
    def progress_interval(self) -> float: ...
    @property
    def progress_slots(self) -> int | None: ...
    @property
    def stall_timeout(self) -> float: ...
    @property
    def state_cache(self) -> int: ...
    @property
    def home(self) -> str: ...
    @property
    def project_roots(self) -> tuple[str, ...]: ...
    @property
    def many_users(self) -> bool: ...
