"""Atomic mode (docs/advanced/effects.md): a run's state and SQL writes, appends,
schedules, child instances and conversation posts become visible with its
queue row's completion or not at all; reads in the run see its own writes.
Both backends; file, pg_sqlite and S3 storage. The crash points of the
commit are in tests/faults/test_atomic_kill9.py."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter, errors
from yoke.actors import crash_points
from yoke.events import MAX_DEPTH
from yoke.store.contract import Limits
from tests.actors.test_state_s3 import aws_env, bucket, moto_endpoint, s3, s3_options  # noqa: F401

T = "acme"


def atomic_app(fail_first: bool, seen: list[dict]) -> App:
    app = App()

    @app.actor("child")
    async def child(ctx, event):
        pass

    @app.actor("counter", filter=Filter(types=["inc"]), effects="atomic", max_attempts=3,
               retry_base_s=0.01, retry_max_s=0.05)
    async def counter(ctx, event):
        n = event.payload["n"]
        await ctx.state.update(lambda s: {**s, "count": s.get("count", 0) + 1})
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (n INTEGER PRIMARY KEY)")
        await ctx.sqlite.exec("INSERT INTO seen VALUES (?)", [n])
        appended = await ctx.append({"type": "counted", "payload": {"n": n, "attempt": ctx.attempt}}, "/out")
        schedule = await ctx.schedules.upsert(f"s{n}", event={"type": "later"}, after_s=3600)
        kid = await ctx.instances.create("child", key=f"k{n}")
        again = await ctx.instances.create("child", key=f"k{n}")
        message = await ctx.conversations.post_message(f"c{n}", "bot", "hi")
        seen.append({
            "n": n, "attempt": ctx.attempt, "appended": appended, "schedule": schedule, "kid": kid,
            "again": again, "message": message,
            # Reads see the run's own writes.
            "state": await ctx.state.get(), "rows": await ctx.sqlite.query("SELECT n FROM seen WHERE n=?", [n]),
            "cancelled": await ctx.schedules.cancel(f"s{n}"),
        })
        await ctx.schedules.upsert(f"s{n}", event={"type": "later"}, after_s=3600)  # back again
        if fail_first and ctx.attempt == 1:
            raise RuntimeError("fails after all its effects")

    return app


async def check_exactly_once(y: yoke.Runtime, events: int) -> None:
    inst = await y.instances(T).find("counter", "k")
    assert inst is not None
    state, _ = await y.instances(T).state(inst.instance_id)
    assert state == {"count": events}
    rows = await y.instances(T).query(inst.instance_id, "SELECT count(*) FROM seen")
    assert rows.rows == [[events]]
    out = await y.stream("/out", T).read(after=0)
    assert sorted(e.payload["n"] for e in out) == list(range(events))
    schedules = await y.instances(T).schedules(inst.instance_id)
    assert sorted(s.name for s in schedules) == [f"s{n}" for n in sorted(range(events), key=str)]
    children = await y.instances(T).list(actor="child")
    assert sorted(c.key for c in children) == sorted(f"k{n}" for n in range(events))
    assert all(c.parent_id == inst.instance_id for c in children)
    posted = [e for e in await y.stream("/", T).read(after=0) if e.type == "conversation.message.posted"]
    assert sorted(e.payload["conversation_id"] for e in posted) == sorted(f"c{n}" for n in range(events))


async def cancelled_by_its_timeout(task: asyncio.Task) -> None:
    """Until the run's task is cancelled (its time ran out) or has ended."""
    # Cancelled, waiting for the thread (fixed), or gone on without it.
    while not (task.cancelling() or task.done()):
        await asyncio.sleep(0.01)
    for _ in range(3):  # the cancellation reaches the run's await
        await asyncio.sleep(0)


async def run_events(y: yoke.Runtime, events: int) -> None:
    await y.instances(T).create("counter", key="k")
    await y.stream("/", T).append_many([{"type": "inc", "payload": {"n": n}} for n in range(events)])
    await y.wait_idle(timeout_s=60)


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_a_failed_run_leaves_nothing_and_a_retry_commits_once(fresh_url: str, tmp_path, storage) -> None:
    seen: list[dict] = []
    async with yoke.open(fresh_url, app=atomic_app(True, seen), data_dir=str(tmp_path), storage=storage) as y:
        await run_events(y, 3)
        await check_exactly_once(y, 3)
        out = await y.stream("/out", T).read(after=0)
        assert all(e.payload["attempt"] == 2 for e in out)  # nothing of the failed attempts
    first = seen[0]
    assert first["appended"]["offset"] is None and first["appended"]["id"]  # known at the commit
    assert first["kid"] == first["again"]  # the run's own pending child
    assert first["schedule"]["name"] == "s0" and first["cancelled"] is True
    assert first["message"]["message_id"].startswith("msg_") and first["message"]["seq"] is None
    assert first["state"] == {"count": 1} and first["rows"] == [{"n": 0}]


async def test_atomic_with_s3_storage(fresh_url: str, tmp_path, moto_endpoint, bucket) -> None:  # noqa: F811
    seen: list[dict] = []
    options = s3_options(moto_endpoint, bucket, "lazy", tmp_path)
    async with yoke.open(fresh_url, app=atomic_app(True, seen), **options) as y:
        await run_events(y, 3)
        await check_exactly_once(y, 3)


async def test_effects_must_be_default_or_atomic() -> None:
    app = App()
    with pytest.raises(errors.InvalidInput) as caught:
        app.actor("bad", effects="exactly-once")
    assert caught.value.code == "invalid_input" and caught.value.details.get("field") == "effects"
    with pytest.raises(errors.InvalidInput):
        app.node_actor("bad2", "x.js", effects="nope")


async def test_an_atomic_run_cannot_end_its_own_transaction(fresh_url: str, tmp_path) -> None:
    app = App()
    failures: list[str] = []

    @app.actor("sneaky", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def sneaky(ctx, event):
        await ctx.state.set({"half": True})
        try:
            await ctx.sqlite.exec("COMMIT")
        except errors.InvalidInput as exc:
            failures.append(str(exc))
            raise

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("sneaky", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=30)
        assert failures and "not authorized" in failures[0]
        assert await y.instances(T).state(inst.instance_id) == (None, 0)  # rolled back


async def test_an_atomic_run_in_a_host_process(fresh_url: str, tmp_path) -> None:
    from tests.actors.isolated_app import app

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), host_processes=1) as y:
        inst = await y.instances(T).create("atomic_counter", key="k", filter={"types": ["go"]})
        await y.stream("/", T).append_many([{"type": "go"}, {"type": "go"}])
        await y.wait_idle(timeout_s=120)
        state, _ = await y.instances(T).state(inst.instance_id)
        assert state == {"count": 2}
        out = await y.stream("/atomic", T).read(after=0)
        assert [(e.payload["seen"], e.payload["attempt"]) for e in out] == [({"count": 1}, 2), ({"count": 2}, 2)]


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_a_refused_commit(fresh_url: str, tmp_path, storage: str) -> None:
    """An append the store refuses at the commit (a closed stream) fails the
    run. pg_sqlite: nothing of it stays, the retry runs the code again. File
    storage: the state was committed with the applied marker first, so the
    retry and a redrive replay the recorded append without running the code."""
    app = App()
    runs: list[int] = []

    @app.actor("closer", filter=Filter(types=["go"]), effects="atomic", max_attempts=2,
               retry_base_s=0.01, retry_max_s=0.05)
    async def closer(ctx, event):
        runs.append(ctx.attempt)
        await ctx.state.update(lambda s: {"count": s.get("count", 0) + 1})
        await ctx.append({"type": "late"}, "/closed")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        await y.stream("/closed", T).append({"type": "first"})
        await y.stream("/closed", T).close()
        inst = await y.instances(T).create("closer", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=30)
        dead = await y.instances(T).dead(inst.instance_id)
        assert len(dead) == 1 and "closed" in (dead[0].last_error or "")
        assert [e.type for e in await y.stream("/closed", T).read(after=0)] == ["first"]
        state, _ = await y.instances(T).state(inst.instance_id)
        if storage == "pg_sqlite":
            assert runs == [1, 2] and state is None
        else:
            assert runs == [1] and state == {"count": 1}
        assert await y.instances(T).redrive(inst.instance_id) == 1
        await y.wait_idle(timeout_s=30)
        assert (await y.instances(T).state(inst.instance_id))[0] == state
        assert runs == ([1, 2, 1, 2] if storage == "pg_sqlite" else [1])


async def test_a_corrected_replay_of_a_marked_row_completes_the_original_run(fresh_url: str, tmp_path) -> None:
    """File storage: the dead row's state is in (its marker), its append was
    refused (the stream's quota). Once the quota is raised, a replay with a
    corrected event (the failures inbox) performs the recorded append, once;
    the code does not run for the corrected event and the state stays the
    original run's."""
    app = App()
    runs: list[dict] = []

    @app.actor("quota", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def quota(ctx, event):
        runs.append(event.payload)
        await ctx.state.update(lambda s: {"count": s.get("count", 0) + 1, "n": event.payload["n"]})
        await ctx.append({"type": "late", "payload": event.payload}, "/full")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
        full = y.stream("/full", T)
        await full.append({"type": "first"})
        await full.set_limits(Limits(max_total_events=1))
        inst = await y.instances(T).create("quota", key="k")
        await y.stream("/", T).append({"type": "go", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=30)
        inbox = y.failures(T)
        [failure] = await inbox.list(kind="dead_letter")
        assert "ceiling" in failure.error
        await full.set_limits(Limits())
        await inbox.replay(failure.id, {"payload": {"n": 2}})
        await y.wait_idle(timeout_s=30)
        assert runs == [{"n": 1}]
        assert (await y.instances(T).state(inst.instance_id))[0] == {"count": 1, "n": 1}
        assert [(e.type, e.payload) for e in await full.read(after=0)] == [("first", {}), ("late", {"n": 1})]
        assert await inbox.list(kind="dead_letter") == []


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_a_run_that_times_out_inside_its_local_commit_applies_once(
    fresh_url: str, tmp_path, storage: str
) -> None:
    """The run's time runs out while its SQLite COMMIT is on the pool thread:
    the thread finishes anyway. pg_sqlite: the copy in memory is then ahead
    of the store's and is reloaded, so the retry counts once. File storage:
    the marker is in, the retry replays it without running the code."""
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
        if point == "before_commit" and not first_run:  # on the loop
            first_run.append(asyncio.current_task())
        elif point == "sqlite_commit" and not gated:  # on the pool thread, committed
            gated.append(point)
            asyncio.run_coroutine_threadsafe(cancelled_by_its_timeout(first_run[0]), loop).result()

    crash_points.hook = hook
    try:
        async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
            await y.instances(T).create("slow", key="k")
            await y.stream("/", T).append({"type": "go"})
            await y.wait_idle(timeout_s=60)
            inst = await y.instances(T).find("slow", "k")
            state, _ = await y.instances(T).state(inst.instance_id)
    finally:
        crash_points.hook = None
    assert gated == ["sqlite_commit"]
    assert state == {"count": 1}
    assert runs == ([1, 2] if storage == "pg_sqlite" else [1])


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_an_eviction_during_a_run_leaves_nothing_of_it(fresh_url: str, tmp_path, storage: str) -> None:
    """Peers evict this worker while a run holds its database
    (StateDatabases.forget_all): the run's later ops must not write around
    its transaction into a fresh copy; the run fails and its retry commits
    once."""
    app = App()
    runtime: list[yoke.Runtime] = []

    @app.actor("evicted", filter=Filter(types=["go"]), effects="atomic", max_attempts=3,
               retry_base_s=0.01, retry_max_s=0.05)
    async def evicted(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        if ctx.attempt == 1:
            runtime[0].state_databases().forget_all()  # what Executor._evicted does
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS runs (attempt INTEGER)")
        await ctx.sqlite.exec("INSERT INTO runs VALUES (?)", [ctx.attempt])

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        runtime.append(y)
        await y.instances(T).create("evicted", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        inst = await y.instances(T).find("evicted", "k")
        state, _ = await y.instances(T).state(inst.instance_id)
        rows = await y.instances(T).query(inst.instance_id, "SELECT attempt FROM runs")
    assert state == {"count": 1}
    assert rows.rows == [[2]]  # nothing of the first attempt


async def test_an_operation_on_a_forgotten_database_is_refused_with_a_code(fresh_url: str, tmp_path) -> None:
    """A read queued on an instance's database when the instance moves to
    another worker fails with a stable code (503 over HTTP); the next read
    opens the database afresh."""
    app = App()

    @app.actor("kept", filter=Filter(types=["go"]))
    async def kept(ctx, event):
        await ctx.state.set({"seen": True})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("kept", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        databases = y.state_databases()
        moved = databases.get(T, inst.instance_id)
        databases.forget(T, inst.instance_id)
        with pytest.raises(errors.YokeError) as refused:
            await moved.state_get()
        assert (refused.value.code, refused.value.http_status) == ("instance_moved", 503)
        state, _ = await y.instances(T).state(inst.instance_id)
    assert state == {"seen": True}


def nested(levels: int) -> object:
    """A value ``levels`` arrays deep."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_a_payload_nested_to_the_limit_commits(fresh_url: str, tmp_path, storage: str) -> None:
    """An atomic run writes its database and appends a payload nested as
    deep as the domain allows (64 levels): the run's record of its effects
    nests it deeper (file storage), and the run must commit."""
    app = App()

    @app.actor("deep", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def deep(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        await ctx.append({"type": "deep", "payload": nested(MAX_DEPTH)}, "/out")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        inst = await y.instances(T).create("deep", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        assert await y.failures(T).list(kind="dead_letter") == []
        assert (await y.instances(T).state(inst.instance_id))[0] == {"count": 1}
        (out,) = await y.stream("/out", T).read(after=0)
        assert out.payload == nested(MAX_DEPTH)


async def test_a_schedule_beyond_the_stores_range_fails_the_run_and_leaves_nothing(fresh_url: str, tmp_path) -> None:
    """A due time past a signed 64-bit count of ms is refused when asked
    for; it used to reach the marker and then fail the store transaction
    on every replay, with the run's state already committed."""
    app = App()

    @app.actor("far", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def far(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        await ctx.schedules.upsert("far", event={"type": "tick"}, at=1e16)

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage="file") as y:
        inst = await y.instances(T).create("far", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=60)
        (dead,) = await y.failures(T).list(kind="dead_letter")
        assert "InvalidSchedule" in dead.error
        assert (await y.instances(T).state(inst.instance_id))[0] is None
        assert await y.store.actors.schedules(T, inst.instance_id) == []
