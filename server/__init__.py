# server/: the application. store.py is the library API (commands -> events,
# queries -> projections) with inflight.py (throttled saver), subscriptions.py,
# titles.py and projects.py. protocol.py is pure (the WebSocket frames); socket
# I/O lives only in ws.py; cli.py is the `sessionlog` command.
from .errors import BadRequest as BadRequest
from .errors import Conflict as Conflict
from .errors import NotFound as NotFound
from .errors import ServiceError as ServiceError
from .store import SessionStore as SessionStore
from .store import StoreConfig as StoreConfig
from .store import open_session_store as open_session_store
