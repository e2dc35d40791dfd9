"""The generic streams' space on the JetStream backend: a stream of its own
beside the sessions' (`<stream>-DS`, one subject a stream's log:
`ds.<stream>.<log id>`), shared by every worker.

Each worker folds every worker's records from its tail (`on_remote`), so any
worker serves any stream, live readers included. A stream's log id is the
same on every worker (a hash of its owner and name): two workers making one
name race for one log, and the loser finds the winner's stream. The log
refuses an append that another worker's beat to it (`refuse_conflicts`)
instead of rebasing it: the space folds the log again (`on_reset`) and
checks the append anew, so that a producer's sequence, Stream-Seq and a
closure hold across workers as on one (an append after another worker's
close is refused, a producer's retry through another worker is a
duplicate)."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from sessionlog_store.eventstore.jetstream.streamlog import JetStreamLog, open_jetstream_log
from sessionlog_store.server.config import StoreConfig
from sessionlog_store.server.domain.streamspace import StreamSpace


def space_stream(config: StoreConfig) -> tuple[str, str]:
    """The JetStream stream of a worker's generic streams, and its subjects' prefix."""
    return f"{config.stream}-DS", f"ds.{config.stream}"


@asynccontextmanager
async def open_shared_stream_space(config: StoreConfig) -> AsyncIterator[StreamSpace]:
    """The space every worker on `config.stream` shares (its stream made if
    missing), every stream on it folded when the block starts, its sweeper
    running until the block exits."""
    spaces: list[StreamSpace] = []

    async def attach(es: JetStreamLog) -> int:  # (before the replay: it reaches the space)
        space = StreamSpace(es, shared=True, catch_up=es.caught_up, purge_tombstoned=es.purge_tombstoned)
        es.remote_listeners.append(space.on_remote)
        es.reset_listeners.append(space.on_reset)
        spaces.append(space)
        return 0
    stream, prefix = space_stream(config)
    async with open_jetstream_log(list(config.backend), stream=stream, prefix=prefix, replicas=config.replicas,
                                  replay=True, seed=attach, retry_for=config.publish_retry,
                                  refuse_conflicts=True):
        space = spaces[0]
        async with trio.open_nursery() as nursery:
            await nursery.start(space.run)
            yield space
            nursery.cancel_scope.cancel()
