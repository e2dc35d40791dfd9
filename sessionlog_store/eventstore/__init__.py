"""eventstore/: the write side, one layer with two backends in rooms of their own.

Here: the contract every backend keeps (backend.py), the events (events.py),
record framing, checksum and scanning (record.py), errors (errors.py) and
session ids (ids.py): pure, no I/O. local/ is the local engine (a JSONL log
per session, group commit, the journal), jetstream/ the JetStream backend;
each says what it may import. This layer never imports projections/ or
server/. The names below are the library's: the local engine is the default.
"""
from .backend import Appended as Appended
from .backend import CommitStatistics as CommitStatistics
from .local.commit import EventStore as EventStore
from .local.commit import SyncMode as SyncMode
from .local.opening import open_event_store as open_event_store
from .errors import CorruptRecord as CorruptRecord
from .errors import EventStoreError as EventStoreError
from .errors import SessionlogError as SessionlogError
from .errors import InvalidSessionId as InvalidSessionId
from .errors import JournalUnapplied as JournalUnapplied
from .errors import RecordTooLarge as RecordTooLarge
from .errors import SessionExists as SessionExists
from .errors import SessionReadOnly as SessionReadOnly
from .errors import StoreBroken as StoreBroken
from .errors import StoreClosed as StoreClosed
from .errors import TornTail as TornTail
from .errors import UnknownSession as UnknownSession
from .local.fsio import OS_FILES as OS_FILES
from .local.fsio import FileOps as FileOps
from .local.fsio import atomic_write as atomic_write
from .ids import new_session_id as new_session_id
from .ids import validate_session_id as validate_session_id
from .record import Record as Record
from .record import decode_record as decode_record
from .record import encode_record as encode_record
