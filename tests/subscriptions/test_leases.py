"""Leases and idle cost (subscriptions/deliveries.py, leases.py), both backends.

- Idle subscriptions cost no round trips: 300 copy subscriptions with
  nothing to deliver, in a runtime whose store counts every call of the
  storage contract; over a window of 3 s the runtime makes a handful of
  calls (heartbeats, its other background passes), not one per
  subscription (before: each runner read its source every second, and the
  sweep renewed every lease every second).
- Two processes share the subscriptions, each about half; when one leaves,
  the other takes them all over, and every copy is delivered throughout
  (before: the first process took every lease).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from pathlib import Path

import yoke
from yoke.config import Settings
from yoke.runtime import Runtime

from .common import until

T = "default"
IDLE = 300
WINDOW_S = 3.0
SHARED = 200


def count_calls(store: object) -> Counter[str]:
    """Count every call of the storage contract's methods on ``store``
    (the calls still run)."""
    counts: Counter[str] = Counter()
    for part in (store, store.subscriptions, store.actors, store.outbox, store.protocol):  # type: ignore[attr-defined]
        for name, _ in inspect.getmembers(type(part), inspect.iscoroutinefunction):
            if not name.startswith("_"):
                setattr(part, name, _counted(getattr(part, name), counts, name))
    return counts


def _counted(method, counts: Counter[str], name: str):  # noqa: ANN001, ANN202
    async def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        counts[name] += 1
        return await method(*args, **kwargs)

    return call


async def subscribe_copies(url: str, count: int, data_dir: Path) -> None:
    async with yoke.open(url, executor=False, data_dir=str(data_dir)) as y:
        for i in range(count):
            await y.stream(f"/src/{i}", T).subscribe(f"copy{i}", yoke.copy_to_stream(f"/dst/{i}"))


async def test_idle_subscriptions_cost_no_round_trips(fresh_url: str, tmp_path: Path) -> None:
    await subscribe_copies(fresh_url, IDLE, tmp_path)
    runtime = Runtime(Settings.from_env(database_url=fresh_url, data_dir=str(tmp_path)))
    calls = count_calls(runtime._store)
    await runtime.start()
    try:
        deliveries = runtime.deliveries
        assert deliveries is not None and runtime.catalogues is not None
        await runtime.catalogues  # the start's own work: each new subscription's catalogue recorded
        # Every runner started and read its source once: now they are idle.
        await until(lambda: _settled(deliveries, calls), bool, timeout_s=60)
        calls.clear()
        await asyncio.sleep(WINDOW_S)  # the window measured
        made = dict(calls)
    finally:
        await runtime.close()
    assert made.get("read", 0) < IDLE // 10, made
    assert sum(made.values()) < 50, made


async def _settled(deliveries, calls: Counter[str]) -> bool:  # noqa: ANN001
    return len(deliveries._runners) == IDLE and calls["read"] >= IDLE


async def test_two_processes_share_the_subscriptions_and_hand_them_over(fresh_url: str, tmp_path: Path) -> None:
    await subscribe_copies(fresh_url, SHARED, tmp_path)
    # Sweeps often: SQLite has no notifications between processes.
    settings = {"subscription_sweep_s": 0.2, "data_dir": str(tmp_path)}
    a_cm = yoke.open(fresh_url, **settings)
    a = await a_cm.__aenter__()
    try:
        async with yoke.open(fresh_url, **settings) as b:
            owners = (a.deliveries.owner, b.deliveries.owner)

            async def held() -> Counter[str | None]:
                return Counter(r.lease_owner for r in await a.store.subscriptions.leases(T))

            # About half each (each is preferred for a share: 100 +- 7 at one sigma).
            await until(held, lambda h: sum(h[o] for o in owners) == SHARED and min(h[o] for o in owners) >= SHARED // 4,
                        timeout_s=30)
            await asyncio.gather(*(a.stream(f"/src/{i}", T).append({"type": "x", "payload": i}) for i in range(SHARED)))
            await _all_copied(a, 1)
            await a_cm.__aexit__(None, None, None)  # a leaves: b takes every subscription over
            after = await until(
                lambda: b.store.subscriptions.leases(T),
                lambda rows: all(r.lease_owner == owners[1] for r in rows), timeout_s=30,
            )
            assert len(after) == SHARED
            await asyncio.gather(*(b.stream(f"/src/{i}", T).append({"type": "x", "payload": i}) for i in range(SHARED)))
            await _all_copied(b, 2)
    finally:
        await a_cm.__aexit__(None, None, None)


async def _all_copied(y: yoke.Runtime, per_stream: int) -> None:
    async def copies() -> list[int]:
        return [len(await y.stream(f"/dst/{i}", T).read(after=0, limit=10)) if await _exists(y, i) else 0
                for i in range(SHARED)]

    await until(copies, lambda counts: all(c == per_stream for c in counts), timeout_s=60)


async def _exists(y: yoke.Runtime, i: int) -> bool:
    try:
        await y.stream(f"/dst/{i}", T).info()
    except yoke.errors.StreamNotFound:
        return False
    return True
