"""A session store as a worker on a shared JetStream stream: how it opens.

The stream (created if missing) is replayed into the registry and the
running replies, from the stream's registry checkpoint and the messages
after it when one serves (else the whole stream); then the lease bucket,
the session store on that log with its Worker (worker.py), the projects
from the stream's project log, and the store's background work.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from sessionlog_store.eventstore.jetstream.leases import Leases
from sessionlog_store.eventstore.jetstream.natsio import default_prefix, enter_answered
from sessionlog_store.eventstore.jetstream.objects import StreamObjects, stream_facts
from sessionlog_store.eventstore.jetstream.projects import StreamProjectLog
from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog, open_jetstream_log
from sessionlog_store.eventstore.record import Record
from sessionlog_store.projections.registry import Registry
from sessionlog_store.projections.stream_fold import (CheckpointUnusable, RunningIndex, StreamFold, decode_checkpoint,
                                                      prune)
from sessionlog_store.projections.stream_fold import seed as seed_registry
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.store import SessionStore, running
from sessionlog_store.server.domain.titles import KeywordTitler, TitleGenerator
from sessionlog_store.server.scaleout.worker import CHECKPOINT_NAME, CheckpointStart, Checkpoints, Worker

log = logging.getLogger("sessionlog.worker")


@asynccontextmanager
async def open_worker_store(root: str, config: StoreConfig, *,
                            titler: TitleGenerator | None = None) -> AsyncIterator[SessionStore]:
    """A session store on the shared stream `config.backend` names, as one of
    its workers; background work lives until the block exits, and a normal or
    cancelled exit stops gracefully (sessionlog_store.server.stores picks it
    for a config with a backend).

    A start whose requests get no answer (the cluster electing a leader: a
    node was just lost) is made again from the start, for
    `config.publish_retry` seconds: every step of it is idempotent, and
    nothing has been served yet."""
    async with AsyncExitStack() as stack:
        store = await enter_answered(stack, lambda: _started(root, config, titler), retry_for=config.publish_retry,
                                     what="the worker's store")
        async with running(store) as ready:
            yield ready


@asynccontextmanager
async def _started(root: str, config: StoreConfig, titler: TitleGenerator | None) -> AsyncIterator[SessionStore]:
    """The worker's store, opened and started (not yet running)."""
    async with open_worker_log(config) as (stream, registry, leases, index, checkpoints):

        def keeper(s: SessionStore) -> Worker:  # (the worker keeps the store's checkpoints in the stream's bucket)
            return Worker(s, stream, leases, index, checkpoints, config.stream_checkpoint_interval)
        store = SessionStore(os.path.abspath(root), stream, config, titler or KeywordTitler(), keeper,
                             registry=registry)
        worker = store.keeper
        assert isinstance(worker, Worker)
        store.worker = worker
        await start_worker(store, worker, config)
        yield store


async def start_worker(store: SessionStore, worker: Worker, config: StoreConfig) -> None:
    """The registry came from the stream's replay; the projects are the
    stream's (every worker's); the sweeper, not the start, aborts the replies
    of dead workers (worker.py)."""
    t0 = time.monotonic()
    await store.projects.load(StreamProjectLog(worker.es))
    es, ckpt = worker.es, worker.checkpoints.start
    frm = (f"the checkpoint as of stream sequence {ckpt.position} ({ckpt.sessions} sessions, {ckpt.pruned} deleted "
           f"since) and {es.replayed} messages after it" if ckpt is not None else f"{es.replayed} messages")
    log.info("started worker %s on stream %s (%s): %d sessions from %s, in %.2f s; %d projects",
             es.worker, es.stream, ", ".join(config.backend), len(store.registry), frm,
             es.replay_seconds + time.monotonic() - t0, len(store.projects.list()) - 1)


@asynccontextmanager
async def open_worker_log(config: StoreConfig) -> AsyncIterator[tuple[JetStreamLog, Registry, Leases, RunningIndex,
                                                                         Checkpoints]]:
    """The shared stream (made if missing: `make_stream`) with the registry and the
    running replies folded from it (from the stream's registry checkpoint
    and the messages after it), the lease bucket and the checkpoints."""
    registry, running = Registry(), RunningIndex()
    ckpts = Checkpoints(StreamFold(config.stream) if config.stream_checkpoint_interval > 0 else None)

    def gone(sid: str, records: list[Record], end: int) -> None:
        # during the replay: an id deleted and made again (its tombstone purged unseen)
        registry.put(None, sid)
        running.drop(sid)

    async def seed(es: JetStreamLog) -> int:
        es.reset_listeners.append(gone)
        if ckpts.fold is not None:
            ckpts.objects = await StreamObjects.open(es, replicas=config.replicas)
            ckpts.start = await _seed(es, ckpts.objects, registry, running, ckpts.fold)
        return ckpts.start.position if ckpts.start is not None else 0
    t0 = time.monotonic()
    async with open_jetstream_log(list(config.backend), stream=config.stream,
                                  prefix=config.subject_prefix or default_prefix(config.stream), replicas=config.replicas,
                                  replay=True, listeners=[registry.apply, running.apply], seed=seed,
                                  retry_for=config.publish_retry, create=config.make_stream) as es:
        es.listeners.remove(registry.apply)  # the store's own listener folds the registry from now on
        es.reset_listeners.remove(gone)
        es.replay_seconds = time.monotonic() - t0
        leases = await Leases.open(es, ttl=config.lease_ttl, replicas=config.replicas)
        yield es, registry, leases, running, ckpts


async def _seed(es: JetStreamLog, objects: StreamObjects, registry: Registry, running: RunningIndex,
                fold: StreamFold) -> CheckpointStart | None:
    """Before the replay: the fold fed from the tail (every message), and the
    registry, the running replies and the log's sessions from the stream's
    checkpoint if one serves (a missing or unusable one: a full replay)."""
    es.stream_listeners.append(fold.take)
    try:
        facts = await stream_facts(es)
        fold.created = facts.created
        stored = await objects.get(CHECKPOINT_NAME)
        if stored is None:
            return None
        ckpt = decode_checkpoint(stored[0], es.stream, facts.created, facts.last_seq)
    except CheckpointUnusable as e:
        log.warning("the stream's registry checkpoint is unusable (%s): replaying the whole stream", e)
        objects.replace = True
        return None
    except Exception as e:  # noqa: BLE001 - a cache: the stream serves without it
        log.warning("could not read the stream's registry checkpoint (%s): replaying the whole stream", e)
        return None
    gone = prune(ckpt, facts.live)
    fold.seed(ckpt)
    seed_registry(ckpt, registry, running)
    for sid, pos in ckpt.positions.items():
        es.seed(sid, pos.seq, pos.end, pos.stream_seq)
    es.tail_position = ckpt.position
    return CheckpointStart(ckpt.position, len(ckpt.sessions), len(gone), ckpt.written_at)
