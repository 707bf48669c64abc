"""The database-sampled gauges' bound (sampling.publish): no series for a
value of 0, at most metrics_max_tenants tenants by name (most rows first),
the rest summed under "(other)", and a tenant's series gone once it has
nothing to report (or is gone)."""

from __future__ import annotations

from prometheus_client import generate_latest

from yoke import sampling
from yoke.sampling import OTHER, Sample


def series(metric) -> dict[tuple[str, ...], float]:  # noqa: ANN001
    return {tuple(s.labels.values()): s.value for f in metric.collect() for s in f.samples}


def sample(**queues: int) -> Sample:
    """Tenants with that many pending rows (0: a tenant with nothing)."""
    s = Sample()
    for tenant, pending in queues.items():
        s.queue[tenant] = {"pending": pending} if pending else {}
        s.lag[tenant] = 0
        s.failures[tenant] = {("dead_letter", "actor", "under_1m"): 1} if pending > 5 else {}
        s.oldest[tenant] = {"dead_letter": float(pending)} if pending > 5 else {}
    return s


def test_only_values_other_than_zero_and_at_most_so_many_tenants():
    sampling.publish(sample(a=10, b=7, c=3, d=2, idle=0), max_tenants=2)
    assert series(sampling.QUEUE_DEPTH) == {("a", "pending"): 10, ("b", "pending"): 7, (OTHER, "pending"): 5}
    assert series(sampling.FANOUT_LAG) == {}  # no lag anywhere: no series at all
    assert series(sampling.FAILURES) == {("a", "dead_letter", "actor", "under_1m"): 1,
                                         ("b", "dead_letter", "actor", "under_1m"): 1}
    assert series(sampling.FAILURE_OLDEST) == {("a", "dead_letter"): 10, ("b", "dead_letter"): 7}
    assert 'tenant="idle"' not in generate_latest().decode()

    # Next pass: a emptied, b gone, c grew: their series follow.
    sampling.publish(sample(c=30, d=2), max_tenants=2)
    assert series(sampling.QUEUE_DEPTH) == {("c", "pending"): 30, ("d", "pending"): 2}
    assert series(sampling.FAILURES) == {("c", "dead_letter", "actor", "under_1m"): 1}
    sampling.publish(Sample(), max_tenants=2)
    assert series(sampling.QUEUE_DEPTH) == {} and series(sampling.FAILURE_OLDEST) == {}


def test_the_folded_oldest_age_is_the_largest():
    sampling.publish(sample(a=9, b=8, c=7), max_tenants=1)
    assert series(sampling.FAILURE_OLDEST) == {("a", "dead_letter"): 9, (OTHER, "dead_letter"): 8}
    assert series(sampling.FAILURES)[(OTHER, "dead_letter", "actor", "under_1m")] == 2
    sampling.publish(Sample(), max_tenants=1)


def test_a_process_that_samples_nothing_reports_no_pass():
    """No yoke_metrics_sample_ok (nor schema version, nor live workers) before
    a pass ended: a process with metrics_sample_s=0 is not a failing one."""
    status = sampling.Status()
    assert list(status.collect()) == []
    status.ok = False
    assert {f.name: f.samples[0].value for f in status.collect()} == {
        "yoke_metrics_sample_ok": 0, "yoke_metrics_sample_duration_seconds": 0, "yoke_metrics_sample_age_seconds": -1,
    }
    status.ok, status.last_success, status.schema_version, status.live_workers = True, 1.0, 26, 2
    values = {f.name: f.samples[0].value for f in status.collect()}
    assert (values["yoke_metrics_sample_ok"], values["yoke_schema_version"], values["yoke_workers_live"]) == (1, 26, 2)
