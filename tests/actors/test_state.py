"""ctx.state and ctx.sqlite: the per-instance SQLite database (invariant 8)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

import yoke
from yoke import App, Filter
from yoke.events import MAX_DEPTH
from tests.actors.test_effects_atomic import nested

T = "acme"


async def test_concurrent_updates_never_lose_a_write(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("counter", filter=Filter(types=["inc"]), concurrency=8)
    async def counter(ctx, event):
        await ctx.state.update(lambda s: {**s, "n": s.get("n", 0) + 1})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("counter", key="k")
        # Distinct groups so up to 8 run at once.
        await y.stream("/", T).append_many(
            [{"type": "inc", "group_id": f"g{i % 8}"} for i in range(80)]
        )
        await y.wait_idle(timeout_s=20)
        value, version = await y.instances(T).state(inst.instance_id)
    assert value == {"n": 80}
    assert version == 80


async def test_state_set_get_and_sqlite_survive_a_restart(fresh_url: str, tmp_path) -> None:
    app = App()
    results: dict[str, object] = {}

    @app.actor("notes", filter=Filter(types=["note"]))
    async def notes(ctx, event):
        if await ctx.state.get() is None:
            await ctx.sqlite.exec("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        await ctx.sqlite.exec("INSERT INTO notes (text) VALUES (?)", [event.payload["text"]])
        version = await ctx.state.set({"last": event.payload["text"]})
        results["version"] = version
        results["rows"] = await ctx.sqlite.query("SELECT id, text FROM notes ORDER BY id")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("notes", key="k")
        await y.stream("/", T).append({"type": "note", "payload": {"text": "one"}})
        await y.wait_idle(timeout_s=10)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        assert await y.instances(T).state(inst.instance_id) == ({"last": "one"}, 1)
        await y.stream("/", T).append({"type": "note", "payload": {"text": "two"}})
        await y.wait_idle(timeout_s=10)
        assert await y.instances(T).state(inst.instance_id) == ({"last": "two"}, 2)
    assert results["rows"] == [{"id": 1, "text": "one"}, {"id": 2, "text": "two"}]
    assert [list(row) for row in results["rows"]] == [["id", "text"]] * 2  # the statement's column order (documented)


async def test_bad_sql_and_the_reserved_table_fail_the_run(fresh_url: str, tmp_path) -> None:
    app = App()
    errors_seen: list[str] = []

    @app.actor("sql", filter=Filter(types=["q"]), max_attempts=1)
    async def sql(ctx, event):
        try:
            await ctx.sqlite.exec(event.payload["sql"])
        except yoke.InvalidInput as exc:
            errors_seen.append(exc.message)
            raise

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("sql", key="k")
        await y.stream("/", T).append_many([
            {"type": "q", "payload": {"sql": "SELEKT 1"}},
            {"type": "q", "payload": {"sql": "DELETE FROM _yoke_state"}},
        ])
        await y.wait_idle(timeout_s=10)
        assert len(await y.instances(T).dead(inst.instance_id)) == 2
    assert "syntax error" in errors_seen[0]
    assert "reserved" in errors_seen[1]


@pytest.mark.parametrize("storage", ["file", "pg_sqlite"])
async def test_every_storage_mode_on_every_backend(fresh_url: str, tmp_path, storage: str) -> None:
    app = App()

    @app.actor("c", filter=Filter(types=["inc"]))
    async def c(ctx, event):
        await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1})

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        inst = await y.instances(T).create("c", key="k")
        await y.stream("/", T).append_many([{"type": "inc"}] * 3)
        await y.wait_idle(timeout_s=10)
        if storage == "pg_sqlite":
            assert await y.store.actors.load_state(T, inst.instance_id) is not None
        else:
            assert not list((tmp_path / "actors").glob("*/*.db")) == []
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), storage=storage) as y:
        assert await y.instances(T).state(inst.instance_id) == ({"n": 3}, 3)


async def test_compare_and_set_refuses_a_stale_version(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, data_dir=str(tmp_path)) as y:
        db = y.state_databases().get(T, "inst_x")
        assert await db.state_get() == (None, 0)
        assert await db.state_cas(0, {"a": 1}) == (True, 1)
        assert await db.state_cas(0, {"a": 2}) == (False, 1)  # lost the race: nothing written
        assert await db.state_get() == ({"a": 1}, 1)
        assert await db.state_set({"b": 1}) == 2


async def refusals(*calls: Callable[[], Awaitable[object]]) -> list[tuple[str, str]]:
    """(code, field) of each ctx call refused with InvalidInput."""
    refused = []
    for call in calls:
        try:
            await call()
        except yoke.InvalidInput as exc:
            refused.append((exc.code, exc.details.get("field", "")))
    return refused


async def test_values_outside_the_domain_fail_the_run_not_turn_into_null(fresh_url: str, tmp_path) -> None:
    """ctx calls cross the op seam as JSON: NaN used to become null there, so
    an actor's append or state write stored null silently."""
    app = App()
    refused: list[tuple[str, str]] = []

    @app.actor("nan", filter=Filter(types=["go"]), max_attempts=1)
    async def nan(ctx, event):
        refused.extend(await refusals(
            lambda: ctx.append({"type": "out", "payload": {"x": float("nan")}}),
            lambda: ctx.state.set({"x": float("inf")}),
            lambda: ctx.state.update(lambda s: {"n": 2**64}),
        ))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("nan", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=10)
        assert [e.type for e in await y.stream("/", T).read()] == ["yoke.instance.created", "go"]
        assert await y.instances(T).state(inst.instance_id) == (None, 0)
    assert [code for code, _ in refused] == ["invalid_input"] * 3
    assert refused[0][1].endswith("payload.x") and refused[1][1].endswith(".x")


async def test_ctx_calls_take_what_the_api_takes_and_no_deeper(fresh_url: str, tmp_path) -> None:
    """The op seam wraps a call's documents in its params: a payload or
    state nested as deep as the domain allows (64 levels) passes it, one
    level more is refused, and so is conversation content one level over."""
    app = App()
    refused: list[tuple[str, str]] = []

    @app.actor("deep", filter=Filter(types=["go"]), max_attempts=1)
    async def deep(ctx, event):
        await ctx.append({"type": "deep", "payload": nested(MAX_DEPTH)}, "/out")
        await ctx.state.set({"v": nested(MAX_DEPTH - 1)})
        refused.extend(await refusals(
            lambda: ctx.append({"type": "deeper", "payload": nested(MAX_DEPTH + 1)}, "/out"),
            lambda: ctx.state.set({"v": nested(MAX_DEPTH)}),
            lambda: ctx.conversations.post_message("c", "bot", nested(MAX_DEPTH + 1)),
        ))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("deep", key="k")
        await y.stream("/", T).append({"type": "go"})
        await y.wait_idle(timeout_s=10)
        assert [e.payload for e in await y.stream("/out", T).read()] == [nested(MAX_DEPTH)]
        assert (await y.instances(T).state(inst.instance_id))[0] == {"v": nested(MAX_DEPTH - 1)}
    assert [code for code, _ in refused] == ["invalid_input", "invalid_input", "invalid_input"]
    assert [field.split("[")[0] for _, field in refused] == ["params.event.payload", "state.v", "content"]
