# eventstore/: the write side. Pure: events.py (the event union), record.py
# (line framing + checksum), ids.py (session-id validation). I/O: fsio.py (the
# seam under every file operation), log.py (layout, scan, torn-tail repair),
# commit.py (group commit: one committer task per store, syncs off the trio thread),
# journal.py (the write-ahead journal's frames, invariants and start-time write-back).
from .commit import Appended as Appended
from .commit import CommitStatistics as CommitStatistics
from .commit import EventStore as EventStore
from .commit import SyncMode as SyncMode
from .commit import open_event_store as open_event_store
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
from .fsio import OS_FILES as OS_FILES
from .fsio import FileOps as FileOps
from .fsio import atomic_write as atomic_write
from .ids import new_session_id as new_session_id
from .ids import validate_session_id as validate_session_id
from .record import Record as Record
from .record import decode_record as decode_record
from .record import encode_record as encode_record
