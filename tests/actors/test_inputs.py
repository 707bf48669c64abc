"""An instance's inputs, kept (docs/advanced/forks.md): every event,
message and schedule firing a run finished with, in order, with how it
ended, the code that ran it and its tape (what it did and read outside its
state); paged, pruned by the actor's retention, removed with the instance.
In process, in host processes and in atomic mode, on both backends."""

from __future__ import annotations

import pytest

import yoke
from yoke import errors
from yoke.actors.app import code_of
from yoke.clock import VirtualClock
from yoke.testing import env

from tests.actors.inputs_app import app
from tests.conftest import PG_ADMIN_URL

T = "acme"


async def kept(y, actor: str, key: str, **page) -> list[dict]:
    inst = await y.instances(T).find(actor, key)
    assert inst is not None
    return [i.as_dict() for i in (await y.instances(T).inputs(inst.instance_id, **page)).inputs]


async def counted(y) -> dict[int, dict]:
    """The /counted events by the n they carry."""
    return {e.payload["n"]: {"offset": e.offset, "id": e.id} for e in await y.stream("/counted", T).read()}


@pytest.mark.parametrize("actor", ["counter", "hosted", "atomic"])
async def test_every_finished_input_is_kept_in_order_with_its_tape(fresh_url: str, tmp_path, actor: str) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), deploy_version="v7") as y:
        sent = [{"type": f"{actor}.go", "payload": {"k": "a", "n": n, "bad": n == 3}} for n in range(1, 5)]
        appended = await y.stream("/in", T).append_many(sent)
        await y.wait_idle(timeout_s=60)

        inputs = await kept(y, actor, "a")
        assert [i["seq"] for i in inputs] == [1, 2, 3, 4]
        # Order is the order runs ended: the bad one dead-lettered after its second attempt.
        by_n = {i["event"]["payload"]["n"]: i for i in inputs}
        assert sorted(by_n) == [1, 2, 3, 4]
        for n, record in by_n.items():
            assert record["kind"] == "event" and record["path"] == "/in"
            assert record["offset"] == appended[n - 1].offset
            assert record["event"]["id"] == appended[n - 1].id
            assert record["code_version"] == "v7"
            assert record["processed_at"] >= record["enqueued_at"]
        bad = by_n[3]
        assert (bad["outcome"], bad["attempts"]) == ("dead", 2)
        assert bad["error"] == "ValueError: bad input 3" and bad["ops"] == []
        answers = await counted(y)
        for n in (1, 2, 4):
            record = by_n[n]
            assert (record["outcome"], record["attempts"], record["error"]) == ("done", 1, None)
            # The tape: the append with its params and the answer the run got.
            [op] = record["ops"]
            assert op["op"] == "stream_append" and op["params"]["stream"] == "/counted"
            assert op["params"]["event"] == {"type": "counted", "payload": {"n": n}}
            # (an atomic run's append has no offset until the run commits)
            assert op["answer"] == (answers[n] if actor != "atomic" else {**answers[n], "offset": None})
        inst = await y.instances(T).find(actor, "a")
        assert (await y.instances(T).state(inst.instance_id))[0] == {"n": 3}


async def test_a_tape_keeps_clock_readings_and_in_process_runs_keep_them(fresh_url: str, tmp_path) -> None:
    clock = VirtualClock(1_000_000_000.0)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), clock=clock) as y:
        await y.stream("/in", T).append({"type": "counter.go", "payload": {"k": "c", "n": 1}})
        await y.wait_idle(timeout_s=60)
        inst = await y.instances(T).find("counter", "c")
        [record] = (await y.instances(T).inputs(inst.instance_id)).inputs
        assert record.tape is not None and record.tape["now"] == [1_000_000_000.0]
        assert record.processed_at == 1_000_000_000_000
        # No version named: the actor's own code, hashed (docs/advanced/forks.md).
        assert record.code_version is not None and record.code_version.startswith("code:")
        assert record.code_version == code_of(app.actors["counter"])


@pytest.mark.parametrize("postgres", [False, True], ids=["sqlite", "postgres"])
async def test_schedule_firings_are_kept_as_such(postgres: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    async with env(app, postgres=postgres, tenant=T) as e:
        y = e.y
        await y.stream("/in", T).append({"type": "timer.arm", "payload": {"k": "t"}})
        await e.idle()  # the schedule fires: it is due now
        inputs = await kept(y, "timer", "t")
        assert [(i["kind"], i["event"]["type"], i["path"]) for i in inputs] == [
            ("event", "timer.arm", "/in"), ("schedule", "timer.fired", None)
        ]
        [upsert] = inputs[0]["ops"]
        assert upsert["op"] == "schedules_upsert" and upsert["answer"]["name"] == "soon"
        assert inputs[1]["event"]["source"]["schedule"] == "soon"


async def test_pages_of_inputs(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/in", T).append_many(
            [{"type": "counter.go", "payload": {"k": "p", "n": n}} for n in range(1, 8)]
        )
        await y.wait_idle(timeout_s=60)
        inst = await y.instances(T).find("counter", "p")
        pages, after = [], 0
        while True:
            page = await y.instances(T).inputs(inst.instance_id, after=after, limit=3)
            pages.append([i.seq for i in page.inputs])
            if page.next_after is None:
                break
            after = page.next_after
        assert pages == [[1, 2, 3], [4, 5, 6], [7]]
        assert [i.seq for i in (await y.instances(T).inputs(inst.instance_id, after=2, upto=4)).inputs] == [3, 4]
        for bad in ({"limit": 0}, {"limit": 1001}, {"after": -1}, {"upto": True}, {"after": "1"}):
            with pytest.raises(errors.InvalidInput):
                await y.instances(T).inputs(inst.instance_id, **bad)
        with pytest.raises(errors.InstanceNotFound):
            await y.instances(T).inputs("inst_nope")
        with pytest.raises(errors.InstanceNotFound):  # another tenant's instance is not found
            await y.instances("other").inputs(inst.instance_id)


async def test_retention_by_count_and_age_and_removal(fresh_url: str, tmp_path) -> None:
    clock = VirtualClock(1_000_000_000.0)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), clock=clock) as y:
        stream = y.stream("/in", T)
        for actor in ("bounded", "aged", "counter"):
            await stream.append_many([{"type": f"{actor}.go", "payload": {"k": "r", "n": n}} for n in range(1, 6)])
        await y.wait_idle(timeout_s=60)
        retention = y.executor.history_retention
        assert [a.name for a in retention.bounded] == ["bounded", "aged", "unkept"]

        assert await retention.prune_once() == 3  # bounded keeps its newest 2; aged's are new
        assert [i["seq"] for i in await kept(y, "bounded", "r")] == [4, 5]
        assert len(await kept(y, "aged", "r")) == 5

        clock.set(1_000_000_000.0 + 30)
        await stream.append({"type": "aged.go", "payload": {"k": "r", "n": 6}})
        await y.wait_idle(timeout_s=60)
        # The first five are older than 60 s now, the sixth is not (the
        # executor's own pass, due at +60 s on this clock, may prune them first).
        clock.set(1_000_000_000.0 + 61)
        await retention.prune_once()
        assert [i["seq"] for i in await kept(y, "aged", "r")] == [6]
        assert len(await kept(y, "counter", "r")) == 5  # no retention: everything is kept

        # Every input of an instance older than the bound: its newest stays (the next is numbered after it).
        clock.set(1_000_000_000.0 + 200)
        await retention.prune_once()
        assert [i["seq"] for i in await kept(y, "aged", "r")] == [6]

        # Seq numbers go on after pruning.
        await stream.append({"type": "bounded.go", "payload": {"k": "r", "n": 9}})
        await y.wait_idle(timeout_s=60)
        assert [i["seq"] for i in await kept(y, "bounded", "r")] == [4, 5, 6]

        # Removed with their instance.
        inst = await y.instances(T).find("counter", "r")
        await y.instances(T).remove(inst.instance_id)
        assert (await y.store.inputs.inputs(T, inst.instance_id)).inputs == []


async def test_an_actor_that_keeps_no_inputs_writes_none(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/in", T).append_many([{"type": "unkept.go", "payload": {"k": "u", "n": n}} for n in (1, 2)])
        await y.wait_idle(timeout_s=60)
        assert await kept(y, "unkept", "u") == []
        inst = await y.instances(T).find("unkept", "u")
        assert (await y.instances(T).state(inst.instance_id))[0] == {"n": 2}
        with pytest.raises(errors.InputsPruned):
            await y.instances(T).fork(inst.instance_id)


def test_retention_settings_are_checked() -> None:
    for bad in ({"keep_inputs": -1}, {"keep_inputs": 1.5}, {"keep_inputs": True}, {"keep_inputs_s": -1},
                {"keep_inputs_s": float("nan")}, {"keep_inputs_s": float("inf")}):
        with pytest.raises(errors.InvalidInput):
            yoke.App().actor("a", **bad)
