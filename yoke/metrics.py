"""Prometheus metrics (one registry per process, served at /metrics)."""

from __future__ import annotations

import functools
import weakref
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

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

# --- memory (docs/memory.md; sampled at scrape) ------------------------------
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


def sample_memory(runtime: Any) -> None:  # a Runtime
    """Refresh the memory gauges from the runtime's in-process structures."""
    buffers = runtime.buffers
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
    WAKEUP_WAITERS.set(runtime.hub.waiters)
    APPENDERS.set(runtime.appends.appenders)


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
QUEUE_DEPTH = Gauge(
    "yoke_actor_queue_rows", "Actor queue rows by status (sampled at scrape)", ["tenant", "status"]
)
FANOUT_LAG = Gauge(
    "yoke_fanout_lag_events", "Events appended but not yet fanned out (sampled at scrape)", ["tenant"]
)


# --- subscriptions ------------------------------------------------------------

SUB_DELIVERED = Counter(
    "yoke_subscription_delivered_total", "Events acknowledged by a subscription's receiver",
    ["tenant", "path", "name"],
)
SUB_FAILURES = Counter(
    "yoke_subscription_failures_total", "Failed delivery attempts", ["tenant", "path", "name"]
)
SUB_LAG = Gauge(
    "yoke_subscription_lag_offsets",
    "Source head minus the cursor, as last seen by the process delivering it",
    ["tenant", "path", "name"],
)
SUB_HALTED = Gauge(
    "yoke_subscription_halted", "1 while the subscription is halted (set by the process that halted it)",
    ["tenant", "path", "name"],
)


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


async def sample_actor_gauges(actors) -> None:  # noqa: ANN001 - an ActorStore
    """Refresh the queue-depth and fan-out-lag gauges from durable rows."""
    for tenant in await actors.tenants():
        depth = await actors.queue_depth(tenant, None)
        for status in ("pending", "processing", "dead"):
            QUEUE_DEPTH.labels(tenant, status).set(getattr(depth, status))
        FANOUT_LAG.labels(tenant).set(sum(lag.head - lag.through for lag in await actors.fanout_lag(tenant)))


# --- the failures inbox (docs/failures.md; sampled at scrape) -------------------

FAILURES = Gauge(
    "yoke_failures", "Open failures (dead letters, halted subscriptions, skipped events) by kind, receiver"
    " (actor, copy, webhook, call, processor) and age since their last attempt (sampled at scrape)",
    ["tenant", "kind", "receiver", "age"],
)
FAILURE_OLDEST = Gauge(
    "yoke_failure_oldest_age_seconds", "Age of the oldest open failure of each kind (0: none; sampled at scrape)",
    ["tenant", "kind"],
)
FAILURE_AGES = (("under_1m", 60.0), ("under_1h", 3600.0), ("under_1d", 86400.0), ("over_1d", float("inf")))
_failure_series: dict[str, set[tuple[str, str, str]]] = {}  # per tenant: the series last set non-zero


async def sample_failure_gauges(runtime) -> None:  # noqa: ANN001 - a Runtime
    """Refresh the failure gauges from the inbox of every tenant."""
    from .events import now_ms
    from .failures import Failures
    from .failures.model import DEFAULT_RECEIVER, KINDS

    now = now_ms()
    for tenant in await runtime.store.actors.tenants():
        listed = await Failures(runtime, tenant).ages()
        # Every kind's series exist (0 when none); a receiver's only once it had
        # failures, set back to 0 when they are gone.
        counts = dict.fromkeys(_failure_series.get(tenant, set()), 0)
        counts.update({(kind, DEFAULT_RECEIVER[kind], age): 0 for kind in KINDS for age, _ in FAILURE_AGES})
        oldest = dict.fromkeys(KINDS, 0.0)
        for kind, receiver, failed_at in listed:
            seconds = max(now - failed_at, 0) / 1000
            age = next(name for name, bound in FAILURE_AGES if seconds < bound)
            key = (kind, receiver, age)
            counts[key] = counts.get(key, 0) + 1
            oldest[kind] = max(oldest[kind], seconds)
        for (kind, receiver, age), count in counts.items():
            FAILURES.labels(tenant, kind, receiver, age).set(count)
        _failure_series[tenant] = {key for key, count in counts.items() if count}
        for kind, seconds in oldest.items():
            FAILURE_OLDEST.labels(tenant, kind).set(seconds)
