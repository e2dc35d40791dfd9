"""What a JetStream log (streamlog.py) knows of one session it writes: its
seqs, its fence (the stream sequence of its last message), the messages
another writer stored while this one had records in flight, and, after a
conflict, where its waiters go (the session read again, their seqs
renumbered, or refused)."""
from __future__ import annotations

import secrets
from collections.abc import Sequence

from ..errors import MessageFinished, UnknownSession
from ..events import Event, MessageFinalized, MessageProgress, SessionDeleted, SessionFlags
from ..record import Record, decode_record, encode_record


class StreamSession:
    __slots__ = ("last_seq", "durable_seq", "stream_seq", "end", "deleted", "born", "deferred", "moved_to",
                 "renumber", "refused", "finished", "tombstoned")

    def __init__(self) -> None:
        # Names this incarnation of the id in message ids: a session deleted and
        # made again within the stream's duplicate window is not taken for a retry.
        self.born = secrets.token_hex(4)
        self.last_seq = 0      # the last seq given
        self.durable_seq = 0   # the last seq acknowledged by the stream
        self.stream_seq = 0    # the stream sequence of the session's last message (the fence)
        self.end = 0           # bytes of the session's lines so far (as a log file would hold)
        self.deleted = False
        self.tombstoned = False  # this log appended its tombstone: nothing follows it
        # Other writers' messages the tail brought while this log had records of
        # the session not yet acknowledged: (data, stream seq), applied after
        # the ack, or read again by a rebase.
        self.deferred: list[tuple[bytes, int]] = []
        # After a conflict the session is a new _Session: waiters on this one
        # follow `moved_to`, their seqs renumbered, or get `refused`.
        self.moved_to: StreamSession | None = None
        self.renumber: dict[int, int] = {}
        self.refused: BaseException | None = None
        # The messages whose finalize this log has seen (appended here, the
        # tail's, a rebase's read): nothing of theirs is appended after it.
        self.finished: set[str] = set()

    def check_writable(self, session_id: str, events: Sequence[Event]) -> None:
        """Refuse, before anything is added: a session whose rebase failed
        (`refused`); anything of a message after its finalize, on any path
        (a producer whose reply was stopped or swept, by another worker or by
        this one; a second finalize): MessageFinished."""
        if self.refused is not None:
            raise self.refused
        if self.tombstoned:
            raise UnknownSession(session_id)  # (deleted here: a producer's last text after the tombstone)
        if self.finished:
            for ev in events:
                if type(ev) in (MessageProgress, MessageFinalized) and ev.msg_id in self.finished:  # type: ignore[union-attr]
                    raise MessageFinished(session_id, ev.msg_id)  # type: ignore[union-attr]

    def took(self, ev: Event) -> None:
        if type(ev) is MessageFinalized:
            self.finished.add(ev.msg_id)
        elif type(ev) is SessionDeleted:
            self.tombstoned = True

    @property
    def pending(self) -> bool:
        return self.last_seq > self.durable_seq

    def put_after(self, old: StreamSession, pending: Sequence[tuple[int, bytes]],
                  finalized: set[str]) -> tuple[list[tuple[int, bytes]], list[Record]]:
        """A rebase's step (streamlog.py), pure: this session is the one read
        again from the stream; `pending` the old one's lines the stream
        refused or that wait, put after what the stream holds, renumbered
        (`old.renumber` says where its waiters' seqs went). Each line's new
        (seq, line) and its record. A finalize or progress of a message in
        `finalized` (the other writer finalized it: a stop racing the reply's
        own end, two sweepers) is void now, nothing follows a finalize, and
        the idle flag that came with a dropped finalize goes too."""
        lines: list[tuple[int, bytes]] = []
        records: list[Record] = []
        dropped = False
        for old_seq, line in pending:
            rec = decode_record(line)
            ev = rec.event
            if (isinstance(ev, (MessageFinalized, MessageProgress)) and ev.msg_id in finalized) or \
                    (dropped and isinstance(ev, SessionFlags) and ev.status == "idle"):
                old.renumber[old_seq] = self.durable_seq
                dropped = isinstance(ev, MessageFinalized)
                continue
            dropped = False
            self.last_seq += 1
            self.took(ev)
            line = encode_record(self.last_seq, rec.ts, ev)
            self.end += len(line)
            old.renumber[old_seq] = self.last_seq
            lines.append((self.last_seq, line))
            records.append(Record(self.last_seq, rec.ts, ev))
        return lines, records
