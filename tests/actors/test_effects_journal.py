"""The journal of a run's effects (docs/advanced/effects.md, the default mode): a
retry of a queue row repeats no effect that already committed, performs an
effect whose content changed, and keeps the journal while the row is dead;
in-process and in host processes, on both backends."""

from __future__ import annotations

import asyncio
import sqlite3

import asyncpg
import pytest

import yoke
from yoke import App, Filter
from yoke.store.actors import Schedule

T = "acme"


async def journal_rows(url: str, tmp_path) -> int:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(f"{tmp_path}/yoke.db")
        try:
            return conn.execute("SELECT count(*) FROM actor_effects").fetchone()[0]
        finally:
            conn.close()
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchval("SELECT count(*) FROM actor_effects")
    finally:
        await conn.close()


def effects_app(fail_until: dict[str, int]) -> tuple[App, list[dict]]:
    app = App()
    seen: list[dict] = []

    @app.actor("child")
    async def child(ctx, event):
        pass

    @app.actor("payer", filter=Filter(types=["job"]), max_attempts=3, retry_base_s=0.01, retry_max_s=0.05)
    async def payer(ctx, event):
        n = event.payload["n"]
        same = await ctx.append({"type": "same", "payload": {"n": n}}, stream="/out")
        await ctx.append({"type": "tried", "payload": {"n": n, "attempt": ctx.attempt}}, stream="/out")
        # Two identical appends in one run are two effects (occurrences 0 and 1).
        twice = [await ctx.append({"type": "twice", "payload": {"n": n}}, stream="/out") for _ in range(2)]
        # Concurrent ops: their order differs between runs, their content does not.
        both = await asyncio.gather(*(ctx.append({"type": f"gathered-{i}", "payload": {"n": n}}, stream="/out")
                                      for i in range(3)))
        schedule = await ctx.schedules.upsert(f"later-{n}", event={"type": "later"}, after_s=3600)
        kid = await ctx.instances.create("child", config={"n": n})
        message = await ctx.conversations.post_message(f"c{n}", "bot", {"text": "hello"})
        cancelled = await ctx.schedules.cancel(f"gone-{n}")
        seen.append({
            "n": n, "attempt": ctx.attempt, "same": same, "twice": twice, "both": both,
            "schedule": schedule, "kid": kid["id"], "message": message["message_id"],
            "cancelled": cancelled, "key": ctx.idempotency_key("pay"), "other_key": ctx.idempotency_key("mail"),
        })
        if ctx.attempt <= fail_until.get(str(n), 0):
            raise RuntimeError(f"fails after its effects (attempt {ctx.attempt})")

    return app, seen


async def test_a_retry_repeats_no_committed_effect(fresh_url: str, tmp_path) -> None:
    app, seen = effects_app({"1": 2})  # event 1 fails twice, event 2 never
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("payer", key="k")
        await y.store.actors.upsert_schedule(  # for the cancel: it exists before the first run only
            Schedule(T, inst.instance_id, "gone-1", 2**60, {"type": "never"})
        )
        await y.stream("/", T).append_many([{"type": "job", "payload": {"n": n}} for n in (1, 2)])
        await y.wait_idle(timeout_s=30)

        runs = [s for s in seen if s["n"] == 1]
        assert [s["attempt"] for s in runs] == [1, 2, 3]
        first = runs[0]
        for later in runs[1:]:  # the recorded results, not new effects
            for field in ("same", "twice", "both", "schedule", "kid", "message", "cancelled", "key", "other_key"):
                assert later[field] == first[field], field
        assert first["cancelled"] is True  # the retries' cancel found nothing, yet answers as the first did
        assert first["twice"][0] != first["twice"][1]
        assert first["key"] != first["other_key"]
        other = next(s for s in seen if s["n"] == 2)
        assert other["key"] != first["key"]

        out = await y.stream("/out", T).read(after=0)
        by_type: dict[str, list] = {}
        for e in out:
            if e.payload["n"] == 1:
                by_type.setdefault(e.type, []).append(e)
        assert len(by_type["same"]) == 1
        assert [e.payload["attempt"] for e in by_type["tried"]] == [1, 2, 3]  # new content: performed
        assert len(by_type["twice"]) == 2
        for i in range(3):
            assert len(by_type[f"gathered-{i}"]) == 1
        children = [i for i in await y.instances(T).list(actor="child") if i.parent_id == inst.instance_id]
        assert sorted(c.config["n"] for c in children) == [1, 2]
        schedules = {s.name: s for s in await y.instances(T).schedules(inst.instance_id)}
        assert set(schedules) == {"later-1", "later-2"}
        assert schedules["later-1"].due_at == first["schedule"]["due_at"]  # not moved by the retries
        posted = [e for e in await y.stream("/", T).read(after=0) if e.type == "conversation.message.posted"]
        assert sorted(e.payload["conversation_id"] for e in posted) == ["c1", "c2"]
        # Both rows completed: their journals went with them.
        assert await journal_rows(fresh_url, tmp_path) == 0


async def test_a_redrive_of_a_dead_row_repeats_nothing(fresh_url: str, tmp_path) -> None:
    fail_until = {"1": 99}
    app, seen = effects_app(fail_until)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("payer", key="k")
        await y.stream("/", T).append({"type": "job", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=30)
        assert len(await y.instances(T).dead(inst.instance_id)) == 1
        assert await journal_rows(fresh_url, tmp_path) > 0  # kept while the row is dead

        fail_until["1"] = 0  # fixed: the redrive's run (attempt 1 again) completes the row
        assert await y.instances(T).redrive(inst.instance_id) == 1
        await y.wait_idle(timeout_s=30)
        assert [s["attempt"] for s in seen] == [1, 2, 3, 1]
        assert seen[-1]["same"] == seen[0]["same"] and seen[-1]["kid"] == seen[0]["kid"]
        out = await y.stream("/out", T).read(after=0)
        assert len([e for e in out if e.type == "same"]) == 1
        assert len([e for e in out if e.type == "twice"]) == 2
        # The redrive's run is attempt 1 again: the same content as the first run's.
        assert [e.payload["attempt"] for e in out if e.type == "tried"] == [1, 2, 3]
        assert await journal_rows(fresh_url, tmp_path) == 0


async def test_dropping_a_dead_row_drops_its_journal(fresh_url: str, tmp_path) -> None:
    app, _ = effects_app({"1": 99})
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("payer", key="k")
        await y.stream("/", T).append({"type": "job", "payload": {"n": 1}})
        await y.wait_idle(timeout_s=30)
        assert await journal_rows(fresh_url, tmp_path) > 0
        assert await y.instances(T).drop(inst.instance_id) == 1
        assert await journal_rows(fresh_url, tmp_path) == 0


async def test_a_retry_in_a_host_process_repeats_nothing(fresh_url: str, tmp_path) -> None:
    from tests.actors.isolated_app import app

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), host_processes=1) as y:
        await y.instances(T).create("journaled", key="k", filter={"types": ["go"]})
        await y.stream("/", T).append({"type": "go", "payload": {"n": 7}})
        await y.wait_idle(timeout_s=120)
        out = await y.stream("/journal", T).read(after=0)
        assert [e.type for e in out] == ["same", "tried", "tried"]
        assert [e.payload["attempt"] for e in out if e.type == "tried"] == [1, 2]
        keys = [(await y.stream(f"/keys/{a}", T).read(after=0))[0].payload for a in (1, 2)]
        assert keys[0] == keys[1]  # the derived key, and the child: the same on the retry
        assert keys[0]["key"].startswith("yk_")
        workers = await y.instances(T).list(actor="worker")
        assert [w.instance_id for w in workers] == [keys[0]["child"]]


def test_idempotency_key_needs_a_queue_row() -> None:
    """A context without a queue row has no idempotency key: an error, not
    one key shared by every row (Node's: tests/actors/test_node_host.py)."""
    from yoke import errors
    from yoke.actors.context import Context
    from yoke.actors.journal import run_idempotency_key
    from yoke.actors.ops import OpHandler
    from yoke.store.actors import InstanceInfo

    instance = InstanceInfo("i1", "acme", "a", "k")
    event = None  # the key does not depend on it
    ops = OpHandler(None, None, "acme", instance)  # type: ignore[arg-type]
    assert Context(ops, instance, event, 1, 7).idempotency_key("pay") == run_idempotency_key("acme", "i1", 7, "pay")
    with pytest.raises(errors.InvalidInput) as caught:
        Context(ops, instance, event, 1).idempotency_key("pay")
    assert caught.value.code == "invalid_input" and caught.value.details.get("field") == "queue_row"
