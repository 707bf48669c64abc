"""What keeps the actors from being idle: the answer ``wait_idle`` gives
when it times out, so that a test that waits for a retrying row says which
instance, how many tries, when the next one is due and what failed, instead
of only "not idle"."""

from __future__ import annotations

from collections.abc import Sequence

from ..store.actors import ActorStore, QueueRow

ROWS_READ = 200  # per tenant: enough to name the busiest instances
INSTANCES_SHOWN = 5
ERROR_CHARS = 200


async def busy_report(store: ActorStore, actors: Sequence[str], now_ms: int) -> str:
    """One paragraph: the instances with unfinished rows (the most attempted
    first: rows, processing, attempts, next try, last error), and the
    streams whose events are not fanned out yet."""
    lines: list[str] = []
    lagging: list[str] = []
    for tenant in await store.tenants():
        rows = await store.unfinished_rows(tenant, actors, ROWS_READ)
        by_instance: dict[str, list[QueueRow]] = {}
        for row in rows:
            by_instance.setdefault(row.instance_id, []).append(row)
        for instance_id, held in by_instance.items():
            lines.append(_instance_line(tenant, instance_id, held, now_ms))
        lagging += [f"{lag.path} in {tenant} ({lag.head - lag.through} events)" for lag in await store.fanout_lag(tenant)]
    parts = []
    if lines:
        more = f"; and {len(lines) - INSTANCES_SHOWN} more instances" if len(lines) > INSTANCES_SHOWN else ""
        parts.append("busy instances: " + "; ".join(lines[:INSTANCES_SHOWN]) + more)
    if lagging:
        parts.append("not fanned out yet: " + ", ".join(lagging[:INSTANCES_SHOWN]))
    return ". ".join(parts) or "nothing is left now (it became idle as the time ran out)"


def _instance_line(tenant: str, instance_id: str, rows: list[QueueRow], now_ms: int) -> str:
    first = rows[0]  # the most attempted
    processing = sum(r.status == "processing" for r in rows)
    said = [f"{first.actor} {instance_id} in {tenant}: {len(rows)} unfinished rows ({processing} processing)"]
    if first.status == "processing":  # attempts counts the running one
        said.append(f"attempt {first.attempts} running")
    elif first.attempts:
        due = (first.available_at - now_ms) / 1000
        said.append(f"attempt {first.attempts} failed, next try " + (f"in {due:.1f}s" if due > 0 else "due now"))
    if first.last_error:
        error = first.last_error if len(first.last_error) <= ERROR_CHARS else first.last_error[:ERROR_CHARS] + "…"
        said.append(f"last error: {error}")
    return ", ".join(said)
