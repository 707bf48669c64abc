"""Queues and the scheduler, on both backends (ARCHITECTURE.md, invariant 7)."""

from __future__ import annotations

import asyncio
import re

import pytest

import yoke
from yoke import App, Filter

T = "acme"


async def test_failures_retry_then_dead_letter_then_redrive(fresh_url: str, tmp_path) -> None:
    app = App()
    attempts: list[int] = []
    healthy = asyncio.Event()

    @app.actor("flaky", filter=Filter(types=["job"]), max_attempts=3, retry_base_s=0.01, retry_max_s=0.05)
    async def flaky(ctx, event):
        attempts.append(ctx.attempt)
        if not healthy.is_set():
            raise ValueError(f"boom {ctx.attempt}")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("flaky", key="k")
        sent = await y.stream("/", T).append({"type": "job", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=10)
        assert attempts == [1, 2, 3]
        dead = await y.instances(T).dead(inst.instance_id)
        assert len(dead) == 1
        row = dead[0]
        assert row.status == "dead" and row.attempts == 3
        assert row.last_error == "ValueError: boom 3"
        assert "raise ValueError" in (row.last_traceback or "")
        assert row.event["payload"] == {"n": 1} and row.offset == sent.offset and row.path == "/"
        assert (await y.instances(T).depth(inst.instance_id)).dead == 1

        healthy.set()
        assert await y.instances(T).redrive(inst.instance_id) == 1
        await y.wait_idle(timeout_s=10)
        assert attempts == [1, 2, 3, 1]  # attempts reset by the redrive
        depth = await y.instances(T).depth(inst.instance_id)
        assert (depth.pending, depth.processing, depth.dead) == (0, 0, 0)


async def test_drop_dead_rows(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("bad", filter=Filter(types=["job"]), max_attempts=1)
    async def bad(ctx, event):
        raise RuntimeError("always")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("bad", key="k")
        await y.stream("/", T).append_many([{"type": "job"}, {"type": "job"}])
        await y.wait_idle(timeout_s=10)
        dead = await y.instances(T).dead(inst.instance_id)
        assert len(dead) == 2
        assert await y.instances(T).drop(inst.instance_id, [dead[0].qid]) == 1
        assert [r.qid for r in await y.instances(T).dead(inst.instance_id)] == [dead[1].qid]
        assert await y.instances(T).drop(inst.instance_id) == 1
        assert await y.instances(T).dead(inst.instance_id) == []


async def test_timeout_counts_as_a_failure(fresh_url: str, tmp_path) -> None:
    app = App()
    calls: list[int] = []

    @app.actor("slow", filter=Filter(types=["job"]), timeout_s=0.05, max_attempts=2, retry_base_s=0.01)
    async def slow(ctx, event):
        calls.append(ctx.attempt)
        if ctx.attempt == 1:
            await asyncio.Event().wait()  # never returns: the timeout must end it

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("slow", key="k")
        await y.stream("/", T).append({"type": "job"})
        await y.wait_idle(timeout_s=10)
        assert calls == [1, 2]
        assert await y.instances(T).dead(inst.instance_id) == []


async def test_priority_then_offset_within_a_group(fresh_url: str, tmp_path) -> None:
    app = App()
    order: list[int] = []

    @app.actor("ordered", filter=Filter(types=["job"]), concurrency=1)
    async def ordered(ctx, event):
        order.append(event.payload["n"])

    # Enqueue everything before anything runs: append without an executor,
    # then start one, which catches up from the fan-out cursor.
    async with yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("ordered", key="k")
        await y.stream("/", T).append_many(
            [{"type": "job", "payload": {"n": n}, "priority": p} for n, p in
             [(1, 0), (2, 5), (3, 0), (4, 5), (5, -1)]]
        )
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.wait_idle(timeout_s=10)
    assert order == [2, 4, 1, 3, 5]


async def test_concurrency_per_group_and_groups_in_parallel(fresh_url: str, tmp_path) -> None:
    app = App()
    running: dict[str, int] = {}
    peak: dict[str, int] = {}
    total_peak = 0
    gate = asyncio.Event()
    started = asyncio.Condition()

    @app.actor("worker", filter=Filter(types=["job"]), concurrency=2)
    async def worker(ctx, event):
        nonlocal total_peak
        g = event.group_id
        async with started:
            running[g] = running.get(g, 0) + 1
            peak[g] = max(peak.get(g, 0), running[g])
            total_peak = max(total_peak, sum(running.values()))
            started.notify_all()
        await gate.wait()
        running[g] -= 1

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("worker", key="k")
        await y.stream("/", T).append_many(
            [{"type": "job", "group_id": g} for g in ["a"] * 5 + ["b"] * 5]
        )
        async with started:
            # Both groups fill their two slots, and no more start while they hold them.
            await asyncio.wait_for(started.wait_for(lambda: sum(running.values()) == 4), 10)
        depth = await y.instances(T).depth()
        assert depth.processing == 4 and depth.pending == 6
        gate.set()
        await y.wait_idle(timeout_s=10)
    assert peak == {"a": 2, "b": 2}
    assert total_peak == 4


async def test_an_expired_lease_is_reclaimed_even_when_slots_look_full(fresh_url: str, tmp_path) -> None:
    """A worker that died mid-run leaves a processing row whose lease expires;
    the claim takes it back although it fills the group's only slot."""
    from tests.conftest import now_ms
    from yoke.store.actors import Policy

    app = App()

    @app.actor("one", filter=Filter(types=["job"]))
    async def one(ctx, event):
        pass

    async with yoke.open(fresh_url, app=app, executor=False, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        await actors.register_worker("w1", {})
        inst = await y.instances(T).create("one", key="k")
        await actors.release_instances(T, [""])  # no-op, keeps the call covered
        await actors.adopt_instances(T, "w1", 1)
        from yoke.store.actors import QueueItem

        await actors.enqueue(T, [QueueItem('{"id":"e","at":0,"type":"job"}', instance_id=inst.instance_id)], now_ms())
        policy = [Policy("one", 1, 1000)]
        t0 = now_ms()
        first = await actors.claim(T, "w1", policy, t0, 10)
        assert [r.attempts for r in first] == [1]
        assert await actors.claim(T, "w1", policy, t0 + 10, 10) == []  # slot held
        again = await actors.claim(T, "w1", policy, t0 + 1001, 10)  # lease over
        assert [(r.qid, r.attempts) for r in again] == [(first[0].qid, 2)]
        # The first claim's late result is fenced off: it changes nothing.
        await actors.complete(T, [(first[0].qid, 1)])
        assert (await actors.queue_depth(T, inst.instance_id)).processing == 1
        await actors.complete(T, [(again[0].qid, 2)])
        assert (await actors.queue_depth(T, inst.instance_id)).processing == 0


async def test_claims_only_for_owned_instances_and_known_actors(fresh_url: str, tmp_path) -> None:
    from tests.conftest import now_ms
    from yoke.store.actors import Policy, QueueItem

    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        actors = y.store.actors
        for w in ("w1", "w2"):
            await actors.register_worker(w, {})
        inst = await y.instances(T).create("a", key="k")
        assert inst.worker_id is None  # no executor here: unowned
        assert await actors.adopt_instances(T, "w1", 2) == 1
        await actors.enqueue(T, [QueueItem('{"id":"e","at":0,"type":"x"}', instance_id=inst.instance_id)], now_ms())
        now = now_ms()
        assert await actors.claim(T, "w2", [Policy("a", 1, 1000)], now, 10) == []
        assert await actors.claim(T, "w1", [Policy("other", 1, 1000)], now, 10) == []
        assert len(await actors.claim(T, "w1", [Policy("a", 1, 1000)], now, 10)) == 1


async def test_a_run_never_outlives_its_lease(fresh_url: str, tmp_path) -> None:
    """A row claimed while the event loop was blocked must not start after its
    lease ran out: by then the claim would hand it out again, and a
    concurrency-1 instance would run one event twice at once."""
    from tests.conftest import now_ms

    app = App()
    log: list[tuple[str, int]] = []
    x_lease: list[int] = []  # lease_until of x's claimed row, seen at the claim

    @app.actor("x", filter=Filter(types=["x"]), concurrency=1, timeout_s=0.2, retry_base_s=0.01)
    async def x(ctx, event):
        if event.payload.get("warm"):
            return
        log.append(("start", ctx.attempt))
        try:
            await asyncio.sleep(0.05)
        finally:  # ended, or cut off by its timeout
            log.append(("end", ctx.attempt))

    @app.actor("blocker", filter=Filter(types=["block"]), timeout_s=10)
    async def blocker(ctx, event):
        if not event.payload.get("warm"):
            while not x_lease:  # x may be claimed by the other claim loop
                await asyncio.sleep(0)
            # Hold the event loop (no await) until x's lease has ended.
            while now_ms() <= x_lease[0]:
                pass

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances(T).create("x", key="x")
        await y.instances(T).create("blocker", key="b")
        warm = {"payload": {"warm": True}}  # instances looked up once: runs start in claim order
        await y.stream("/", T).append_many([{"type": "block", **warm}, {"type": "x", **warm}])
        await y.wait_idle(timeout_s=20)
        claim = y.store.actors.claim

        async def observed_claim(*args, **kwargs):  # the real claim, watched
            rows = await claim(*args, **kwargs)
            x_lease.extend(r.lease_until for r in rows if r.event["type"] == "x")
            return rows

        y.store.actors.claim = observed_claim
        await y.stream("/", T).append_many([{"type": "block", "priority": 5}, {"type": "x"}])
        await y.wait_idle(timeout_s=20)
    # Runs never overlap: every start is followed by its own end.
    assert log[0::2] == [("start", a) for _, a in log[1::2]]
    assert [kind for kind, _ in log] == ["start", "end"] * (len(log) // 2)
    assert log[-1][0] == "end"


async def test_wait_idle_says_what_is_still_busy(fresh_url: str, tmp_path) -> None:
    """A row waiting for its retry keeps the runtime busy: the timeout names
    the actor, the instance, the attempts, when the next try is due and the
    last error (it said only "not idle after 1s")."""
    app = App()
    tried = asyncio.Event()

    @app.actor("billing", filter=Filter(types=["bill"]), max_attempts=5, retry_base_s=60, retry_max_s=60)
    async def billing(ctx, event):
        tried.set()
        raise ValueError("card declined for customer c1")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("billing", key="c1")
        await y.stream("/bills", T).append({"type": "bill", "payload": {"amount": 12}})
        await tried.wait()
        while not any(r.last_error for r in await y.instances(T).queue(inst.instance_id)):  # the failure committed
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError) as caught:  # a row waits for its retry
            await y.wait_idle(timeout_s=1)
        said = str(caught.value)
        assert said.startswith("not idle after 1s: busy instances: billing " + inst.instance_id + " in acme")
        assert "1 unfinished rows (0 processing)" in said
        assert "attempt 1 failed, next try in " in said
        assert said.endswith("last error: ValueError: card declined for customer c1")


async def test_the_deployment_sets_retries_and_the_decorator_wins(fresh_url: str, tmp_path) -> None:
    """Settings for every actor and for one actor make a dead-letter test
    fast without touching the application; a decorator argument wins."""
    app = App()
    tries: dict[str, int] = {}

    def failing(name: str):  # noqa: ANN202
        async def process(ctx, event):  # noqa: ANN001, ANN202
            tries[name] = ctx.attempt
            raise ValueError(name)

        return process

    app.actor("plain", filter=Filter(types=["job"]))(failing("plain"))
    app.actor("tuned", filter=Filter(types=["job"]))(failing("tuned"))
    app.actor("own", filter=Filter(types=["job"]), max_attempts=1)(failing("own"))
    settings = {"actor_max_attempts": 2, "actor_retry_base_s": 0.01, "actor_retry_max_s": 0.02,
                "actor_retry": '{"tuned": {"max_attempts": 3}, "own": {"max_attempts": 4}}'}
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), **settings) as y:
        for name in ("plain", "tuned", "own"):
            await y.instances(T).create(name, key="k")
        await y.stream("/", T).append({"type": "job", "payload": {}})
        await y.wait_idle(timeout_s=10)  # three dead letters, retried within milliseconds
        assert tries == {"plain": 2, "tuned": 3, "own": 1}
        assert len(await y.failures(T).list(kind="dead_letter")) == 3


async def test_wait_idle_names_a_run_still_going(fresh_url: str, tmp_path) -> None:
    app = App()
    started, release = asyncio.Event(), asyncio.Event()

    @app.actor("slow", filter=Filter(types=["job"]), timeout_s=60)
    async def slow(ctx, event):
        started.set()
        await release.wait()

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("slow", key="k")
        await y.stream("/jobs", T).append({"type": "job", "payload": {}})
        await started.wait()
        with pytest.raises(TimeoutError) as caught:  # a run is going
            await y.wait_idle(timeout_s=0.5)
        said = str(caught.value)
        assert f"slow {inst.instance_id} in acme: 1 unfinished rows (1 processing), attempt 1 running" in said
        assert "failed" not in said
        release.set()
        await y.wait_idle(timeout_s=10)


async def test_wait_idle_names_the_subscriptions_behind(fresh_url: str, tmp_path) -> None:
    """Subscriptions are not waited for, but a timeout names those behind
    with their state and last error (a webhook nobody answers, say)."""
    app = App()

    @app.actor("billing", filter=Filter(types=["bill"]), max_attempts=5, retry_base_s=60, retry_max_s=60)
    async def billing(ctx, event):
        raise ValueError("card declined")

    fast = {"subscription_retry_base_s": 0.001, "subscription_retry_max_s": 0.005, "subscription_sweep_s": 0.05}
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), **fast) as y:
        inst = await y.instances(T).create("billing", key="c1")
        bills = y.stream("/bills", T)
        await bills.subscribe("hook", yoke.webhook("http://127.0.0.1:9/closed", secret="whsec_" + "QUJD" * 8))
        await bills.append({"type": "bill", "payload": {"amount": 12}})
        while not (await bills.subscription("hook")).last_error:  # its first attempt failed
            await asyncio.sleep(0.01)
        while not any(r.last_error for r in await y.instances(T).queue(inst.instance_id)):
            await asyncio.sleep(0.01)
        with pytest.raises(TimeoutError) as caught:
            await y.wait_idle(timeout_s=0.5)
        said = str(caught.value)
        assert "busy instances: billing" in said
        behind = said[said.index("subscriptions behind: "):]
        # The bill, and a halt's own control event once the ladder gave up.
        assert re.match(r"subscriptions behind: hook of /bills in acme: [12] events behind, (retrying|halted),"
                        r" last error: WebhookFailed: POST http://127.0.0.1:9/closed failed", behind), behind
