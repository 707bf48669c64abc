"""Worker membership with real processes on PostgreSQL (actors/membership.py).

- Under load, live workers are never reaped: `yoke serve --no-executor` and
  two `yoke worker`s of yoke/examples/orders.py on a database of 2,000 tenants
  (every adoption pass visits each of them), one sequential HTTP client
  placing orders for YOKE_SOAK_S seconds (default 75). No worker is reaped,
  none rejoins, no connection goes back to the pool inside a transaction.
  (The workers fall behind on so many tenants: their loops visit every
  tenant each second, docs/production/scaling.md; only membership is checked here.)
  Before, a heartbeat waited for the adoption pass over every tenant and for
  a pool connection: the pass took 25-30 s under this load and the workers
  reaped each other.
- A worker that really stops is reaped, with the reason: SIGSTOP one of two
  `yoke serve --app` processes, the other reaps it (logged, counted on its
  /metrics) and adopts its instances; SIGCONT, it finds itself reaped, says
  why and rejoins (counted); SIGKILL, it is reaped again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import asyncpg
import httpx
import pytest

import yoke

from .fleet import Fleet, Process, pg_database, until

pytestmark = pytest.mark.chaos

APP = "yoke.examples.orders:app"
SOAK_S = float(os.environ.get("YOKE_SOAK_S", "75"))
TENANTS = 2000
# A heartbeat every half second; reaped after 8 s of silence (16 beats).
MEMBERSHIP = {"YOKE_WORKER_HEARTBEAT_S": "0.5", "YOKE_WORKER_STALE_S": "8"}


async def seed_tenants(url: str, count: int) -> None:
    """``count`` tenants, each with a stream: what the worker loops visit."""
    async with yoke.open(url, executor=False) as y:
        for start in range(0, count, 100):
            await asyncio.gather(*(
                y.stream("/seed", f"t{n}").append({"type": "seed"}) for n in range(start, start + 100)
            ))


async def test_two_workers_under_load_are_never_reaped(tmp_path: Path) -> None:
    async with pg_database("yoke_soak") as url:
        await seed_tenants(url, TENANTS)
        fleet = Fleet(url, tmp_path, **MEMBERSHIP)
        try:
            api = fleet.start("api", "serve", "--no-executor", "--app", APP, "--port", "0", "--dev",
                              YOKE_DATA_DIR=str(tmp_path / "api"))
            workers = [fleet.worker(f"w{i}", APP, YOKE_DATA_DIR=str(tmp_path / f"w{i}")) for i in range(2)]
            orders = 0
            async with httpx.AsyncClient(base_url=api.announced["url"], timeout=30) as client:
                ends = time.monotonic() + SOAK_S
                while time.monotonic() < ends:
                    answer = await client.post(
                        "/v1/portals/shop/orders", json={"order_id": f"o{orders}", "items": ["tea"], "total": 3}
                    )
                    assert answer.status_code == 202, answer.text
                    orders += 1
            conn = await asyncpg.connect(url)
            try:
                # The workers work (the pipeline's first step at least): on a
                # loaded machine their passes over 2,000 tenants may reach
                # 'default' only after the load, so wait for it, bounded.
                async def paid_for() -> int:
                    return await conn.fetchval(
                        "SELECT count(*) FROM events WHERE tenant_id = 'default' AND type = 'payment.requested'"
                    )

                requested = await until("the workers' first pipeline step", paid_for, 120, fleet)
                registered = {r[0] for r in await conn.fetch("SELECT worker_id FROM runtime_workers")}
            finally:
                await conn.close()
            assert requested > 0
            assert registered == {w.announced["worker_id"] for w in workers}
        finally:
            codes = fleet.stop()
        logs = fleet.logs(10_000)
        for needle in ("was reaped", "reaped worker", "active transaction", "Traceback"):
            assert needle not in logs, f"{needle!r} in the logs after {orders} orders:\n{logs}"
        assert codes == {"api": -signal.SIGTERM, "w0": 0, "w1": 0}, logs  # uvicorn ends on the signal it got
        print(f"\nmembership soak: {orders} orders ({requested} paid for) in {SOAK_S:.0f}s over {TENANTS} tenants,"
              " no reaps")


async def test_a_stopped_worker_is_reaped_with_its_reason(tmp_path: Path) -> None:
    """Two `yoke serve --app` processes (each an executor, each with /metrics)."""
    async with pg_database("yoke_reap") as url:
        fleet = Fleet(url, tmp_path, YOKE_WORKER_HEARTBEAT_S="0.3", YOKE_WORKER_STALE_S="2")
        conn = await asyncpg.connect(url)
        try:
            a, b = (
                fleet.start(name, "serve", "--app", APP, "--port", "0", "--dev",
                            YOKE_DATA_DIR=str(tmp_path / name))
                for name in ("a", "b")
            )
            ids = {r[1]: r[0] for r in await conn.fetch("SELECT worker_id, (info->>'pid')::int FROM runtime_workers")}
            a_id, b_id = ids[a.pid], ids[b.pid]
            async with yoke.open(url, executor=False) as y:
                for n in range(20):  # unowned: each worker adopts its share
                    await y.instances().create("order", key=f"o{n}")

            async def owners() -> dict[str, int]:
                rows = await conn.fetch("SELECT worker_id, count(*) FROM actor_instances GROUP BY 1")
                return {r[0]: r[1] for r in rows}

            async def registered() -> set[str]:
                return {r[0] for r in await conn.fetch("SELECT worker_id FROM runtime_workers")}

            await until("both workers own instances", lambda: _both(owners, a_id, b_id), 60, fleet)

            a.signal(signal.SIGSTOP)
            await until("a reaped by b", lambda: _reaped(registered, a_id), 30, fleet)
            await until("b logs the reap", lambda: f"reaped worker {a_id} (host" in b.text(), 10, fleet)
            assert "no heartbeat for" in b.text() and "by the database's clock" in b.text()
            assert counted(b, "yoke_worker_reaps_total", "stale") == 1
            await until("b owns every instance", lambda: _only(owners, b_id), 30, fleet)

            a.signal(signal.SIGCONT)
            await until("a rejoins", lambda: _back(registered, a_id), 30, fleet)
            await until("a says why", lambda: f"worker {a_id} was reaped (" in a.text(), 10, fleet)
            assert "event loop was blocked" in a.text(), a.text()
            assert counted(a, "yoke_worker_rejoins_total", "loop_blocked") == 1

            a.signal(signal.SIGKILL)
            a.popen.wait(10)
            await until("a reaped after SIGKILL", lambda: _reaped(registered, a_id), 30, fleet)
            await until("b counts the second reap", lambda: counted(b, "yoke_worker_reaps_total", "stale") == 2,
                        10, fleet)
        finally:
            await conn.close()
            codes = fleet.stop()
        assert codes["b"] == -signal.SIGTERM, fleet.logs()
        assert "Traceback" not in b.text(), b.text()


def counted(server: Process, name: str, reason: str) -> float:
    """The value of ``name{reason=...}`` on the server's /metrics (0 when absent)."""
    for line in httpx.get(server.announced["url"] + "/metrics").text.splitlines():
        if line.startswith(f'{name}{{reason="{reason}"}} '):
            return float(line.split()[-1])
    return 0.0


async def _both(owners, a: str, b: str) -> bool:  # noqa: ANN001
    found = await owners()
    return found.get(a, 0) > 0 and found.get(b, 0) > 0


async def _only(owners, b: str) -> bool:  # noqa: ANN001
    return set(await owners()) == {b}


async def _reaped(registered, worker: str) -> bool:  # noqa: ANN001
    return worker not in await registered()


async def _back(registered, worker: str) -> bool:  # noqa: ANN001
    return worker in await registered()
