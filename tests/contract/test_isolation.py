"""Tenant isolation: through the API on both backends, and row-level security
on PostgreSQL whatever the query."""

from __future__ import annotations

import asyncpg
import pytest

import yoke
from yoke import errors


async def test_tenants_do_not_see_each_other(y, tenant):
    other = tenant + "-b"
    a, b = y.stream("/shared/path", tenant=tenant), y.stream("/shared/path", tenant=other)
    await a.append({"type": "secret", "payload": "a's"})
    assert await b.read() == []
    with pytest.raises(errors.StreamNotFound):
        await b.info()
    with pytest.raises(errors.InvalidCursor):
        await b.read(after=1)
    await b.append({"type": "mine", "payload": "b's"})
    assert [e.payload for e in await a.read()] == ["a's"]
    assert [e.payload for e in await b.read()] == ["b's"]
    assert [s.path for s in await y.streams(tenant=other)] == ["/", "/shared/path"]  # "/": its facts
    assert {s.tenant for s in await y.streams(tenant=other)} == {other}
    await b.close()
    assert not (await a.info()).closed


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_row_level_security_hides_other_tenants(db_url, tenant):
    async with yoke.open(db_url) as y:
        await y.stream("/a", tenant=tenant).append({"type": "x"})
        await y.stream("/b", tenant=tenant + "-b").append({"type": "y"})
        # The runtime's own pool logs in as the role without BYPASSRLS, so
        # not even RESET ROLE can escape it.
        async with y.store.pool.acquire() as conn:
            await conn.execute("RESET ROLE")
            assert await conn.fetchval("SELECT session_user") == "yoke_runtime"
            assert await conn.fetchval("SELECT current_user") == "yoke_runtime"
            assert not await conn.fetchval(
                "SELECT rolbypassrls OR rolsuper FROM pg_roles WHERE rolname = session_user"
            )
            async with conn.transaction():
                await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
                assert await conn.fetchval("SELECT count(*) FROM events WHERE tenant_id = $1", tenant + "-b") == 0
                # The SQL functions refuse a tenant other than the transaction's.
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.fetch("SELECT * FROM yoke_read($1, '/b', 0, 100, 10, NULL)", tenant + "-b")
            # Each in a transaction of its own (a refused call ends one).
            for call in ("SELECT * FROM yoke_read_stored($1, '/b', 0, 10, 1000)",
                         "SELECT * FROM yoke_read_payloads($1, '/b', 0, 10, 'ds.message')",
                         "SELECT * FROM yoke_protocol_stream($1, '/b')",
                         "SELECT * FROM yoke_append_in_lifetime($1, '/b', 'y', 0, '{}', '{}', '{}', '{}', '{}',"
                         " NULL, NULL, '{}', NULL, NULL, NULL, '{}', '{}', NULL, false, NULL, 'x')"):
                async with conn.transaction():
                    await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
                    with pytest.raises(asyncpg.InsufficientPrivilegeError):
                        await conn.fetch(call, tenant + "-b")

    conn = await asyncpg.connect(db_url)
    try:
        await conn.execute("SET ROLE yoke_runtime")
        async with conn.transaction():
            await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
            tenants = {r[0] for r in await conn.fetch("SELECT tenant_id FROM events")}
            assert tenants == {tenant}
            assert {r[0] for r in await conn.fetch("SELECT tenant_id FROM streams")} == {tenant}
            # Even an explicit filter on the other tenant finds nothing ...
            assert await conn.fetchval(
                "SELECT count(*) FROM events WHERE tenant_id = $1", tenant + "-b"
            ) == 0
            # ... and changes nothing.
            assert await conn.execute(
                "UPDATE streams SET closed = true WHERE tenant_id = $1", tenant + "-b"
            ) == "UPDATE 0"
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(
                    "INSERT INTO streams (tenant_id, path, stream_id, created_at)"
                    " VALUES ($1, '/forged', 'x', 0)",
                    tenant + "-b",
                )
        # No tenant set: no rows at all.
        assert await conn.fetchval("SELECT count(*) FROM events") == 0
    finally:
        await conn.close()


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_actor_tables_and_functions_are_tenant_scoped(db_url, tenant):
    other = tenant + "-b"
    async with yoke.open(db_url) as y:
        await y.instances(tenant).create("a", key="k")
        theirs = await y.instances(other).create("a", key="k")
        with pytest.raises(yoke.InstanceNotFound):
            await y.instances(tenant).get(theirs.instance_id)
        async with y.store.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
            for table in ("actor_instances", "actor_queue", "actor_schedules", "fanout_cursors",
                          "actor_sqlite", "conversation_messages", "routing_versions"):
                assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE tenant_id = $1", other) == 0
            for call in (
                "SELECT * FROM yoke_claim($1, 'w', ARRAY['a'], ARRAY[1], ARRAY[1000::bigint], 0, 10,"
                " ARRAY[]::bigint[], ARRAY[]::int[], 0, 1)",
                "SELECT yoke_fanout($1, '/', 0, 0, 0, 'w', 0, ARRAY[]::text[], ARRAY[]::text[],"
                " ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::int[], ARRAY[]::bigint[],"
                " ARRAY[]::text[])",
            ):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    async with conn.transaction():  # a savepoint: the outer transaction lives on
                        await conn.fetch(call, other)
