"""Statements PostgreSQL rolls back without ending the session: a cancel
(57014: ``pg_cancel_backend``, ``statement_timeout``), a deadlock victim
(40P01), a serialization failure (40001), a lock not available (55P03:
``lock_timeout``), and a write refused by a read-only session (25006, a
standby after a failover). They reach callers as ``errors.Unavailable`` (reason
``cancelled``, ``conflict`` or ``read_only``), never as an asyncpg exception; nothing of
the transaction was written, the connection stays in use (a read-only one is
dropped: see the last test), and the appender tries every caller again
(keyed or not) before answering so."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from prometheus_client import REGISTRY

import yoke
from tests.conftest import admin_sql
from yoke import errors

from .common import Cutter, database_name, is_driver_error, pg_database

TENANT = "rolled"


@pytest.mark.parametrize(
    ("sqlstate", "reason"),
    [("57014", "cancelled"), ("40P01", "conflict"), ("40001", "conflict"), ("55P03", "conflict")],
)
async def test_each_rolled_back_class_is_unavailable(pg_url: str, sqlstate: str, reason: str) -> None:
    raise_it = f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$"
    tenant = f"{TENANT}-{sqlstate.lower()}"
    async with yoke.open(pg_url, executor=False) as y:
        store = y.store
        pids = {h._con.get_server_pid() for h in store.pool._holders if h._con is not None}  # noqa: SLF001
        with pytest.raises(errors.Unavailable) as caught:
            await store.db.execute(raise_it)  # noqa: SLF001 - the statement path itself
        assert caught.value.details["reason"] == reason and caught.value.http_status == 503
        assert "nothing was written" in caught.value.message
        assert not is_driver_error(caught.value)
        # In a transaction: what it wrote before the failure is rolled back.
        with pytest.raises(errors.Unavailable) as caught:
            async with store.db.tx(tenant) as conn:  # noqa: SLF001
                await conn.execute("INSERT INTO yoke_tenants VALUES ($1, 0)", tenant)
                await conn.execute(raise_it)
        assert caught.value.details["reason"] == reason
        async with store.db.tx(tenant) as conn:  # noqa: SLF001
            assert await conn.fetchval("SELECT count(*) FROM yoke_tenants WHERE tenant_id=$1", tenant) == 0
        # The connections stayed open (none was replaced).
        assert {h._con.get_server_pid() for h in store.pool._holders if h._con is not None} >= pids  # noqa: SLF001
        stream = y.stream("/after", tenant=tenant)
        assert (await stream.append({"type": "ok"})).offset == 1


@pytest.mark.parametrize(("setting", "reason"), [("lock_timeout", "conflict"), ("statement_timeout", "cancelled")])
async def test_a_stream_row_held_by_another_session(monkeypatch, setting: str, reason: str) -> None:
    """Another session holds the stream row; the database's lock_timeout
    (55P03) or statement_timeout (57014) ends the append's wait. The
    appender tries again, keyed or not, for its retry budget, then answers
    ``unavailable``; nothing was appended, and once the row is free the
    same calls succeed."""
    from yoke.streams import append

    monkeypatch.setattr(append, "APPEND_RETRY_S", 0.5)
    async with pg_database() as url:
        # Migrated first: the 100 ms limit is for the appends (a migration's
        # statement can take longer on a loaded machine: it failed the open).
        async with yoke.open(url, executor=False):
            pass
        await admin_sql(f'ALTER DATABASE "{database_name(url)}" SET {setting} = \'100ms\'')
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/held", tenant=TENANT)
            await stream.append({"type": "first"})
            holder = await asyncpg.connect(url)  # the superuser, past RLS
            try:
                await holder.execute(f"SET {setting} = 0")
                tx = holder.transaction()
                await tx.start()
                await holder.execute("SELECT 1 FROM streams WHERE tenant_id=$1 AND path='/held' FOR UPDATE", TENANT)
                for event in ({"type": "unkeyed"}, {"type": "keyed", "idempotency_key": "k"}):
                    loop = asyncio.get_running_loop()
                    started = loop.time()
                    with pytest.raises(errors.Unavailable) as caught:
                        await stream.append(event)
                    assert caught.value.details["reason"] == reason
                    assert loop.time() - started >= 0.4  # tried again for the budget
                    assert not is_driver_error(caught.value)
                # Reads do not wait for the row.
                assert [e.type for e in await stream.read()] == ["first"]
                await tx.rollback()
            finally:
                await holder.close()
            await stream.append({"type": "unkeyed"})
            await stream.append({"type": "keyed", "idempotency_key": "k"})
            assert [e.type for e in await stream.read()] == ["first", "unkeyed", "keyed"]


async def test_a_deadlock_victim_is_unavailable_and_rolled_back() -> None:
    """A real deadlock between a runtime transaction and another session:
    the runtime's statement is the victim (its deadlock_timeout is shorter),
    which is ``Unavailable`` reason ``conflict``, with its transaction
    rolled back, while the other session goes on."""
    async with pg_database() as url:
        await admin_sql(f'ALTER DATABASE "{database_name(url)}" SET deadlock_timeout = \'50ms\'')
        async with yoke.open(url, executor=False) as y:
            await y.stream("/a", tenant=TENANT).create()
            await y.stream("/b", tenant=TENANT).create()
            other = await asyncpg.connect(url)  # the superuser, past RLS
            try:
                await other.execute("SET deadlock_timeout = '10s'")
                tx = other.transaction()
                await tx.start()
                await other.execute("UPDATE streams SET metadata = '{\"by\": \"other\"}' WHERE path = '/a'")
                locked_b, other_waits = asyncio.Event(), asyncio.Event()

                async def runtime_side() -> None:
                    async with y.store.db.tx(TENANT) as conn:  # noqa: SLF001
                        await conn.execute(
                            "UPDATE streams SET metadata = '{\"by\": \"runtime\"}' WHERE path = '/b'")
                        locked_b.set()
                        await other_waits.wait()
                        await conn.execute(
                            "UPDATE streams SET metadata = '{\"by\": \"runtime\"}' WHERE path = '/a'")

                task = asyncio.create_task(runtime_side())
                await locked_b.wait()
                # The other session waits for /b, then the runtime for /a: the
                # runtime closes the cycle and finds it 50 ms later.
                blocked = asyncio.create_task(other.execute(
                    "UPDATE streams SET metadata = '{\"by\": \"other\"}' WHERE path = '/b'"))
                await asyncio.sleep(0.1)
                assert not blocked.done()
                other_waits.set()
                with pytest.raises(errors.Unavailable) as caught:
                    await task
                assert caught.value.details["reason"] == "conflict"
                assert isinstance(caught.value.__cause__, asyncpg.DeadlockDetectedError)
                await blocked
                await tx.commit()
            finally:
                await other.close()
            for path in ("/a", "/b"):
                info = await y.stream(path, tenant=TENANT).info()
                assert info.metadata == {"by": "other"}, (path, info.metadata)


def read_only_faults() -> float:
    return REGISTRY.get_sample_value("yoke_database_errors_total", {"kind": "read_only"}) or 0.0


async def test_a_read_only_session_is_dropped_and_the_append_rides_through(monkeypatch) -> None:
    """After a failover a pooled connection can reach a standby: every write
    is refused (25006 read_only_sql_transaction). That is ``unavailable``
    (reason ``read_only``, nothing written, so every caller is tried again,
    keyed or not), and the connection is dropped, so that once a writable
    server answers (here: the role's sessions are made read-only, then
    writable again) the same append succeeds without a restart."""
    from yoke.streams import append

    monkeypatch.setattr(append, "APPEND_RETRY_S", 0.5)
    async with pg_database() as url, Cutter(url) as cutter:
        async with yoke.open(url, executor=False) as y:
            stream = y.stream("/failover", tenant=TENANT)
            await stream.append({"type": "first"})
            role_in_db = f'ALTER ROLE yoke_runtime IN DATABASE "{database_name(url)}"'
            await admin_sql(f"{role_in_db} SET default_transaction_read_only = on")
            await cutter.cut()  # every session of the role ends; the new ones are read-only
            assert [e.type for e in await stream.read()] == ["first"]  # reads work on a standby

            with pytest.raises(errors.Unavailable) as caught:
                await stream.append({"type": "refused"})
            assert caught.value.details["reason"] == "read_only" and caught.value.http_status == 503
            assert "nothing was written" in caught.value.message and not is_driver_error(caught.value)

            monkeypatch.setattr(append, "APPEND_RETRY_S", 30.0)
            before = read_only_faults()
            second = asyncio.create_task(stream.append({"type": "second"}))  # no idempotency key
            while read_only_faults() == before:  # refused at least once...
                await asyncio.sleep(0.01)
            await admin_sql(f"{role_in_db} RESET default_transaction_read_only")  # ...then the primary is back
            assert (await second).offset == 2
            assert [e.type for e in await stream.read()] == ["first", "second"]
