"""The application, in three kinds of subpackage: domain/ (the session store
API: commands -> events, queries -> projections, the in-flight saver,
subscriptions, titles, projects), agents/ (who answers a turn) and edge/ (HTTP
and WebSocket adapters, the wire protocol, metrics, the page). cli.py is the
`sessionlog` command and run.py the `serve` process that wires them.

The library's surface (re-exported by sessionlog_store): the store, the agent
interface, the in-flight handle, subscriptions, and one error hierarchy
(SessionlogError at its root)."""
from sessionlog_store.eventstore.errors import EventStoreError as EventStoreError
from sessionlog_store.eventstore.errors import SessionlogError as SessionlogError
from sessionlog_store.eventstore.errors import SessionReadOnly as SessionReadOnly
from sessionlog_store.eventstore.errors import StoreBroken as StoreBroken
from sessionlog_store.eventstore.errors import StoreClosed as StoreClosed
from sessionlog_store.eventstore.errors import UnknownSession as UnknownSession

from sessionlog_store.server.agents.base import Agent as Agent
from sessionlog_store.server.agents.demo import DemoAgent as DemoAgent
from sessionlog_store.server.domain.errors import BadRequest as BadRequest
from sessionlog_store.server.domain.errors import Conflict as Conflict
from sessionlog_store.server.domain.errors import NotFound as NotFound
from sessionlog_store.server.domain.errors import ServiceError as ServiceError
from sessionlog_store.server.domain.store import SessionStore as SessionStore
from sessionlog_store.server.config import StoreConfig as StoreConfig
from sessionlog_store.server.domain.inflight import InflightMessage as InflightMessage
from sessionlog_store.server.stores import open_session_store as open_session_store
from sessionlog_store.server.domain.subscriptions import MsgUpdate as MsgUpdate
from sessionlog_store.server.domain.subscriptions import Subscription as Subscription

__all__ = ["EventStoreError", "SessionlogError", "SessionReadOnly", "StoreBroken", "StoreClosed", "UnknownSession", "Agent", "DemoAgent", "BadRequest", "Conflict", "NotFound", "ServiceError", "SessionStore", "StoreConfig", "InflightMessage", "open_session_store", "MsgUpdate", "Subscription"]
