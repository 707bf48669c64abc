"""Forks (docs/advanced/forks.md): an instance's kept inputs replayed in a
sandbox under the same or other code, with edits, diffed against the live
instance or another fork; nothing live changes; on both backends."""

from __future__ import annotations

import json
import sqlite3

import asyncpg
import orjson
import pytest

import yoke
from yoke import errors
from yoke.clock import VirtualClock

from tests.actors.fork_app import app, fixed_app

T = "acme"

LINES = [
    {"id": "A", "sku": "apple", "qty": 2, "remind": True},
    {"id": "A", "sku": "pear", "qty": 1},
    {"id": "A", "sku": "apple", "qty": 3, "poison": True},
    {"id": "A", "sku": "fig", "qty": 4, "ship": True},
]


async def live_rows(url: str, tmp_path) -> dict[str, list]:
    """Every table of the database but the forks', each sorted: what "nothing
    live changed" compares (streams, events, queues, schedules, cursors,
    instances, kept inputs, instance databases kept in the store)."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(f"{tmp_path}/yoke.db")
        try:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            return {n: sorted(map(repr, conn.execute(f'SELECT * FROM "{n}"'))) for n in names if n != "actor_forks"}
        finally:
            conn.close()
    conn = await asyncpg.connect(url)
    try:
        names = [r[0] for r in await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'actor_forks'")]
        return {n: sorted(repr(tuple(r)) for r in await conn.fetch(f'SELECT * FROM "{n}"')) for n in names}
    finally:
        await conn.close()


def instance_files(tmp_path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted((tmp_path / "actors").rglob("*.db"))}


async def placed(y, actor: str = "order", lines=LINES) -> str:
    await y.stream("/orders", T).append_many([{"type": f"{actor_type(actor)}", "payload": p} for p in lines])
    await y.wait_idle(timeout_s=60)
    await y.sql_settled()  # the SQL catalogue's mirror written: live_rows reads it too
    inst = await y.instances(T).find(actor, "A")
    assert inst is not None
    return inst.instance_id


def actor_type(actor: str) -> str:
    return {"order": "order.line", "order_atomic": "atomic.line", "clock": "clock.tick",
            "bounded": "bounded.line"}[actor]


@pytest.mark.parametrize("actor", ["order", "order_atomic"])
async def test_a_fork_under_the_same_code_has_no_difference_and_changes_nothing_live(
    fresh_url: str, tmp_path, actor: str
) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y, actor)
        before, files = await live_rows(fresh_url, tmp_path), instance_files(tmp_path)

        fork = await y.instances(T).fork(iid)
        assert fork.row.summary == {"runs": 4, "failed": 1, "effects": 6, "refused": 0, "inputs": 4, "through": 4}
        d = await fork.diff()
        assert (d["changed"], d["nondeterministic"]) == (False, False), d
        # Its state and tables are the live instance's.
        assert await fork.state() == await y.instances(T).state(iid)
        rows = (await fork.query("SELECT sku, qty, price FROM lines ORDER BY sku")).rows
        assert rows == (await y.instances(T).query(iid, "SELECT sku, qty, price FROM lines ORDER BY sku")).rows
        assert rows == [["apple", 2, 6], ["fig", 4, 12], ["pear", 1, 3]]
        # Its runs, in the order the live ones ended: the poisoned one failed
        # as it did live (dead-lettered); effects answered as they were live.
        runs = await fork.runs()
        assert [r["seq"] for r in runs] == [1, 2, 3, 4]
        assert sorted((r["event"]["payload"]["sku"], r["outcome"], r["live_outcome"]) for r in runs) == [
            ("apple", "done", "done"), ("apple", "failed", "dead"), ("fig", "done", "done"), ("pear", "done", "done"),
        ]
        priced = {e.payload["sku"]: e.id for e in await y.stream("/priced", T).read()}
        appends = [op for r in runs for op in r["ops"] if op["op"] == "stream_append"]
        assert {op["answer"]["id"] for op in appends} == set(priced.values())

        other = await y.instances(T).fork(iid)
        assert (await fork.diff(other))["changed"] is False
        assert {f.fork_id for f in await y.forks(T).list(iid)} == {fork.fork_id, other.fork_id}
        await other.discard()
        with pytest.raises(errors.ForkNotFound):
            await y.forks(T).get(other.fork_id)

        assert await live_rows(fresh_url, tmp_path) == before
        assert instance_files(tmp_path) == files


async def test_a_poisoned_input_fixed_by_an_edit_or_by_new_code(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y)
        before = await live_rows(fresh_url, tmp_path)
        [dead] = [i for i in (await y.instances(T).inputs(iid)).inputs if i.outcome == "dead"]

        # The event corrected: its line counts, its price is appended.
        fixed = await y.instances(T).fork(
            iid, edits=[{"seq": dead.seq, "action": "replace", "payload": {"id": "A", "sku": "apple", "qty": 3}}]
        )
        d = await fixed.diff()
        assert d["changed"] and not d["nondeterministic"]
        assert d["outcomes"] == [{"seq": dead.seq, "live": "failed", "fork": "done",
                                  "live_error": "ValueError: poisoned line", "fork_error": None}]
        assert d["state"]["changed"]["lines"] == {"live": 3, "fork": 4}
        assert d["tables"] == {"lines": {"added": [], "removed": [], "changed": [
            {"key": ["apple"], "live": {"sku": "apple", "qty": 2, "price": 6},
             "fork": {"sku": "apple", "qty": 5, "price": 9}}]}}
        [effects] = d["effects"]
        assert effects["seq"] == dead.seq and effects["only_live"] == [] and effects["changed"] == []
        assert [e["op"] for e in effects["only_fork"]] == ["stream_append"]

        # The code corrected instead: every price one more, and the poisoned line taken.
        under_fix = await y.instances(T).fork(iid, app=fixed_app)
        d = await under_fix.diff()
        assert d["changed"] and not d["nondeterministic"] and d["outcomes"][0]["fork"] == "done"
        assert {c["key"][0]: c["fork"]["price"] for c in d["tables"]["lines"]["changed"]} == {
            "apple": 10, "fig": 13, "pear": 4}
        assert sorted(e["changed"][0]["fork"]["event"]["payload"]["price"] for e in d["effects"] if e["changed"]) == [
            4, 7, 13]
        assert [e["only_fork"][0]["params"]["event"]["payload"]["price"] for e in d["effects"] if e["only_fork"]] == [
            10]  # the poisoned line, now taken
        # By name, as the CLI and HTTP give it.
        by_name = await y.instances(T).fork(iid, app="tests.actors.fork_app:fixed_app")
        assert (await by_name.diff(under_fix))["changed"] is False

        # Dropped, and inserted: the drop loses the pear; the plum inserted
        # first asks for a price no live run asked for: refused.
        edited = await y.instances(T).fork(iid, edits=[
            {"seq": 2, "action": "drop"},
            {"seq": 1, "action": "insert", "event": {"type": "order.line", "payload": {"id": "A", "sku": "plum"}}},
        ])
        runs = await edited.runs()
        assert [(r["seq"], r["inserted"]) for r in runs][:3] == [(None, True), (1, False), (3, False)]
        assert runs[0]["outcome"] == "failed" and "ForkRefused" in runs[0]["error"]
        rows = (await edited.query("SELECT sku FROM lines ORDER BY sku")).rows
        assert rows == [["apple"], ["fig"]]
        assert await live_rows(fresh_url, tmp_path) == before


async def test_upto_refusals_and_what_is_not_found(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y)
        first = await y.instances(T).fork(iid, upto=1)
        assert first.row.summary["runs"] == 1 and first.row.upto == 1
        assert (await first.query("SELECT sku FROM lines")).rows == [["apple"]]

        # An inserted event whose run reads the outside world differently than
        # any live run did: the portal call is refused, in the report.
        refused = await y.instances(T).fork(iid, upto=1, edits=[
            {"seq": 1, "action": "insert", "event": {"type": "order.line", "payload": {"id": "A", "qty": 9}}},
        ])
        [run, _] = await refused.runs()
        assert run["outcome"] == "failed" and run["error"].startswith("ForkRefused: portal_call was not made")
        assert refused.row.summary["refused"] == 1

        for bad in ({"upto": -1}, {"upto": "2"}, {"edits": [{"seq": 0, "action": "drop"}]},
                    {"edits": [{"seq": 1, "action": "bend"}]}, {"edits": [{"seq": 1, "action": "drop", "x": 1}]},
                    {"edits": [{"seq": 1, "action": "replace"}]}, {"edits": [{"seq": 1, "action": "insert"}]},
                    {"edits": [{"seq": 99, "action": "drop"}]}, {"edits": {"seq": 1}}):
            with pytest.raises(errors.InvalidInput):
                await y.instances(T).fork(iid, **bad)
        with pytest.raises(errors.InstanceNotFound):
            await y.instances(T).fork("inst_nope")
        with pytest.raises(errors.InstanceNotFound):
            await y.instances("other").fork(iid)
        with pytest.raises(errors.ForkNotFound):
            await y.forks("other").get(first.fork_id)
        with pytest.raises(errors.ForkNotFound):
            await y.forks(T).diff("fork_nope")

        # The first inputs pruned: no fork from the instance's creation.
        await y.stream("/orders", T).append_many([{"type": "bounded.line", "payload": {"id": "A"}}] * 3)
        await y.wait_idle(timeout_s=60)
        bounded = await y.instances(T).find("bounded", "A")
        await y.prune()
        with pytest.raises(errors.InputsPruned):
            await y.instances(T).fork(bounded.instance_id)


async def test_a_handler_reading_the_clock_itself_shows_as_nondeterministic(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y, "clock", [{"id": "A"}])
        d = await (await y.instances(T).fork(iid)).diff()
        assert d["changed"] and d["nondeterministic"] and list(d["state"]["changed"]) == ["seen_at"]


async def test_forks_expire(fresh_url: str, tmp_path) -> None:
    clock = VirtualClock(1_000_000_000.0)
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path), clock=clock, fork_ttl_s=60) as y:
        iid = await placed(y, lines=LINES[:1])
        fork = await y.instances(T).fork(iid)
        assert fork.row.expires_at == fork.row.created_at + 60_000
        clock.set(1_000_000_000.0 + 61)
        with pytest.raises(errors.ForkNotFound):
            await fork.state()
        assert await y.forks(T).list() == []
        await y.prune()
        assert await y.store.forks.expire(T, 2**62, 10) == 0  # the pass deleted it


async def test_a_fork_of_an_actor_that_runs_in_host_processes(fresh_url: str, tmp_path) -> None:
    """Its runs replay in this process (its Python handler), from the tape
    the host's runs left: the same state and effects."""
    from tests.actors.inputs_app import app as hosted_app

    async with yoke.open(fresh_url, app=hosted_app, data_dir=str(tmp_path)) as y:
        await y.stream("/in", T).append_many(
            [{"type": "hosted.go", "payload": {"k": "h", "n": n, "bad": n == 2}} for n in range(1, 4)]
        )
        await y.wait_idle(timeout_s=60)
        inst = await y.instances(T).find("hosted", "h")
        [first, *_] = (await y.instances(T).inputs(inst.instance_id)).inputs
        assert first.tape is not None and "seed" in first.tape and len(first.tape["now"]) == 1  # the run's start
        fork = await y.instances(T).fork(inst.instance_id)
        d = await fork.diff()
        assert d["changed"] is False, d
        assert await fork.state() == await y.instances(T).state(inst.instance_id)


async def test_a_dead_letter_forked_at_its_input_then_fixed_live(fresh_url: str, tmp_path) -> None:
    lines = [*LINES, {"id": "A", "sku": "kiwi", "qty": 1}]  # more after the poisoned line
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y, lines=lines)
        [failure] = await y.failures(T).list()
        inputs = (await y.instances(T).inputs(iid)).inputs
        [dead] = [i for i in inputs if i.outcome == "dead"]

        fork = await y.failures(T).fork(failure.id, patch={"payload": {"poison": None}})
        assert fork.row.upto == dead.seq and fork.row.edits == [
            {"seq": dead.seq, "action": "replace", "payload": {"id": "A", "sku": "apple", "qty": 3}}]
        # Against the live history at the same input: only the fixed line differs
        # (later live inputs are not in the comparison).
        d = await fork.diff()
        assert [(o["seq"], o["live"], o["fork"]) for o in d["outcomes"]] == [(dead.seq, "failed", "done")]
        assert d["state"]["changed"]["lines"]["fork"] == d["state"]["changed"]["lines"]["live"] + 1
        assert [c["key"] for c in d["tables"]["lines"]["changed"]] == [["apple"]]
        under_fix = await y.failures(T).fork(failure.id, app=fixed_app)
        assert (await under_fix.diff())["outcomes"][0]["fork"] == "done"
        with pytest.raises(errors.InvalidInput):
            await y.failures(T).fork(failure.id, event={"payload": {}}, patch={"payload": {}})

        # The fix, applied live through the replay: the instance now is what the fork said.
        await y.failures(T).replay(failure.id, patch={"payload": {"poison": None}}, wait=True)
        await y.wait_idle(timeout_s=60)
        assert (await y.instances(T).state(iid))[0]["lines"] == len(lines)
        assert (await (await y.instances(T).fork(iid)).diff())["changed"] is False


def check_deploy_cli(url: str, data_dir: str, *args: str) -> tuple[int, str]:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("YOKE_")}
    env["YOKE_DATA_DIR"] = data_dir  # where the server kept the instance files (SQLite)
    done = subprocess.run(
        [sys.executable, "-m", "yoke.cli", "check-deploy", "--db", url, *args], cwd=root, env=env,
        capture_output=True, text=True, timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


async def test_the_deploy_check(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await placed(y)
        await y.stream("/orders", T).append_many(
            [{"type": "order.line", "payload": {"id": f"K{n}", "sku": "apple", "qty": n}} for n in range(1, 4)]
        )
        await y.wait_idle(timeout_s=60)
        await y.sql_settled()
        before = await live_rows(fresh_url, tmp_path)

        # In Python: the same code does not diverge; the fix does, on every instance.
        same = await y.check_deploy(app, actors=["order"])
        assert (same["diverged"], same["checked"], same["errors"]) == (0, 4, 0)
        fixed = await y.check_deploy(fixed_app, actors=["order"], instances=2, inputs=2)
        [tenant] = fixed["tenants"]
        assert tenant["tenant"] == T and fixed["checked"] == 2 and fixed["diverged"] == 2
        for d in tenant["actors"]["order"]["diverged"]:
            assert d["first_input"] is not None and d["state_differs"]
        assert await live_rows(fresh_url, tmp_path) == before
    before = await live_rows(fresh_url, tmp_path)  # with the runtime closed

    # The command, as a CI job runs it: 0, 1, 2.
    data, only = str(tmp_path), ["--tenant", T]
    code, out = check_deploy_cli(fresh_url, data, "--app", "tests.actors.fork_app:app", "--actor", "order", *only)
    assert code == 0 and "no instance diverges (4 checked)" in out, out
    code, out = check_deploy_cli(fresh_url, data, "--app", "tests.actors.fork_app:fixed_app", "--actor", "order",
                                 "--json", *only)
    assert code == 1 and json.loads(out)["diverged"] == 4, out
    code, out = check_deploy_cli(fresh_url, data, "--app", "tests.actors.fork_app:fixed_app", "--current",
                                 "tests.actors.fork_app:app", "--actor", "order", "--instances", "1", *only)
    assert code == 1 and "1 instance(s) diverge (1 checked)" in out and "first at input" in out, out
    code, out = check_deploy_cli(fresh_url, data, "--app", "tests.actors.nowhere:app")
    assert code == 2 and "error:" in out, out
    code, out = check_deploy_cli(fresh_url, data, "--app", "tests.actors.fork_app:app", "--actor", "nope")
    assert code == 2 and "invalid_input" in out, out
    assert await live_rows(fresh_url, tmp_path) == before


async def test_a_node_actor_replays_in_a_node_host(fresh_url: str, tmp_path) -> None:
    from tests.actors.node_app import app as node_app

    async with yoke.open(fresh_url, app=node_app, data_dir=str(tmp_path)) as y:
        inst = await y.instances(T).create("js", key="k", filter={"types": ["go"]})
        await y.stream("/node", T).append_many(
            [{"type": "go", "payload": {}}, {"type": "go", "payload": {"what": "surface"}}, {"type": "go", "payload": {}}]
        )
        await y.wait_idle(timeout_s=60)
        fork = await y.instances(T).fork(inst.instance_id)
        assert fork.row.summary["runs"] == 3 and fork.row.summary["failed"] == 0
        d = await fork.diff()
        # The same runs, tables and effects; only what the script reads of
        # its own process (its pid) differs: shown as the handler reading
        # something outside ctx.
        assert d["nondeterministic"] and list(d["state"]["changed"]) == ["pid"], d
        assert d["tables"] == {} and d["effects"] == [] and d["outcomes"] == []

        # ctx.random() in a Node host: the fork draws what the live runs drew.
        lucky = await y.instances(T).create("lucky", key="k", filter={"types": ["draw"]})
        await y.stream("/node", T).append_many([{"type": "draw", "payload": {}}] * 2)
        await y.wait_idle(timeout_s=60)
        luck = (await y.instances(T).state(lucky.instance_id))[0]["luck"]
        assert len(luck) == 4 and len(set(luck)) == 4 and all(0 <= x < 1 for x in luck)
        d = await (await y.instances(T).fork(lucky.instance_id)).diff()
        assert d["changed"] is False, d


@pytest.mark.parametrize("postgres", [False, True], ids=["sqlite", "postgres"])
async def test_every_instance_of_the_example_application_forks_without_a_difference(
    postgres: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """yoke/examples/orders.py (make run): orders placed, paid, shipped by a
    schedule, a conversation message; every instance it made (the orders,
    the payments desk, the statistics) forks with no difference."""
    from tests.conftest import PG_ADMIN_URL
    from yoke.examples.orders import app as orders_app
    from yoke.testing import env

    monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    async with env(orders_app, postgres=postgres) as e:
        for order_id, total in (("A-1", 42), ("B-2", 7)):
            await e.y.stream(f"/orders/{order_id}").append(
                {"type": "order.placed", "payload": {"order_id": order_id, "items": ["tea"], "total": total}})
        await e.advance(seconds=3)  # the ship schedules fire
        assert (await e.state("order", "A-1"))["status"] == "shipped"
        instances = await e.y.instances().list()
        assert {i.actor for i in instances} == {"order", "payments", "stats"}
        for inst in instances:
            d = await (await e.y.instances().fork(inst.instance_id)).diff()
            assert d["changed"] is False, (inst.actor, inst.key, d)


async def test_inputs_after_the_fork_are_not_differences_and_incomplete_histories_are_refused(
    fresh_url: str, tmp_path
) -> None:
    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        iid = await placed(y, lines=LINES[:2])
        fork = await y.instances(T).fork(iid)
        await y.stream("/orders", T).append({"type": "order.line", "payload": {"id": "A", "sku": "kiwi", "qty": 1}})
        await y.wait_idle(timeout_s=60)
        # The live history to the fork's last input (replayed), not the instance now.
        assert (await fork.diff())["changed"] is False
        assert (await y.check_deploy(app, actors=["order"]))["diverged"] == 0

        with pytest.raises(errors.InvalidInput):
            await y.instances(T).fork(iid, upto=2**63)
        # An instance whose actor kept no inputs for a while (or that existed
        # before they were kept) has no complete history: no fork.
        assert await y.store.inputs.mark_incomplete(T, "order") == 1
        with pytest.raises(errors.InputsPruned):
            await y.instances(T).fork(iid)


def test_a_redriven_dead_letter_replays_once() -> None:
    from yoke.actors.forks import edited, superseded
    from yoke.store.inputs import InputRecord

    def record(seq: int, qid: int, outcome: str) -> InputRecord:
        return InputRecord(T, "inst", seq, qid, "/s", seq, {"type": "x", "payload": {}}, 1, outcome,  # type: ignore[arg-type]
                           0, 0, 0, None, None, None)

    records = [record(1, 10, "dead"), record(2, 11, "done"), record(3, 10, "done"), record(4, 12, "dead")]
    assert superseded(records) == {1}
    assert [i["seq"] for i in edited(records, [], 0)] == [2, 3, 4]


async def test_rows_the_build_before_completes_leave_their_instance_without_a_complete_history(
    pg_actors_db: str, tmp_path
) -> None:
    """During a rolling upgrade the build before completes rows with
    yoke_claim_in_turns, keeping no input: their instance is marked, and not
    forked (docs/production/upgrades.md)."""
    from tests.conftest import empty_database, now_ms

    await empty_database(pg_actors_db)
    async with yoke.open(pg_actors_db, app=app, data_dir=str(tmp_path), executor=False) as y:
        inst = await y.instances(T).create("order", key="old")
        assert await y.store.inputs.complete(T, inst.instance_id)
        from yoke.store.actors import Policy, QueueItem

        await y.store.actors.enqueue(T, [QueueItem(orjson.dumps({"type": "x"}).decode(), instance_id=inst.instance_id)],
                                     now_ms())
        conn = await asyncpg.connect(pg_actors_db)
        try:
            await conn.execute("UPDATE actor_instances SET worker_id = 'w-old'")
            [row] = await y.store.actors.claim(T, "w-old", [Policy("order", 1, 30_000)], now_ms(), 1)
            await conn.execute(  # as the build before completes it
                "SELECT * FROM yoke_claim_in_turns($1, 'w-old', ARRAY['order'], ARRAY[1], ARRAY[30000::bigint], $2, 0,"
                " ARRAY[$3::bigint], ARRAY[$4::integer], 0, 1, '', '')", T, now_ms(), row.qid, row.attempts,
            )
            assert await conn.fetchval("SELECT count(*) FROM actor_queue") == 0
        finally:
            await conn.close()
        assert not await y.store.inputs.complete(T, inst.instance_id)
        with pytest.raises(errors.InputsPruned):
            await y.instances(T).fork(inst.instance_id)
