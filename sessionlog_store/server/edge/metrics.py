"""What an operator scrapes: `GET /metrics` (Prometheus text format through
prometheus_client), and what `GET /readyz` answers.

Two kinds of figures: histograms fed as things happen (a commit batch's
append-to-durable time and size, from the event store's batch listeners),
and everything else read from the live objects when scraped (a custom
collector), so nothing on the hot path counts twice. A scrape costs the
same with 30,000 sessions as with 3: what it reads are counts the registry
and the event log keep as they change, never a walk over the sessions. The
process's own figures (open descriptors and their limit, RSS, CPU seconds,
start time: `process_*`) come from prometheus_client's ProcessCollector.
One registry per server (no process-global state: tests run several servers
in a process).

`/metrics` needs no token: it holds counts and timings only, never a session
id, a title or any content (docs/API.md, "Operating it").
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from sessionlog_store.server.edge.limits import LIMIT_CODES

if TYPE_CHECKING:
    from collections.abc import Collection

    from sessionlog_store.server.domain.store import SessionStore
    from sessionlog_store.server.edge.limits import Quotas


class MetricsHost(Protocol):
    """What the metrics read of a server (edge/ws.py's Server)."""
    store: SessionStore
    quotas: Quotas
    dropped: int
    live_reads: int

    @property
    def connections(self) -> Collection[Any]: ...

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 50, 100, 500, 1000, 5000, 10000, 50000)


class ServerMetrics(Collector):
    """The metrics of one server and its store."""

    def __init__(self, server: MetricsHost) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=True)
        self.durable = Histogram("sessionlog_append_durable_seconds",
                                 "Time from a commit batch's first record to the batch being durable",
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.batch = Histogram("sessionlog_batch_records", "Records per commit batch",
                               buckets=_BATCH_BUCKETS, registry=self.registry)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)
        server.store.es.batch_listeners.append(self._on_batch)

    def _on_batch(self, records: int, opened: float, durable: float) -> None:
        self.durable.observe(max(0.0, durable - opened))
        self.batch.observe(records)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        server = self.server
        store = server.store
        es = store.es
        st = es.statistics()
        yield _counter("sessionlog_batches", "Commit batches made durable", st.batches)
        yield _counter("sessionlog_records_appended", "Records made durable", st.records)
        yield _counter("sessionlog_bytes_appended", "Bytes of records made durable", es.bytes_appended)
        yield _counter("sessionlog_files_synced", "Session logs written per batch, summed", st.files_synced)
        yield _counter("sessionlog_log_syncs", "Journal rounds: logs synced and segments removed", st.log_syncs)
        yield _counter("sessionlog_saver_ticks", "Saver slot flushes", store.saver.ticks)
        yield _counter("sessionlog_saver_late_ticks",
                       "Saver slot flushes more than one interval late", store.saver.late_ticks)
        yield _counter("sessionlog_dropped_clients", "Connections dropped for not taking frames", server.dropped)
        yield _gauge("sessionlog_inflight_messages", "Messages being produced here", len(store.saver.active))
        yield _gauge("sessionlog_subscribers", "Message subscriptions", store.hub.count())
        yield _gauge("sessionlog_connections", "Open WebSocket connections", len(server.connections))
        yield _gauge("sessionlog_stream_reads", "Stream requests (/v1/stream/) being answered: SSE, long-polls, "
                     "reads and appends", server.live_reads)
        yield _gauge("sessionlog_send_queue_frames", "Frames queued to clients, all connections",
                     sum(c.unsent for c in server.connections))
        refusals = CounterMetricFamily("sessionlog_refusals", "Requests refused: credentials and per-user limits",
                                       labels=["reason"])
        for reason in LIMIT_CODES:
            refusals.add_metric([reason], server.quotas.refused[reason])
        yield refusals
        yield _gauge("sessionlog_users_connected", "Users with at least one connection",
                     len({c.principal.user for c in server.connections}))
        sessions = GaugeMetricFamily("sessionlog_sessions", "Sessions by state", labels=["state"])
        registry = store.registry
        sessions.add_metric(["active"], len(registry) - registry.archived)
        sessions.add_metric(["archived"], registry.archived)
        sessions.add_metric(["quarantined"], len(es.quarantined))
        yield sessions
        rec, worker = store.recovery, store.worker
        yield _gauge("sessionlog_recovery_seconds", "How long the last start's recovery (a worker: the replay "
                     "of the stream) took", rec.seconds if rec is not None else
                     worker.start_seconds if worker is not None else 0.0)
        info = InfoMetricFamily("sessionlog_backend", "The event log's backend")  # sessionlog_backend_info
        info.add_metric([], {"backend": worker.backend if worker is not None else "local", "sync_mode": st.sync_mode,
                             "stream": worker.name if worker is not None else ""})
        yield info
        if worker is not None:  # what a shared log's worker counts (server/scaleout/worker.py)
            for kind, name, doc, value in worker.figures():
                yield (_counter if kind == "counter" else _gauge)(name, doc, value)
        yield _gauge("sessionlog_store_ok", "1 while the store accepts writes, 0 once it failed",
                     0 if store.failure() is not None else 1)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def readiness(server: MetricsHost) -> str | None:
    """Why the server is not ready (recovered and writable), or None."""
    failure = server.store.failure()
    if failure is not None:
        return "store failed (the log says why)"
    if server.store.shutting_down:
        return "shutting down"
    return None
