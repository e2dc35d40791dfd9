"""A session store's configuration: every tunable, with the spec's values
as defaults (`sessionlog serve` sets them from its flags): what the domain
reads (domain/settings.py names it), the local engine's and the JetStream
backend's options. It lives beside the openers that read all of it
(server/stores.py), not in the domain, which knows no backend."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from sessionlog_store.eventstore import SyncMode
from sessionlog_store.eventstore.local.commit import JOURNAL_SYNC_INTERVAL, LOG_WRITE_INTERVAL
from sessionlog_store.projections.maintenance import MaintenanceConfig
from sessionlog_store.server.domain.inflight import BATCH_TARGET, PROGRESS_INTERVAL, STALL_TIMEOUT


@dataclass(frozen=True)
class StoreConfig:
    """Every tunable of a store, with the spec's values as defaults."""
    checkpoint_interval: float = 5.0      # index.json debounce (spec: 5 s)
    snapshot_interval: float = 2.0        # snapshot.json debounce for running sessions
    progress_interval: float = PROGRESS_INTERVAL
    progress_slots: int | None = None     # phases of the saver's interval (None: SLOTS with the journal, else 1;
                                          # see server/domain/inflight.py SLOTS)
    progress_batch: int = BATCH_TARGET    # the saver wakes for several slots while a slot holds fewer running
                                          # messages than this (inflight.py BATCH_TARGET; 0: a wake-up per slot)
    stall_timeout: float = STALL_TIMEOUT
    maintenance: MaintenanceConfig = field(default_factory=MaintenanceConfig)
    sync_mode: SyncMode = "journal"       # see eventstore/local/commit.py and journal.py
    journal_sync_interval: float = JOURNAL_SYNC_INTERVAL  # logs synced and journal segments removed this often
    log_write_interval: float = LOG_WRITE_INTERVAL        # an acknowledged record waits in the journal at most this long for
                                                          # the next ones before its log is written (logwriter.py)
    home: str = field(default_factory=lambda: os.path.expanduser("~"))
    # Folders projects may lie under (() : the home directory only).
    project_roots: tuple[str, ...] = ()
    # Many users share the store (docs/SECURITY.md): the default project's
    # path (the home) is kept from clients, and a refused project path gets
    # one answer whatever is wrong with it (no probing of the server's disk).
    many_users: bool = False
    state_cache: int = 256                # loaded sessions kept in memory besides running ones
    # After startup, check in the background the part of each log that the
    # checkpoint let startup skip (damage there quarantines the session).
    check_after_start: bool = True
    # The event log: () the local JSONL logs under the root; NATS server URLs:
    # a JetStream stream shared with other workers (docs/SCALEOUT.md).
    backend: tuple[str, ...] = ()
    stream: str = "SESSIONLOG"
    subject_prefix: str = ""              # "": sl.<stream> (a session's subject: <prefix>.<id>)
    replicas: int = 3
    lease_ttl: float = 15.0
    publish_retry: float = 60.0           # a publish unanswered this long fails the store (the worker exits 5)
    stream_checkpoint_interval: float = 30.0  # the stream's registry checkpoint (scaleout.py; 0: none)
    make_stream: bool = True              # a worker makes the stream if missing (offboarding: no, a typo is an error)

