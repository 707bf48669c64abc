"""The subscription catalogue is a rebuildable cache of the
control events in the log: a process that opens rebuilds a catalogue that is missing,
invalid or from another reducer version, and a long rebuild resumes from
its saved stage."""

from __future__ import annotations

import sqlite3
from typing import Any

import asyncpg

import yoke
from yoke.subscriptions.catalogue import REDUCER, rows_to_json
from yoke.store.subscriptions import SubscriptionRow

from .common import FAST

PATH = "/orders"


async def sql(url: str, statement: str, *args: Any) -> None:
    """No runtime is open: damage the tables the way an operator (or a lost
    write) would. The PostgreSQL superuser is not subject to row-level security."""
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url[len("sqlite:///"):])
        try:
            with conn:
                conn.execute(statement.replace("$1", "?").replace("$2", "?").replace("$3", "?"), args)
        finally:
            conn.close()
    else:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(statement, *args)
        finally:
            await conn.close()


async def reopen(url: str) -> list[tuple[str, str]]:
    """Open a process, let its catalogue check finish, close; what it rebuilt."""
    async with yoke.open(url, **FAST) as y:
        return await y.catalogues


async def test_missing_invalid_and_old_catalogues_are_rebuilt_on_open(fresh_url: str, tenant: str) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("a", yoke.call("not-here"), start="beginning")
        await s.subscribe("b", yoke.call("not-here"))
        await s.append_many([{"type": "x"}] * 3)
        await s.pause("b")
        await y.catalogues  # (it may have met the rows already and recorded them)
    # Rows without a record (a database from before records): rebuilt once.
    await sql(fresh_url, "DELETE FROM subscription_catalogues WHERE tenant_id=$1 AND path=$2", tenant, PATH)
    assert (tenant, PATH) in await reopen(fresh_url)
    assert (tenant, PATH) not in await reopen(fresh_url)  # now it matches
    async with yoke.open(fresh_url, **FAST) as y:
        record = await y.store.subscriptions.catalogue(tenant, PATH)
        assert (record.reducer, record.subscriptions, record.stage) == (REDUCER, 2, None)
        assert record.stream_id == (await y.stream(PATH, tenant).info()).stream_id
        await y.stream(PATH, tenant).subscribe("c", yoke.call("not-here"))  # counted by the control
        assert (await y.store.subscriptions.catalogue(tenant, PATH)).subscriptions == 3

    # A row gone missing: the count disagrees.
    await sql(fresh_url, "DELETE FROM subscriptions WHERE tenant_id=$1 AND path=$2 AND name=$3", tenant, PATH, "b")
    assert (tenant, PATH) in await reopen(fresh_url)
    async with yoke.open(fresh_url, **FAST) as y:
        statuses = {st.name: st for st in await y.stream(PATH, tenant).subscriptions()}
        assert sorted(statuses) == ["a", "b", "c"] and statuses["b"].state == "parked"

    # Another reducer version.
    await sql(fresh_url, "UPDATE subscription_catalogues SET reducer = '1' WHERE tenant_id=$1 AND path=$2",
              tenant, PATH)
    assert (tenant, PATH) in await reopen(fresh_url)
    async with yoke.open(fresh_url, **FAST) as y:
        assert (await y.store.subscriptions.catalogue(tenant, PATH)).reducer == REDUCER
        assert len(await y.stream(PATH, tenant).subscriptions()) == 3


def _marker(tenant: str, stream_id: str) -> SubscriptionRow:
    return SubscriptionRow(
        tenant=tenant, path=PATH, name="marker", config={"kind": "call", "function": "not-here", "filter": None,
        "transform": None, "start": "now", "on_failing_event": "halt"},
        configured_at=1, configured_id="e_marker", configured_ms=0, generation=1,
        source_stream_id=stream_id, cursor=1,
    )


async def test_a_saved_stage_of_the_same_stream_is_resumed(fresh_url: str, tenant: str) -> None:
    """A rebuild interrupted after a few pages left its stage (the rows
    reduced through an offset): the next rebuild continues from it, which a
    marker row only the stage holds proves; a stage whose creation time does
    not match the stream is started over."""
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("real", yoke.call("not-here"), start="beginning")
        await s.append_many([{"type": "x"}] * 5)  # 2..6
        info = await s.info()
        await s.rebuild_subscriptions()  # a record of this version
        rows = {"real": (await y.store.subscriptions.get(tenant, PATH, "real")), "marker": _marker(tenant, info.stream_id)}
        stage = {"through": 6, "created_at": info.created_at, "rows": rows_to_json(rows)}
        assert await y.store.subscriptions.save_catalogue_stage(tenant, PATH, info.stream_id, REDUCER, stage, 0)
        await s.append({"type": "x"})  # read after the stage
    assert (tenant, PATH) in await reopen(fresh_url)
    async with yoke.open(fresh_url, **FAST) as y:
        s = y.stream(PATH, tenant)
        assert sorted(st.name for st in await s.subscriptions()) == ["marker", "real"]
        record = await y.store.subscriptions.catalogue(tenant, PATH)
        assert record.stage is None and record.subscriptions == 2  # promoted, the stage removed with it
        await s.unsubscribe("marker")
        # A stage that does not prove this stream (another creation time) is not resumed.
        info = await s.info()
        rows = {"real": (await y.store.subscriptions.get(tenant, PATH, "real")), "marker": _marker(tenant, info.stream_id)}
        stage = {"through": 6, "created_at": info.created_at - 1, "rows": rows_to_json(rows)}
        assert await y.store.subscriptions.save_catalogue_stage(tenant, PATH, info.stream_id, REDUCER, stage, 0)
        assert not await y.store.subscriptions.save_catalogue_stage(tenant, PATH, "str_other", REDUCER, stage, 0)
    assert (tenant, PATH) in await reopen(fresh_url)
    async with yoke.open(fresh_url, **FAST) as y:
        assert [st.name for st in await y.stream(PATH, tenant).subscriptions()] == ["real"]


async def test_a_long_log_is_rebuilt_in_staged_pages(fresh_url: str, tenant: str) -> None:
    async with yoke.open(fresh_url, executor=False) as y:
        s = y.stream(PATH, tenant)
        await s.subscribe("early", yoke.call("not-here"), start="beginning")
        for _ in range(9):
            await s.append_many([{"type": "x"}] * 500)
        await s.subscribe("late", yoke.call("not-here"))
        await s.pause("early")
        [early, late] = await s.rebuild_subscriptions()
        assert (early.name, early.state, late.name, late.state) == ("early", "parked", "late", "running")
        record = await y.store.subscriptions.catalogue(tenant, PATH)
        assert record.stage is None and record.subscriptions == 2
