"""Failovers under load, shared by tests/ha/test_failover.py (which checks
what must hold) and bench/failover.py (which reports the times).

One run: a Patroni cluster (tests/ha/cluster.py), `yoke serve` on its
multi-host URL running tests/ha/ha_app.py, the clients of tests/ha/load.py;
then, under that load:

1. crash: kill -9 the primary's postmaster; Patroni promotes the standby;
2. rejoin: the old primary comes back as a replica (pg_rewind) and becomes
   the synchronous standby again;
3. switchover: ``patronictl switchover`` back to the first node;
4. freeze: every process of the primary stopped (SIGSTOP), as a hung
   machine or a network partition looks to its clients: connections stay
   open and nothing answers; Patroni promotes the standby when the leader
   key expires, and Yoke must leave the frozen node by its own timeouts
   (``pg_command_timeout_s``, ``pg_connect_timeout_s``); then the node
   thaws and comes back as the standby.

All along, an actor's chain of durable schedules fires every 0.25 s.
Then the writers stop, Yoke drains, and everything is read back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from tests.ha.cluster import Cluster
from tests.ha.load import WEBHOOK_SECRET, Load, Outcome, WebhookReceiver, collect, longest_gap, read_all
from tests.http.conftest import Server, start_server, stop_server

log = logging.getLogger("tests.ha")
ROOT = Path(__file__).resolve().parents[2]
APP = "tests.ha.ha_app:app"
WARM_ACKS = 150  # appends acknowledged before the first failure
RECOVERED_ACKS = 100  # ... and after each, before the next step
DRAIN_S = 120.0


@dataclass
class Figures:
    """Seconds, each measured from the moment of the fault."""

    promoted_s: float = 0.0  # crash: until Patroni reports the standby primary
    crash_appends_s: float = 0.0  # crash: the longest wait for an acknowledged append
    crash_actors_s: float = 0.0  # crash: the longest time no actor run committed
    rejoined_s: float = 0.0  # the old primary back as synchronous standby, from the crash
    switched_s: float = 0.0  # switchover: until the new primary is reported
    switch_appends_s: float = 0.0
    switch_actors_s: float = 0.0
    freeze_promoted_s: float = 0.0  # freeze: until Patroni reports the standby primary
    freeze_appends_s: float = 0.0
    freeze_actors_s: float = 0.0
    schedule_gap_s: float = 0.0  # the longest pause of the ticker's schedule chain, over all faults
    extra: dict = field(default_factory=dict)


@contextlib.asynccontextmanager
async def yoke_on(cluster: Cluster, data_dir: Path, receiver: WebhookReceiver) -> AsyncIterator[Server]:
    """`yoke serve` running the HA app on the cluster's multi-host URL."""
    primary = cluster.primary()
    assert primary is not None
    conn = await asyncpg.connect(cluster.node_url(primary))
    try:
        await conn.execute("DROP DATABASE IF EXISTS yoke WITH (FORCE)")
        await conn.execute("CREATE DATABASE yoke")
    finally:
        await conn.close()
    data_dir.mkdir(parents=True, exist_ok=True)
    server = await asyncio.to_thread(
        start_server, cluster.url("yoke"), data_dir, args=("--app", APP),
        PYTHONPATH=str(ROOT), YOKE_HA_WEBHOOK_URL=receiver.url, YOKE_HA_WEBHOOK_SECRET=WEBHOOK_SECRET,
        YOKE_SSE_HEARTBEAT_S="0.5",
    )
    try:
        yield server
    finally:
        await asyncio.to_thread(stop_server, server)


async def until(what: str, check, timeout_s: float = 90.0) -> None:
    """Poll ``check()`` (state changing on its own: a cluster, a load) until true."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        await asyncio.sleep(0.05)


async def run_failovers(cluster: Cluster, data_dir: Path) -> tuple[Figures, Load, Outcome, dict]:
    figures = Figures()
    receiver = WebhookReceiver()
    try:
        async with yoke_on(cluster, data_dir, receiver) as server:
            load = Load(server.url, server.token)
            async with load.client() as http:  # the ticker's schedule chain
                (await http.post("/v1/streams/ticks/-/events", json={"type": "tick.start", "payload": {"k": "t"}})).raise_for_status()
            running = asyncio.create_task(load.run())
            try:
                await until("appends before the faults", lambda: len(load.acks) >= WARM_ACKS)
                first = cluster.primary()
                assert first is not None

                log.warning("ha: crash (%d acknowledged)", len(load.acks))
                # 1. crash. With a synchronous standby Patroni promotes it at
                # once (master_start_timeout 0); with an asynchronous one it
                # may restart the crashed primary in place instead.
                crash_at, crash_wall = time.monotonic(), time.time()
                killed = cluster.kill_postmaster(first)

                def running_primary():
                    p = cluster.primary()
                    restarted = p is first and first.postmaster_pid() not in (None, killed)
                    return p if p is not None and (p is not first or restarted) else None

                after = await asyncio.to_thread(cluster.wait_for, "a primary after the crash", running_primary)
                figures.promoted_s = time.monotonic() - crash_at
                figures.extra["failed_over"] = after is not first
                acked = len(load.acks)
                await until("appends after the crash", lambda: len(load.acks) >= acked + RECOVERED_ACKS)
                log.warning("ha: rejoin (%d acknowledged)", len(load.acks))
                # 2. rejoin: the other node back as the (synchronous) standby.
                other = next(n for n in cluster.nodes if n is not after)
                await asyncio.to_thread(cluster.wait_for, "the other node back as standby",
                                        lambda: cluster.sync_standby() == other.name, 120)
                figures.rejoined_s = time.monotonic() - crash_at
                log.warning("ha: switchover (%d acknowledged)", len(load.acks))
                # 3. switchover to it
                switch_at, switch_wall = time.monotonic(), time.time()
                await asyncio.to_thread(cluster.switchover, other)
                await asyncio.to_thread(cluster.wait_for, "the switchover", lambda: cluster.primary() is other)
                figures.switched_s = time.monotonic() - switch_at
                acked = len(load.acks)
                await until("appends after the switchover", lambda: len(load.acks) >= acked + RECOVERED_ACKS)
                await asyncio.to_thread(cluster.wait_for, "the old primary back as standby",
                                        lambda: cluster.sync_standby() == after.name, 120)
                log.warning("ha: freeze (%d acknowledged)", len(load.acks))
                # 4. freeze: the primary hangs (or is cut off) with its
                # connections open; Patroni promotes once its leader key expires.
                freeze_at, freeze_wall = time.monotonic(), time.time()
                pids = cluster.freeze(other)
                try:
                    await asyncio.to_thread(cluster.wait_for, "the standby promoted past the frozen primary",
                                            lambda: cluster.primary() is after)
                    figures.freeze_promoted_s = time.monotonic() - freeze_at
                    acked = len(load.acks)
                    await until("appends after the freeze", lambda: len(load.acks) >= acked + RECOVERED_ACKS)
                finally:
                    cluster.thaw(pids)
                await asyncio.to_thread(cluster.wait_for, "the frozen primary back as standby",
                                        lambda: cluster.sync_standby() == other.name, 120)
            finally:
                log.warning("ha: stopping the load (%d acknowledged)", len(load.acks))
                try:
                    await load.stop()
                    await asyncio.wait_for(running, 60)
                finally:
                    running.cancel()
            # Each fault's figures are taken up to the next fault (wall-clock
            # twins for the events' `at`).
            end, end_wall = time.monotonic(), time.time()
            figures.crash_appends_s = load.outage(crash_at, switch_at)
            figures.switch_appends_s = load.outage(switch_at, freeze_at)
            figures.freeze_appends_s = load.outage(freeze_at, end)
            log.warning("ha: draining")
            outcome = await drained(load, receiver, strict=cluster.synchronous)
            # When each order.counted committed (its event's `at`, ms).
            async with load.client() as http:
                counted_at = [e["at"] / 1000 for e in await read_all(http, "/counted")]
            figures.crash_actors_s = longest_gap(counted_at, crash_wall, switch_wall)
            figures.switch_actors_s = longest_gap(counted_at, switch_wall, freeze_wall)
            figures.freeze_actors_s = longest_gap(counted_at, freeze_wall, end_wall)
            # The schedule chain: the longest pause of its firings across all faults.
            async with load.client() as http:
                ticked = [e["at"] / 1000 for e in await read_all(http, "/ticked")]
            figures.schedule_gap_s = longest_gap(ticked, crash_wall, end_wall)
            hooks = {"deliveries": len(receiver.offsets), "bad_signatures": receiver.bad,
                     "offsets": list(receiver.offsets), **await membership(cluster)}
            return figures, load, outcome, hooks
    finally:
        receiver.close()


async def membership(cluster: Cluster) -> dict:
    """The workers registered after the faults, with their heartbeats' age
    (ms, by the database's clock), and the owners of the instances."""
    conn = await asyncpg.connect(cluster.url("yoke"))
    try:
        workers = {r["worker_id"]: r["age"] for r in await conn.fetch(
            "SELECT worker_id, (extract(epoch FROM clock_timestamp()) * 1000)::bigint - heartbeat_at AS age"
            " FROM runtime_workers"
        )}
        owners = {r["worker_id"]: r["n"] for r in await conn.fetch(
            "SELECT worker_id, count(*) AS n FROM actor_instances GROUP BY worker_id"
        )}
    finally:
        await conn.close()
    return {"workers": workers, "owners": owners}


async def drained(load: Load, receiver: WebhookReceiver, *, strict: bool) -> Outcome:
    """Wait until the actor, the copy and the webhook have caught up with
    every acknowledged order, then read it all back."""
    deadline = time.monotonic() + DRAIN_S
    async with load.client() as http:
        # The writers have stopped: /orders is final (with an asynchronous
        # standby it may hold fewer orders than were acknowledged).
        total = sum(e["type"] == "order" for e in await read_all(http, "/orders"))
        while True:
            heads = {}
            for path in ("/orders", "/counted", "/orders-copy"):
                response = await http.get(f"/v1/streams{path}")
                heads[path] = response.json().get("head", 0) if response.status_code == 200 else 0
            delivered = len(set(receiver.offsets))
            # The copy takes every event of /orders, the configure events too.
            if heads["/counted"] >= total and heads["/orders-copy"] >= heads["/orders"] and delivered >= total:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"not drained in {DRAIN_S} s: {total} orders, heads {heads}, "
                                   f"{delivered} delivered by webhook")
            await asyncio.sleep(0.2)
    return await collect(load, strict=strict)
