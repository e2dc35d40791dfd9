# server/: the application. store.py is the library API (commands -> events,
# queries -> projections) with inflight.py (throttled saver), subscriptions.py,
# titles.py and projects.py. protocol.py is pure (the WebSocket frames); socket
# I/O lives only in ws.py; cli.py is the `sessionlog` command.
# The library's surface: the store, the agent interface, the in-flight handle,
# subscriptions, and one error hierarchy (SessionlogError at its root).
from eventstore.errors import EventStoreError as EventStoreError
from eventstore.errors import SessionlogError as SessionlogError
from eventstore.errors import SessionReadOnly as SessionReadOnly
from eventstore.errors import StoreBroken as StoreBroken
from eventstore.errors import StoreClosed as StoreClosed
from eventstore.errors import UnknownSession as UnknownSession

from .agent import Agent as Agent
from .agent import DemoAgent as DemoAgent
from .errors import BadRequest as BadRequest
from .errors import Conflict as Conflict
from .errors import NotFound as NotFound
from .errors import ServiceError as ServiceError
from .store import SessionStore as SessionStore
from .store import StoreConfig as StoreConfig
from .inflight import InflightMessage as InflightMessage
from .store import open_session_store as open_session_store
from .subscriptions import MsgUpdate as MsgUpdate
from .subscriptions import Subscription as Subscription
