"""The event store's errors: each says whose fault it is."""
from __future__ import annotations


class SessionlogError(Exception):
    """Base of every error this project raises on purpose: catch it to catch
    them all (the event store's, EventStoreError, and the service's,
    sessionlog_store.server.domain.errors.ServiceError)."""


class EventStoreError(SessionlogError):
    """Base of every error raised by eventstore/."""


class InvalidSessionId(EventStoreError, ValueError):
    """The caller passed a session id that is not a short file-name-safe token.

    Raised before any path is built from it, so nothing on disk is touched.
    """


class SessionExists(EventStoreError):
    """create was asked for a session id that already has a log."""


class UnknownSession(EventStoreError, KeyError):
    """The caller named a session that does not exist (or was deleted)."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}" if self.args else "unknown session"


class MessageFinished(EventStoreError):
    """The caller appended a progress or a finalize to a message whose
    finalize is in the log already (another worker stopped or swept it, or
    this one did): refused, nothing appended. Nothing follows a finalize."""

    def __init__(self, session_id: str, msg_id: str) -> None:
        super().__init__(session_id, msg_id)
        self.session_id, self.msg_id = session_id, msg_id

    def __str__(self) -> str:
        return f"session {self.session_id}: message {self.msg_id} is finalized already"


class SeqConflict(EventStoreError):
    """An append expected a different last seq: the optimistic-concurrency signal."""


class CorruptRecord(EventStoreError):
    """A record before the log's tail fails its checksum, does not parse, or breaks
    the seq order. This is damage, not a crash: the session is quarantined
    (read-only) and the log is never truncated automatically.

    Not raised for a torn tail (damage after the last good record): that is
    repaired on open, see TornTail.
    """

    def __init__(self, session_id: str, line_no: int, reason: str) -> None:
        super().__init__(session_id, line_no, reason)
        self.session_id = session_id
        self.line_no = line_no
        self.reason = reason

    def __str__(self) -> str:
        return f"session {self.session_id}: corrupt record at line {self.line_no}: {self.reason}"


class TornTail(EventStoreError):
    """A report (not raised on open): the log ended in a partial or damaged last
    record, which was copied beside the log and truncated away."""

    def __init__(self, session_id: str, kept_bytes: int, copy_path: str) -> None:
        super().__init__(session_id, kept_bytes, copy_path)
        self.session_id = session_id
        self.kept_bytes = kept_bytes
        self.copy_path = copy_path

    def __str__(self) -> str:
        return (f"session {self.session_id}: torn tail of {self.kept_bytes} bytes "
                f"truncated (copy kept at {self.copy_path})")


class SessionReadOnly(EventStoreError):
    """An append to a quarantined session: repair it with `sessionlog repair`."""


class RecordTooLarge(EventStoreError, ValueError):
    """The caller's event encodes to more than MAX_RECORD_BYTES."""


class StoreClosed(EventStoreError):
    """*Your* code closed the store (its `async with` block ended) and then used it."""


class StoreBroken(EventStoreError):
    """A write or fsync failed. The store accepts nothing more; restart it and it
    recovers from what is on disk. `__cause__` holds the OSError. A failed fsync
    is never retried: the kernel may have dropped the dirty pages already."""


class JournalUnapplied(EventStoreError):
    """A start cannot place acknowledged records the journal holds: a
    journaled session's log is missing and its records do not end in its
    deletion (the disk holding the sessions is not mounted, a folder is a
    dangling symlink). The operator's to fix; nothing was changed and the
    journal is kept, so a start after the fix loses nothing."""


class NewerFormat(EventStoreError):
    """The data root was written by a newer sessionlog-store (its FORMAT names
    a version this build cannot read): the operator's to fix by running the
    newer build. Nothing of the root was read or changed."""

    def __init__(self, root: str, found: int, readable: int) -> None:
        super().__init__(root, found, readable)
        self.root, self.found, self.readable = root, found, readable

    def __str__(self) -> str:
        return (f"the store at {self.root} has format {self.found}, written by a newer sessionlog-store; "
                f"this build reads formats up to {self.readable}: run the newer build (nothing was changed)")


class UnreadableFormat(EventStoreError):
    """The data root's FORMAT file names no version (damaged, or not ours)."""

    def __init__(self, root: str, head: bytes) -> None:
        super().__init__(root, head)
        self.root, self.head = root, head

    def __str__(self) -> str:
        return (f"the store at {self.root} has a FORMAT file that names no format ({self.head!r}); "
                f"it should hold one line such as 'sessionlog-store format 1' (nothing was changed)")


class ProjectsMoved(EventStoreError):
    """A shared project log: another writer appended to it since this one
    read it (catch up, check again, retry)."""


def leaf_errors(e: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in leaf_errors(sub)]
    return [e]
