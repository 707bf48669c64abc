"""An atomic run that ends early never leaves its transaction open on the
instance's database: a run cut off by its timeout while its BEGIN was on
the pool thread, and a commit that fails before its COMMIT. Left open, the
transaction (and the run's authorizer, which refuses BEGIN) failed every
later run of the instance until its events were all dead-lettered, and reads
saw the abandoned run's writes."""

from __future__ import annotations

import asyncio
import sqlite3

import yoke
from yoke import App, Filter
from yoke.actors import crash_points
from tests.actors.test_effects_atomic import cancelled_by_its_timeout

T = "default"


async def test_a_commit_that_fails_before_its_commit_leaves_the_instance_usable(fresh_url: str, tmp_path) -> None:
    """The run's marker is written but its COMMIT is not reached (a disk
    error, raised at a test-only point on the pool thread): that event
    fails, and the next event of the instance runs and commits as if it had
    not been."""
    app = App()

    @app.actor("deep", filter=Filter(types=["go"]), effects="atomic", max_attempts=2,
               retry_base_s=0.01, retry_max_s=0.05)
    async def deep(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        await ctx.append({"type": "out", "payload": event.payload}, "/out")

    def hook(point: str) -> None:
        if point == "applied_marker" and failing:
            raise sqlite3.OperationalError("disk I/O error")

    failing = True
    crash_points.hook = hook
    try:
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
            inst = await y.instances(T).create("deep", key="k")
            first = await y.stream("/", T).append({"type": "go", "payload": {"n": 1}})
            await y.wait_idle(timeout_s=60)
            assert (await y.instances(T).state(inst.instance_id))[0] is None  # nothing of it, not even in reads
            failing = False
            await y.stream("/", T).append({"type": "go", "payload": {"n": 2}})
            await y.wait_idle(timeout_s=60)
            dead = await y.failures(T).list(kind="dead_letter")
            assert [f.offset for f in dead] == [first.offset]
            assert "disk I/O error" in dead[0].error
    finally:
        crash_points.hook = None
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
        assert (await y.instances(T).state(inst.instance_id))[0] == {"count": 1}
        assert [e.payload for e in await y.stream("/out", T).read(after=0)] == [{"n": 2}]


async def test_a_run_whose_time_runs_out_during_its_begin_is_retried(fresh_url: str, tmp_path) -> None:
    """The run's timeout cancels it while the pool thread is beginning its
    transaction; the thread goes on and begins it. The retry runs."""
    app = App()
    runs: list[int] = []

    @app.actor("slow", filter=Filter(types=["go"]), effects="atomic", timeout_s=1.0, max_attempts=3,
               retry_base_s=0.01, retry_max_s=0.05)
    async def slow(ctx, event):
        runs.append(ctx.attempt)
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})

    loop = asyncio.get_running_loop()
    first_run: list[asyncio.Task] = []
    gated: list[str] = []

    def hook(point: str) -> None:
        if point == "begin_run" and not first_run:  # on the loop
            first_run.append(asyncio.current_task())
        elif point == "sqlite_begin" and not gated:  # on the pool thread, the transaction begun
            gated.append(point)
            asyncio.run_coroutine_threadsafe(cancelled_by_its_timeout(first_run[0]), loop).result()

    crash_points.hook = hook
    try:
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
            inst = await y.instances(T).create("slow", key="k")
            await y.stream("/", T).append({"type": "go"})
            await y.wait_idle(timeout_s=60)
            state, _ = await y.instances(T).state(inst.instance_id)
            dead = await y.failures(T).list(kind="dead_letter")
    finally:
        crash_points.hook = None
    assert gated == ["sqlite_begin"]
    assert runs == [2]
    assert state == {"count": 1}
    assert dead == []


async def test_a_run_whose_time_runs_out_before_its_commit_reaches_the_database_is_retried(
    fresh_url: str, tmp_path
) -> None:
    """The run's timeout cancels it while its commit waits for the
    instance's connection (an operation still holds it): the commit never
    reaches the database, and the run's transaction is rolled back."""
    app = App()
    runs: list[int] = []
    holders: list[asyncio.Task] = []
    runtime: list[yoke.Runtime] = []

    @app.actor("held", filter=Filter(types=["go"]), effects="atomic", timeout_s=1.0, max_attempts=3,
               retry_base_s=0.01, retry_max_s=0.05)
    async def held(ctx, event):
        runs.append(ctx.attempt)
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        if ctx.attempt == 1:
            db = runtime[0].state_databases().get(T, ctx.instance.instance_id)
            run = asyncio.current_task()

            async def hold_until_the_run_is_cancelled() -> None:
                async with db._lock:  # what any operation on the connection holds
                    while not (run.cancelling() or run.done()):
                        await asyncio.sleep(0.01)

            holders.append(asyncio.create_task(hold_until_the_run_is_cancelled()))
            while not db._lock.locked():
                await asyncio.sleep(0)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
        runtime.append(y)
        inst = await y.instances(T).create("held", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        state, _ = await y.instances(T).state(inst.instance_id)
        dead = await y.failures(T).list(kind="dead_letter")
    assert len(holders) == 1 and holders[0].done()
    assert runs == [1, 2]
    assert state == {"count": 1}
    assert dead == []


async def test_a_transaction_left_open_is_rolled_back_by_the_next_run(fresh_url: str, tmp_path, caplog) -> None:
    """The backstop: should a run ever end leaving its transaction open
    (with its authorizer), the next run rolls it back, says so in the log,
    and runs."""
    app = App()

    @app.actor("next", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def next_run(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
        inst = await y.instances(T).create("next", key="k")
        db = y.state_databases().get(T, inst.instance_id)

        def abandoned_run(conn) -> None:  # what an interrupted run left behind before the fixes
            conn.execute("BEGIN")
            conn.execute("CREATE TABLE lost (n INTEGER)")
            conn.set_authorizer(lambda *_: sqlite3.SQLITE_DENY)  # refuses even the next BEGIN

        await db._run(abandoned_run, write=False)
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        state, _ = await y.instances(T).state(inst.instance_id)
        tables = await y.instances(T).query(inst.instance_id, "SELECT name FROM sqlite_master WHERE name='lost'")
        dead = await y.failures(T).list(kind="dead_letter")
    assert state == {"count": 1}
    assert tables.rows == []
    assert dead == []
    assert "rolled back a transaction an earlier run left open" in caplog.text
