"""Opening a data root's event store and closing it.

Theory of operation
-------------------
An open takes the root's lock (one process per data root), then, before
anything reads a log: reads the root's format (a newer build's root is
refused, storeformat.py), makes the folders, and writes back into the logs
what the journal a crash left holds (journal.py; whatever this store's
sync mode). Then the committer (and the log writer) and the journal's rounds
run until the block exits; everything appended inside the block is
committed before it does.

The committer is shielded from cancellation: a cancel of the caller's scope
(a stop signal, a timeout around the block) must not stop the one task that
makes the shielded finalizes of the shutdown durable. It ends when the block
is left, after the last batch and a last round (a clean stop leaves the logs
synced, no journal). Closing descriptors and the root lock is shielded too,
so a cancelled exit never leaks them.
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from .commit import JOURNAL_SYNC_INTERVAL, LOG_WRITE_INTERVAL, EventStore, SyncMode
from .fsio import OS_FILES, FileOps, lock_root
from .journal import JournalRecovery, apply_journal, journal_dir
from .log import SESSIONS_DIR
from .logfiles import MAX_OPEN_LOGS
from .storeformat import stamp_format


def prepare_root(fs: FileOps, root: str, journal: bool) -> JournalRecovery:
    """In a worker thread, before anything reads a log: the root's format
    checked (and stamped), the folders made, the journal written back."""
    stamp_format(fs, root)
    fs.makedirs(os.path.join(root, SESSIONS_DIR))
    fs.fsync_dir(os.path.join(root, SESSIONS_DIR))
    recovery = apply_journal(fs, root)
    if journal:
        fs.makedirs(journal_dir(root))
        fs.fsync_dir(journal_dir(root))
    fs.fsync_dir(root)
    return recovery


@asynccontextmanager
async def open_event_store(root: str, *, fs: FileOps = OS_FILES, sync_mode: SyncMode = "journal",
                           max_open: int = MAX_OPEN_LOGS,
                           journal_sync_interval: float = JOURNAL_SYNC_INTERVAL,
                           log_write_interval: float = LOG_WRITE_INTERVAL) -> AsyncIterator[EventStore]:
    """Open the store's write side; the committer runs until the block exits,
    and everything appended inside the block is committed before it does
    (see the module's header)."""
    store = EventStore(root, fs=fs, sync_mode=sync_mode, max_open=max_open,
                       journal_sync_interval=journal_sync_interval, log_write_interval=log_write_interval)
    lock_fd = lock_root(root)
    try:
        with trio.CancelScope(shield=True):
            store.journal_recovery = await trio.to_thread.run_sync(prepare_root, fs, root, store.journal)
        await trio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.release)
        os.close(lock_fd)
        raise
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.run)
            if store.journal:
                nursery.start_soon(store.rounds.loop)
            try:
                yield store
            finally:
                with trio.CancelScope(shield=True):
                    await store.stop()
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(store.release)
        os.close(lock_fd)
