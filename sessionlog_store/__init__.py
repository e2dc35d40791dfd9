"""sessionlog: a durable, event-sourced session store for AI-agent chat apps.

The one import package of the `sessionlog-store` distribution. Its layers,
each a subpackage that imports only the ones above it in this list:

    eventstore   the write side: events, record framing, logs, group commit, journal
    projections  the read side: pure folds, checkpoints, recovery, rebuild/verify
    server       the application: domain/ (the session store API), agents/ (who
                 answers a turn), edge/ (HTTP, WebSocket, protocol, metrics, the
                 page), and the `sessionlog` command that wires them

The library's surface is re-exported here:

    from sessionlog_store import open_session_store, Agent, InflightMessage
"""
from sessionlog_store.server import *  # noqa: F403 (the surface is server's __all__)
from sessionlog_store.server import __all__ as __all__
from sessionlog_store.server.version import version as _version

__version__ = _version()
