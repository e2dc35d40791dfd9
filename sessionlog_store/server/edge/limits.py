"""Limits per principal (docs/SECURITY.md): sessions owned, replies running
at once, frames per second (a token bucket shared by all of a user's
connections) and bytes per frame. Each refusal has a stable error code and
is counted (`sessionlog_refusals_total{reason}`). Pure bookkeeping: the
connection asks, and sleeps when told to (so a flooding client is read
slower, and costs the loop no more than its rate).

The rate, as docs/SECURITY.md promises it: a user beyond its burst is
answered `rate_limited` once (that frame is not handled), and from then on
its frames are read no faster than its rate: each waits for its token
instead of being refused. It is told again only after its bucket has
refilled (it stayed under its rate for burst/rate seconds).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final

from sessionlog_store.server.domain.errors import ServiceError
from sessionlog_store.server.edge.protocol import MAX_FRAME

# Codes of the refusals (docs/PROTOCOL.md), also the metric's `reason` labels.
LIMIT_CODES: Final = ("auth", "limit_connections", "limit_sessions", "limit_projects", "limit_running",
                      "rate_limited", "frame_too_large")


@dataclass
class Limits:
    """0 is no limit. The defaults keep the single-user server as it was;
    `--auth` modes with many users get MULTI_USER unless flags say otherwise."""
    sessions: int = 0               # sessions one user may own
    running: int = 0                # replies one user may have running at once
    frames_per_second: float = 0.0  # frames one user may send, all its connections together
    burst: int = 0                  # frames above the rate taken at once (0: twice the rate)
    frame_bytes: int = MAX_FRAME    # bytes one frame may have
    connections: int = 0            # WebSocket connections one user may hold at once
    projects: int = 0               # projects one user may create


# Many users: generous for a person at a keyboard (a page sends a frame or
# two per action), tight for a script. Every one is a flag.
MULTI_USER: Final = Limits(sessions=1000, running=4, frames_per_second=20.0, burst=100, frame_bytes=256 * 1024,
                           connections=20, projects=100)


class Bucket:
    """A token bucket: `rate` tokens a second, up to `burst` saved. Every
    frame takes a token; one that finds none takes it on credit (the bucket
    goes below zero) and waits until it has been earned, except the first
    such frame since the bucket was last full, which is refused (`told`)."""
    __slots__ = ("rate", "burst", "tokens", "at", "told")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst = rate, float(burst or max(1, int(2 * rate)))
        self.tokens, self.at = self.burst, now
        self.told = False  # refused once since the bucket was last full

    def take(self, now: float) -> tuple[float, bool]:
        """Take one token: (seconds until it has been earned, 0.0 if it was
        there; whether this frame is the one refused)."""
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= self.burst:
            self.told = False  # back under its rate: a new flood is told again
        self.tokens -= 1.0
        if self.tokens >= 0.0:
            return 0.0, False
        refused, self.told = not self.told, True
        return -self.tokens / self.rate, refused


class Quotas:
    """The live counts the limits are checked against, per user."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.refused: Counter[str] = Counter()  # by LIMIT_CODES
        self.running: Counter[str] = Counter()  # replies running (or starting) per user
        self.creating: Counter[str] = Counter()  # sessions being created per user
        # Kept after a user's last connection closes: reconnecting gives no fresh burst.
        self._buckets: dict[str, Bucket] = {}
        # When a user over its rate may be read again, by all its connections.
        self._resume_at: dict[str, float] = {}
        self._connections: Counter[str] = Counter()

    def refuse(self, code: str, message: str) -> ServiceError:
        self.refused[code] += 1
        return ServiceError(code, message)

    # -- connections and frames ----------------------------------------------

    def may_connect(self, user: str) -> bool:
        """Count a connection of `user` (disconnected() gives it back), or refuse it."""
        lim = self.limits.connections
        if lim and self._connections[user] >= lim:
            self.refused["limit_connections"] += 1
            return False
        self._connections[user] += 1
        return True

    def disconnected(self, user: str) -> None:
        self._connections[user] -= 1
        if self._connections[user] <= 0:
            del self._connections[user]

    def check_frame(self, user: str, size: int, now: float) -> tuple[ServiceError | None, float]:
        """Why a frame of `size` bytes from `user` is refused (or None), and
        how long it waits for its token first (0.0: none; a refused
        `rate_limited` frame is answered at once, and the user's next read
        waits instead: `read_pause`)."""
        lim = self.limits
        wait = 0.0
        if lim.frames_per_second > 0:  # every frame takes a token, a too large one too
            bucket = self._buckets.get(user)
            if bucket is None:
                bucket = self._buckets[user] = Bucket(lim.frames_per_second, lim.burst, now)
            wait, refused = bucket.take(now)
            if wait:  # none of the user's connections is read before this token is earned
                self._resume_at[user] = max(self._resume_at.get(user, now), now + wait)
            if refused:
                return self.refuse("rate_limited", f"more than {lim.frames_per_second:g} frames a second; "
                                   "this one was not handled, and your next frames are read at that rate"), wait
        if size > lim.frame_bytes:
            return self.refuse("frame_too_large", f"a frame may have at most {lim.frame_bytes} bytes"), wait
        return None, wait

    def read_pause(self, user: str, now: float) -> float:
        """How long any connection of `user` waits before reading its next frame."""
        at = self._resume_at.get(user)
        if at is None:
            return 0.0
        if at <= now:
            del self._resume_at[user]
            return 0.0
        return at - now

    # -- sessions and replies ------------------------------------------------

    def check_sessions(self, user: str, owned: int) -> None:
        lim = self.limits.sessions
        if lim and owned + self.creating[user] >= lim:
            raise self.refuse("limit_sessions", f"you have {lim} sessions, the most allowed: delete some first")

    def check_projects(self, user: str, owned: int) -> None:
        lim = self.limits.projects
        if lim and owned >= lim:
            raise self.refuse("limit_projects", f"you have {lim} projects, the most allowed")

    def check_running(self, user: str) -> None:
        """Refuse (before anything is written) a reply `user` may not start."""
        lim = self.limits.running
        if lim and self.running[user] >= lim:
            raise self.refuse("limit_running", f"you have {lim} replies running, the most allowed: "
                              "wait for one to end or stop one")

    def start_reply(self, user: str) -> None:
        """Reserve a running reply for `user` (end_reply gives it back)."""
        self.check_running(user)
        self.running[user] += 1

    def end_reply(self, user: str) -> None:
        self.running[user] -= 1
        if self.running[user] <= 0:
            del self.running[user]
