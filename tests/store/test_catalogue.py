"""The SQL catalogue's storage contract (``store/catalogue.py``) on both
drivers: mirror writes and their version rules, the union of columns,
queries over actor tables and Yoke's records, refusals, limits, tenants
and removal."""

from __future__ import annotations

import pytest

from tests.conftest import now_ms
from tests.store.conftest import append
from yoke.store.actors import InstanceInfo, new_instance_id
from yoke.store.catalogue import Column, InstanceRows, TableRows
from yoke.store.catalogue_query import SqlRefused, plan

pytestmark = pytest.mark.asyncio
ITEMS = (Column("sku", "TEXT"), Column("qty", "INTEGER"), Column("price", "REAL"))


async def instance(store, tenant, actor="cart", key="k") -> InstanceInfo:
    info, _ = await store.actors.create_instance(
        InstanceInfo(new_instance_id(), tenant, actor, key, {}, None, None, None, now_ms())
    )
    return info


def whole(iid: str, version: int, rows: dict[int, tuple], shape=ITEMS) -> InstanceRows:
    names = tuple(c.name for c in shape)
    return InstanceRows(iid, version, {"items": TableRows(names, dict(rows), whole=True)}, {"items": shape}, whole=True)


async def rows(store, tenant, sql, params=()) -> list[list]:
    result = await query(store, tenant, sql, list(params), max_rows=1000, timeout_s=5)
    return result.rows


async def query(store, tenant, sql, params, **limits):
    return await store.catalogue.query(tenant, plan(sql, store.catalogue.dialect), params, **limits)


async def test_whole_then_incremental_changes(store, tenant) -> None:
    a = await instance(store, tenant, key="a")
    assert await store.catalogue.mirror(tenant, [whole(a.instance_id, 10, {1: ("tea", 2, 1.5), 2: ("cup", 1, 4.0)})]) == set()
    q = 'SELECT key, sku, qty, price FROM cart.items ORDER BY sku'
    assert await rows(store, tenant, q) == [["a", "cup", 1, 4.0], ["a", "tea", 2, 1.5]]
    # A later change: one row updated, one deleted, one added.
    change = InstanceRows(a.instance_id, 11, {"items": TableRows(("sku", "qty", "price"), {1: ("tea", 5, 1.5), 3: ("pot", 1, 20.0)}, {2})})
    assert await store.catalogue.mirror(tenant, [change]) == set()
    assert await rows(store, tenant, q) == [["a", "pot", 1, 20.0], ["a", "tea", 5, 1.5]]
    assert await store.catalogue.mirrored(tenant, [a.instance_id, "inst_none"]) == {a.instance_id: 11}


async def test_an_older_version_never_replaces_a_newer_one(store, tenant) -> None:
    a = await instance(store, tenant)
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 20, {1: ("new", 1, 1.0)})])
    stale = InstanceRows(a.instance_id, 19, {"items": TableRows(("sku", "qty", "price"), {1: ("old", 1, 1.0)})})
    assert await store.catalogue.mirror(tenant, [stale]) == set()
    assert await store.catalogue.mirror(tenant, [whole(a.instance_id, 19, {1: ("old", 1, 1.0)})]) == set()
    assert await rows(store, tenant, "SELECT sku FROM cart.items") == [["new"]]


async def test_an_incremental_change_of_an_unmirrored_instance_asks_for_a_whole_one(store, tenant) -> None:
    a = await instance(store, tenant)
    change = InstanceRows(a.instance_id, 3, {"items": TableRows(("sku", "qty", "price"), {1: ("x", 1, 1.0)})})
    assert await store.catalogue.mirror(tenant, [change]) == {a.instance_id}
    assert await store.catalogue.mirrored(tenant, [a.instance_id]) == {}


async def test_columns_are_the_union_of_the_instances_and_missing_ones_read_null(store, tenant) -> None:
    a, b = await instance(store, tenant, key="a"), await instance(store, tenant, key="b")
    await store.catalogue.mirror(tenant, [
        whole(a.instance_id, 1, {1: ("tea", 2, 1.5)}),
        whole(b.instance_id, 1, {1: ("cup", 1)}, shape=(Column("sku", "TEXT"), Column("qty", "INTEGER"))),
    ])
    result = await query(
        store, tenant, "SELECT * FROM cart.items ORDER BY key", [], max_rows=10, timeout_s=5
    )
    assert result.columns == ["instance_id", "key", "sku", "qty", "price"]
    assert [r[1:] for r in result.rows] == [["a", "tea", 2, 1.5], ["b", "cup", 1, None]]
    [table] = [t for t in await store.catalogue.tables(tenant) if t.schema == "cart"]
    assert [c.name for c in table.columns] == ["instance_id", "key", "sku", "qty", "price"]


async def test_a_reshaped_table_and_a_dropped_one(store, tenant) -> None:
    a = await instance(store, tenant)
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 1, {1: ("tea", 2, 1.5)})])
    wider = (*ITEMS, Column("note", "TEXT"))
    change = InstanceRows(
        a.instance_id, 2,
        {"items": TableRows(("sku", "qty", "price", "note"), {1: ("tea", 2, 1.5, "hot")}, whole=True),
         "tags": TableRows(("tag",), {1: ("x",)}, whole=True)},
        {"items": wider, "tags": (Column("tag", "TEXT"),)},
    )
    await store.catalogue.mirror(tenant, [change])
    assert await rows(store, tenant, "SELECT note FROM cart.items") == [["hot"]]
    assert await rows(store, tenant, "SELECT tag FROM cart.tags") == [["x"]]
    dropped = InstanceRows(a.instance_id, 3, {}, {"items": wider})
    await store.catalogue.mirror(tenant, [dropped])
    with pytest.raises(SqlRefused) as refused:
        await rows(store, tenant, "SELECT tag FROM cart.tags")
    assert refused.value.code == "sql_unknown_table"


async def test_a_removed_instance_leaves_the_mirror(store, tenant) -> None:
    a, b = await instance(store, tenant, key="a"), await instance(store, tenant, key="b")
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 1, {1: ("tea", 1, 1.0)}),
                                          whole(b.instance_id, 1, {1: ("cup", 1, 1.0)})])
    await store.actors.remove_instance(tenant, a.instance_id)
    assert await rows(store, tenant, "SELECT key FROM cart.items") == [["b"]]
    assert await store.catalogue.mirrored(tenant, [a.instance_id]) == {}
    # A late write for it (a send that raced the removal) keeps nothing.
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 2, {1: ("tea", 1, 1.0)})])
    assert await rows(store, tenant, "SELECT key FROM cart.items") == [["b"]]


async def test_tenants_see_only_their_own(store, tenant) -> None:
    other = tenant + "-other"
    a = await instance(store, tenant, key="mine")
    b = await instance(store, other, key="theirs")
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 1, {1: ("tea", 1, 1.0)})])
    await store.catalogue.mirror(other, [whole(b.instance_id, 1, {1: ("cup", 1, 1.0)})])
    assert await rows(store, tenant, "SELECT key, sku FROM cart.items") == [["mine", "tea"]]
    assert await rows(store, other, "SELECT key, sku FROM cart.items") == [["theirs", "cup"]]
    assert await rows(store, tenant, "SELECT key FROM yoke.instances") == [["mine"]]


async def test_yoke_records(store, tenant) -> None:
    a = await instance(store, tenant, key="a")
    await append(store, tenant, "/orders", 3)
    assert await rows(store, tenant, "SELECT instance_id, actor, key FROM yoke.instances") == [[a.instance_id, "cart", "a"]]
    assert await rows(store, tenant, "SELECT head FROM yoke.streams WHERE path = '/orders'") == [[3]]
    assert await rows(store, tenant, 'SELECT "offset", type FROM yoke.events WHERE path = ? ORDER BY 1', ["/orders"]) == [
        [1, "e"], [2, "e"], [3, "e"],
    ]
    assert await rows(store, tenant, "SELECT count(*) FROM yoke.queue") == [[0]]
    assert await rows(store, tenant, "SELECT count(*) FROM yoke.schedules") == [[0]]
    assert await rows(store, tenant, "SELECT count(*) FROM yoke.subscriptions") == [[0]]
    failures = [{"id": "f1", "kind": "dead_letter", "receiver": "actor", "path": "/orders", "offset": 2,
                 "failed_at": 5, "attempt_count": 3, "error": "boom", "actor": "cart", "instance_id": a.instance_id}]
    result = await query(
        store, tenant, "SELECT kind, error, attempt_count FROM yoke.failures", [], max_rows=10, timeout_s=5, failures=failures
    )
    assert result.rows == [["dead_letter", "boom", 3]]


async def test_refusals_change_nothing(store, tenant, backend) -> None:
    a = await instance(store, tenant)
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 1, {1: ("tea", 1, 1.0)})])
    refused = {
        "SELECT 1; SELECT 2": "sql_one_statement",
        "DELETE FROM cart.items": "sql_read_only",
        "UPDATE cart.items SET qty = 0": "sql_read_only",
        "DROP TABLE cart.items": "sql_read_only",
        "SELECT * FROM sql_rows": "sql_unknown_table",
        "SELECT * FROM actor_instances": "sql_unknown_table",
        "SELECT * FROM yoke.events": "sql_events_unbounded",
        "SELECT * FROM yoke.nothing": "sql_unknown_table",
        "SELEC 1": "sql_read_only" if backend == "sqlite" else "sql_syntax",
    }
    if backend == "sqlite":
        refused["SELECT load_extension('x')"] = "sql_function_refused"
        refused["PRAGMA user_version = 3"] = "sql_read_only"
        refused["ATTACH 'x.db' AS x"] = "sql_read_only"
    else:
        refused["SELECT pg_read_file('/etc/passwd')"] = "sql_function_refused"
        refused["SELECT set_config('yoke.tenant', 'other', true)"] = "sql_function_refused"
        refused["SELECT * FROM cart.items FOR UPDATE"] = "sql_read_only"
        refused["SELECT * INTO stolen FROM cart.items"] = "sql_read_only"
    for sql, code in refused.items():
        with pytest.raises(SqlRefused) as caught:
            await rows(store, tenant, sql)
        assert caught.value.code in (code, "sql_syntax"), (sql, caught.value.code, caught.value.message)
    assert await rows(store, tenant, "SELECT sku, qty FROM cart.items") == [["tea", 1]]


async def test_row_and_time_limits(store, tenant, backend) -> None:
    a = await instance(store, tenant)
    await store.catalogue.mirror(tenant, [whole(a.instance_id, 1, {i: (f"s{i}", i, 1.0) for i in range(1, 6)})])
    result = await query(store, tenant, "SELECT sku FROM cart.items ORDER BY qty", [], max_rows=3, timeout_s=5)
    assert result.rows == [["s1"], ["s2"], ["s3"]] and result.truncated
    endless = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000)"
        " SELECT count(*) FROM n"
    )
    with pytest.raises(SqlRefused) as caught:
        await query(store, tenant, endless, [], max_rows=3, timeout_s=0.2)
    assert caught.value.code == "sql_timeout"
