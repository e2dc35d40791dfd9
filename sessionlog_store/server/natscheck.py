"""What a worker on a shared stream checks of the NATS servers before and
while it serves (docs/SCALEOUT.md, "The NATS servers"): each one's
monitoring endpoint (`/varz`) must say it fsyncs before it acknowledges
(`sync_interval: always`).

A start needs a quorum of the monitors given (a majority) to answer, each
of those synced; it waits, saying so, while fewer answer (the cluster's
quorum holds with one node of three down, and so does the worker's start).
Every server is checked again while the worker serves (one down at the
start, or one restarted since), and one that answers unsynced stops it.
"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any, Final

# How often a start checks again while fewer than a quorum answer, and how
# often a serving worker checks every server again.
RECHECK: Final = 1.0
LATE_RECHECK: Final = 5.0


class ServersUnfit(Exception):
    """A NATS server answered that it does not fsync before it acknowledges:
    the operator's to fix (or to accept with --nats-accept-unsynced)."""


def varz(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/varz", timeout=timeout) as r:
        return json.loads(r.read())


def check_one(url: str) -> bool:
    """True if the server at `url` answers synced; False if it does not
    answer; ServersUnfit if it answers unsynced."""
    try:
        v = varz(url)
    except (OSError, ValueError):
        return False
    config = (v.get("jetstream") or {}).get("config") or {}
    if not config.get("store_dir"):
        return False  # (a node still starting: its monitor answers before its JetStream is up)
    if not config.get("sync_always"):
        raise ServersUnfit(f"the NATS server at {url} (version {v.get('version', '?')}) does not fsync before "
                           "it acknowledges: set `jetstream { sync_interval: always }` (nats-server 2.10 or "
                           "later), or give --nats-accept-unsynced to accept losing acknowledged records")
    return True


def wait_for_quorum(monitors: list[str], say: Callable[[str], None],
                    sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Check every monitor until a majority answers synced (ServersUnfit at
    once if one answers unsynced), saying what it waits for when it waits.
    Returns the monitors that did not answer (to be checked again later)."""
    need = len(monitors) // 2 + 1
    said = ""
    while True:
        down = [url for url in monitors if not check_one(url)]
        if len(monitors) - len(down) >= need:
            if down:
                say(f"{len(monitors) - len(down)} of {len(monitors)} NATS servers answer (a quorum); "
                    f"not answering: {', '.join(down)} (checked again while serving)")
            return down
        line = (f"waiting for a quorum of the NATS servers: {len(monitors) - len(down)} of {len(monitors)} "
                f"answer, {need} needed (not answering: {', '.join(down)})")
        if line != said:
            say(line)
            said = line
        sleep(RECHECK)
