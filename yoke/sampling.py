"""The gauges read from the database: actor queue depths, fan-out lag, open
failures, the schema version and the live workers (docs/production/metrics.md).

A ``Sampler`` reads them every ``metrics_sample_s`` in the background, so a
scrape answers from memory at once, also while the database is down: the
last values stay, and ``yoke_metrics_sample_age_seconds`` and
``yoke_metrics_sample_ok`` say how old they are and whether the last pass
worked.

Their series are bounded: a series exists only while its value is not 0
(a tenant with nothing queued, lagging or failed has none, and a tenant or
failure that is gone takes its series along), and at most
``metrics_max_tenants`` tenants have series of their own: those with most
rows; the others are summed under ``tenant="(other)"`` (a name no tenant
can have).
"""

from __future__ import annotations

import asyncio
import logging
import operator
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily
from prometheus_client.registry import Collector

from . import errors
from .clock import SYSTEM, Clock, wall_ms
from .store import OpenStore
from .store.faults import log_retried

if TYPE_CHECKING:
    from .failures import Failures

# tenant -> its failures inbox (``Runtime.failures``)
FailuresOf = Callable[[str], "Failures"]

log = logging.getLogger("yoke.sampling")

OTHER = "(other)"
STATUSES = ("pending", "processing", "dead")
FAILURE_AGES = (("under_1m", 60.0), ("under_1h", 3600.0), ("under_1d", 86400.0), ("over_1d", float("inf")))

QUEUE_DEPTH = Gauge(
    "yoke_actor_queue_rows", "Actor queue rows by status (sampled in the background; absent: 0)", ["tenant", "status"]
)
FANOUT_LAG = Gauge(
    "yoke_fanout_lag_events", "Events appended but not yet fanned out (sampled in the background; absent: 0)",
    ["tenant"],
)
FAILURES = Gauge(
    "yoke_failures", "Open failures (dead letters, halted subscriptions, skipped events) by kind, receiver"
    " (actor, copy, webhook, call, processor) and age since their last attempt (sampled; absent: 0)",
    ["tenant", "kind", "receiver", "age"],
)
FAILURE_OLDEST = Gauge(
    "yoke_failure_oldest_age_seconds", "Age of the oldest open failure of each kind (sampled; absent: none)",
    ["tenant", "kind"],
)


class Status(Collector):
    """The passes' own series, and the two sampled values without labels.
    Absent in a process that samples nothing (metrics_sample_s=0, or not
    started yet), so that no alert takes a process that does not sample for
    one whose passes fail, or a 0 for a value read."""

    def __init__(self) -> None:
        self.ok: bool | None = None  # the last pass's outcome (None: no pass ended yet)
        self.seconds = 0.0  # its duration
        self.last_success = 0.0  # the wall time of the last pass that worked (0: none)
        self.clock: Clock = SYSTEM  # the sampler's (it sets last_success)
        self.schema_version = 0
        self.live_workers = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self.ok is None:
            return
        yield GaugeMetricFamily("yoke_metrics_sample_ok", "1 if the last pass over the database worked, 0 if it"
                                " failed", value=1 if self.ok else 0)
        yield GaugeMetricFamily("yoke_metrics_sample_duration_seconds", "How long the last pass over the"
                                " database took", value=self.seconds)
        age = self.clock.wall() - self.last_success if self.last_success else -1
        yield GaugeMetricFamily("yoke_metrics_sample_age_seconds", "Seconds since the database-sampled gauges were"
                                " last read (-1: never yet)", value=age)
        if self.last_success:
            yield GaugeMetricFamily("yoke_schema_version", "The newest migration the database has applied"
                                    " (sampled)", value=self.schema_version)
            yield GaugeMetricFamily("yoke_workers_live", "Workers whose heartbeat is recent, across the database"
                                    " (sampled)", value=self.live_workers)


STATUS = Status()
REGISTRY.register(STATUS)


@dataclass
class Sample:
    """One pass's values, by tenant, before the bound is applied."""

    queue: dict[str, dict[str, int]] = field(default_factory=dict)  # tenant -> status -> rows
    lag: dict[str, int] = field(default_factory=dict)
    failures: dict[str, dict[tuple[str, str, str], int]] = field(default_factory=dict)  # (kind, receiver, age)
    oldest: dict[str, dict[str, float]] = field(default_factory=dict)  # tenant -> kind -> seconds
    schema_version: int = 0
    live_workers: int = 0

    def weight(self, tenant: str) -> int:
        return (sum(self.queue.get(tenant, {}).values()) + self.lag.get(tenant, 0)
                + sum(self.failures.get(tenant, {}).values()))


async def read(store_of: OpenStore, failures: FailuresOf, clock: Clock = SYSTEM) -> Sample:
    """Every tenant's values, from the store (a pass; ages by ``clock``)."""
    store = store_of()
    actors = store.actors
    sample = Sample()
    now = wall_ms(clock)
    for tenant in await actors.tenants():
        depth = await actors.queue_depth(tenant, None)
        sample.queue[tenant] = {s: getattr(depth, s) for s in STATUSES if getattr(depth, s)}
        sample.lag[tenant] = sum(lag.head - lag.through for lag in await actors.fanout_lag(tenant))
        counts: dict[tuple[str, str, str], int] = defaultdict(int)
        oldest: dict[str, float] = {}
        for kind, receiver, failed_at in await failures(tenant).ages():
            seconds = max(now - failed_at, 0) / 1000
            age = next(name for name, bound in FAILURE_AGES if seconds < bound)
            counts[(kind, receiver, age)] += 1
            oldest[kind] = max(oldest.get(kind, 0.0), seconds)
        sample.failures[tenant] = dict(counts)
        sample.oldest[tenant] = oldest
    sample.schema_version = await store.schema_version()
    sample.live_workers = len(await actors.live_workers())
    return sample


class Series:
    """One labelled gauge whose series are replaced as a whole by each pass:
    the label sets not given again are removed."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.shown: set[tuple[str, ...]] = set()

    def publish(self, values: dict[tuple[str, ...], float]) -> None:
        for labels in self.shown - values.keys():
            self.gauge.remove(*labels)
        for labels, value in values.items():
            self.gauge.labels(*labels).set(value)
        self.shown = set(values)


_SERIES = {g: Series(g) for g in (QUEUE_DEPTH, FANOUT_LAG, FAILURES, FAILURE_OLDEST)}


def _fold(per_tenant: dict[str, dict[Hashable, float]], named: set[str],
          combine: Callable[[float, float], float]) -> dict[tuple[str, ...], float]:
    """Series by (tenant, *key): the tenants outside ``named`` folded into OTHER."""
    out: dict[tuple[str, ...], float] = {}
    for tenant, values in per_tenant.items():
        label = tenant if tenant in named else OTHER
        for key, value in values.items():
            if not value:
                continue
            labels = (label, *(key if isinstance(key, tuple) else (key,)))
            out[labels] = combine(out[labels], value) if labels in out else value
    return out


def publish(sample: Sample, max_tenants: int) -> None:
    """Set the gauges from ``sample``: only values that are not 0, at most
    ``max_tenants`` tenants by name (most rows first), the rest as OTHER."""
    tenants = [t for t in sample.queue if sample.weight(t) or sample.oldest.get(t)]
    tenants.sort(key=lambda t: (-sample.weight(t), t))
    named = set(tenants[:max_tenants])
    plus = operator.add
    _SERIES[QUEUE_DEPTH].publish(_fold(sample.queue, named, plus))  # type: ignore[arg-type]
    _SERIES[FANOUT_LAG].publish(_fold({t: {(): lag} for t, lag in sample.lag.items()}, named, plus))
    _SERIES[FAILURES].publish(_fold(sample.failures, named, plus))  # type: ignore[arg-type]
    _SERIES[FAILURE_OLDEST].publish(_fold(sample.oldest, named, max))  # type: ignore[arg-type]
    STATUS.schema_version = sample.schema_version
    STATUS.live_workers = sample.live_workers


async def sample_once(
    store: OpenStore, failures: FailuresOf, *, max_tenants: int, clock: Clock = SYSTEM
) -> None:
    """One pass: read, then publish (a failed read leaves the last values)."""
    started = clock.monotonic()
    try:
        sample = await read(store, failures, clock)
    except (errors.RuntimeClosed, asyncio.CancelledError):
        raise
    except BaseException:
        STATUS.ok = False
        raise
    finally:
        STATUS.seconds = clock.monotonic() - started
    publish(sample, max_tenants)
    STATUS.ok = True
    STATUS.clock = clock
    STATUS.last_success = clock.wall()


class Sampler:
    """``sample_once`` now and then every ``metrics_sample_s`` after each pass
    ends (so a slow pass never overlaps the next), until stopped."""

    def __init__(
        self, store: OpenStore, failures: FailuresOf, *, interval_s: float, max_tenants: int,
        clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._failures = failures
        self._interval_s = interval_s
        self._max_tenants = max_tenants
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._run(), name="yoke-metrics-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def pass_once(self) -> None:
        """One pass now (``sample_once``)."""
        await sample_once(self._store, self._failures, max_tenants=self._max_tenants, clock=self._clock)

    async def _run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except errors.RuntimeClosed:
                return
            except Exception:  # the database is away: the last values stay, marked stale
                log_retried(log, "sampling the metrics failed")
            await asyncio.sleep(self._interval_s)
