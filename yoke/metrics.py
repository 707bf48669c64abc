"""Prometheus metrics (one registry per process, served at /metrics)."""

from __future__ import annotations

import functools
import os
import subprocess
import weakref
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .build import __version__

APPENDS = Counter("yoke_stream_appends_total", "Events appended to streams", ["tenant"])
APPENDED_BYTES = Counter(
    "yoke_stream_appended_bytes_total", "UTF-8 bytes of the events appended to streams (as sized for limits)",
    ["tenant"],
)
APPEND_LATENCY = Histogram(
    "yoke_append_latency_seconds",
    "Time from an append call to its durable commit",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
OPEN_TAILS = Gauge("yoke_open_tails", "Live tails served over HTTP (SSE)")
HTTP_REQUESTS = Counter(
    "yoke_http_requests_total", "HTTP requests by route template, method and status", ["route", "method", "status"]
)
HTTP_REFUSED = Counter(
    "yoke_http_refused_total",
    "Requests answered or connections closed before routing, by reason (malformed, head_timeout,"
    " body_timeout, uri_too_long, headers_too_large, too_many_connections)",
    ["reason"],
)
HTTP_LATENCY = Histogram(
    "yoke_http_request_seconds", "HTTP request duration by route template", ["route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
)

# --- memory (docs/production/memory.md; sampled at scrape) ------------------------------
# No per-tenant labels: tenants are unbounded, so the largest tenant's share
# stands for them all.

EPHEMERAL_BYTES = Gauge(
    "yoke_ephemeral_bytes", "Bytes charged for the ephemeral events buffered in this process"
)
EPHEMERAL_EVENTS = Gauge("yoke_ephemeral_events", "Ephemeral events buffered in this process")
EPHEMERAL_STREAMS = Gauge("yoke_ephemeral_streams", "Streams with ephemeral events buffered in this process")
EPHEMERAL_TENANT_MAX = Gauge(
    "yoke_ephemeral_tenant_bytes_max", "Bytes charged for the ephemeral events of the tenant holding most"
)
EPHEMERAL_LIMIT = Gauge(
    "yoke_ephemeral_limit_bytes", "The ephemeral buffer caps (per stream, per tenant, per process)", ["scope"]
)
EPHEMERAL_EVICTED = Counter(
    "yoke_ephemeral_evicted_total", "Ephemeral events evicted, by the cap that evicted them", ["cap"]
)
EPHEMERAL_RELAYED = Counter(
    "yoke_ephemeral_relayed_total", "Ephemeral events received from other processes (PostgreSQL) and buffered"
)
EPHEMERAL_BARRIERS = Counter(
    "yoke_ephemeral_barriers_total",
    "Pings a read sent to make sure ephemeral events relayed from other processes had arrived",
)
GAPS_REPAIRED = Counter(
    "yoke_tail_gaps_repaired_total",
    "Live gaps repaired: events a tail's reread found that no wake-up had announced, by what made it reread",
    ["cause"],
)
WAKEUP_WAITERS = Gauge(
    "yoke_wakeup_waiters", "Waiters on stream wake-ups (tails, producers blocked on credit, deliveries)"
)
APPENDERS = Gauge("yoke_appenders", "Streams with appends queued or committing in this process")

_evictions_reported: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def sample_memory(buffers: Any, waiters: int, appenders: int) -> None:
    """Refresh the memory gauges from the in-process structures: the
    ephemeral buffers (``streams.ephemeral.EphemeralBuffers``), the hub's
    waiters and the appenders."""
    EPHEMERAL_BYTES.set(buffers.bytes)
    EPHEMERAL_EVENTS.set(buffers.events)
    EPHEMERAL_STREAMS.set(len(buffers))
    EPHEMERAL_TENANT_MAX.set(max(buffers.tenants().values(), default=0))
    EPHEMERAL_LIMIT.labels("stream").set(buffers.stream_bytes)
    EPHEMERAL_LIMIT.labels("tenant").set(buffers.tenant_bytes)
    EPHEMERAL_LIMIT.labels("process").set(buffers.process_bytes)
    reported = _evictions_reported.setdefault(buffers, {})
    for cap, count in buffers.evicted.items():
        EPHEMERAL_EVICTED.labels(cap).inc(count - reported.get(cap, 0))
        reported[cap] = count
    WAKEUP_WAITERS.set(waiters)
    APPENDERS.set(appenders)


# --- actors -------------------------------------------------------------------

PROCESSED = Counter(
    "yoke_actor_processed_total", "process() runs by actor and outcome (ok, failed, dead)",
    ["tenant", "actor", "outcome"],
)
PROCESS_SECONDS = Histogram(
    "yoke_actor_process_seconds", "Duration of process() by actor", ["actor"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 30),
)
PROCESS_START_LAG = Histogram(
    "yoke_actor_start_lag_seconds", "From a queue row's enqueue to the start of its process()",
    ["actor"], buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30, 300),
)
ATTEMPTS = Histogram(
    "yoke_actor_attempts", "The attempt number of each process() run", ["actor"],
    buckets=(1, 2, 3, 5, 10, 20),
)
# yoke_actor_queue_rows and yoke_fanout_lag_events: sampled from the
# database in the background (sampling.py).

# Worker membership (actors/membership.py): reaps this process made, and times
# this process found itself reaped and rejoined, by reason.
INSTANCES_RELEASED = Counter(
    "yoke_instances_released_total",
    "Instances this process's worker gave up for other workers to adopt (beyond its fair share when workers joined)",
)
WORKER_REAPS = Counter(
    "yoke_worker_reaps_total",
    "Workers this process reaped, by reason (stale: no heartbeat for worker_stale_s by the database's clock)",
    ["reason"],
)
WORKER_REJOINS = Counter(
    "yoke_worker_rejoins_total",
    "Times this process's worker found itself reaped and rejoined, by reason (loop_blocked,"
    " heartbeat_failed, heartbeat_slow, reaped_while_beating)",
    ["reason"],
)

# --- subscriptions ------------------------------------------------------------


class HeldSubscriptions(Collector):
    """``yoke_subscription_*``: the subscriptions this process delivers now
    (one ``Runner`` each), read from the runners when scraped. A series
    lives while a runner holds its subscription here: removed with the
    subscription, its stream, or the lease passing to another process (whose
    ``/metrics`` then has it; its counters start again from 0 there, which
    ``rate()`` takes as a reset). Labels: tenant and name, and the source
    stream's path only with ``metrics_path_labels`` (paths are unbounded);
    without it ``path`` is empty and subscriptions of one name in one tenant
    add up."""

    def __init__(self) -> None:
        self._snapshot: list[Any] = []

    def refresh(self, runners: list[Any], with_path: bool) -> None:
        """From ``runners``: the delivery engine's (``Deliveries.held()``)."""
        totals: dict[tuple[str, str, str], list[float]] = {}
        for r in runners:
            key = (r.row.tenant, r.row.path if with_path else "", r.row.name)
            sums = totals.setdefault(key, [0, 0, 0, 0])
            sums[0] += r.delivered
            sums[1] += r.failures
            sums[2] += r.lag
            sums[3] += 1 if r.halted else 0
        labels = ["tenant", "path", "name"]
        families = [
            CounterMetricFamily("yoke_subscription_delivered", "Events acknowledged by a subscription's receiver"
                                " (while this process delivers it)", labels=labels),
            CounterMetricFamily("yoke_subscription_failures", "Failed delivery attempts (while this process"
                                " delivers it)", labels=labels),
            GaugeMetricFamily("yoke_subscription_lag_offsets", "Source head minus the cursor, as last seen by"
                              " this process, which delivers it", labels=labels),
            GaugeMetricFamily("yoke_subscription_halted", "1 while the subscription is halted (the number"
                              " halted, when several share the labels)", labels=labels),
        ]
        for key, sums in totals.items():
            for family, value in zip(families, sums):
                family.add_metric(list(key), value)
        self._snapshot = families

    def collect(self) -> Any:
        return iter(self._snapshot)


SUBSCRIPTIONS = HeldSubscriptions()
REGISTRY.register(SUBSCRIPTIONS)


# --- operations (docs/production/metrics.md) ----------------------------------------

BUILD_INFO = Gauge("yoke_build_info", "1, labelled with this process's Yoke version and commit", ["version", "commit"])
DB_POOL = Gauge(
    "yoke_db_pool_connections", "PostgreSQL pool connections of this process: in_use, idle, max", ["state"]
)
DATABASE_ERRORS = Counter(
    "yoke_database_errors_total", "Database faults met by this process, by kind (the store's fault classes:"
    " connection_lost, connect_failed, cancelled, conflict, read_only, database_locked, io_error, disk_full)", ["kind"],
)
for _kind in ("connection_lost", "connect_failed", "cancelled", "conflict", "read_only", "database_locked", "io_error",
              "disk_full"):
    DATABASE_ERRORS.labels(_kind)
WORKER_HEARTBEATS = Counter("yoke_worker_heartbeats_total", "Worker heartbeats this process wrote")
WORKER_HEARTBEAT_FAILURES = Counter(
    "yoke_worker_heartbeat_failures_total", "Worker heartbeat passes that failed (the database; a bug)"
)
WORKER_LAST_HEARTBEAT = Gauge(
    "yoke_worker_last_heartbeat_timestamp_seconds", "When this process last wrote its worker heartbeat (Unix time)"
)


@functools.cache
def build_commit() -> str:
    """The commit this Yoke was built from: YOKE_BUILD_COMMIT (a build sets
    it), else the checkout's HEAD when running from one, else ``unknown``."""
    commit = os.environ.get("YOKE_BUILD_COMMIT", "").strip()
    if commit:
        return commit[:40]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
            text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else "unknown"


def announce_build() -> None:
    """Set yoke_build_info (once per process that serves metrics)."""
    BUILD_INFO.labels(__version__, build_commit()).set(1)


def sample_pool(sizes: tuple[int, int, int] | None) -> None:
    """The PostgreSQL pool's connections (``Store.pool_sizes``; SQLite has none)."""
    if sizes is None:
        return
    size, idle, most = sizes
    DB_POOL.labels("in_use").set(size - idle)
    DB_POOL.labels("idle").set(idle)
    DB_POOL.labels("max").set(most)


def exposition(
    buffers: Any, waiters: int, appenders: int, runners: list[Any], *, with_path: bool,
    pool: tuple[int, int, int] | None,
) -> bytes:
    """``/metrics``: the gauges kept in memory refreshed, then every series
    (``pool``: the store's ``pool_sizes()``, None without one). Never touches the
    database (its gauges are sampled in the background: sampling.py), so it
    answers while the database is down."""
    sample_memory(buffers, waiters, appenders)
    SUBSCRIPTIONS.refresh(runners, with_path)
    sample_pool(pool)
    return generate_latest(REGISTRY)


@functools.lru_cache(maxsize=65536)
def child(metric, *labels: str):  # noqa: ANN001, ANN202
    """``metric.labels(*labels)``, looked up once (it is costly per event)."""
    return metric.labels(*labels)


def observe_process(row, definition, ok: bool, seconds: float) -> None:  # noqa: ANN001
    """One finished process() run (``row``: the claimed QueueRow)."""
    if ok:
        outcome = "ok"
    elif row.attempts >= definition.max_attempts:
        outcome = "dead"
    else:
        outcome = "failed"
    child(PROCESSED, row.tenant, row.actor, outcome).inc()
    child(PROCESS_SECONDS, row.actor).observe(seconds)
    child(ATTEMPTS, row.actor).observe(row.attempts)
    if row.started_at is not None and row.attempts == 1:
        child(PROCESS_START_LAG, row.actor).observe(max(row.started_at - row.enqueued_at, 0) / 1000)
