"""A PostgreSQL transaction begins with its tenant set in one round trip
(``BEGIN; SELECT set_config(...)`` as one simple-protocol message, the
tenant a quoted literal): the literal must read back as the very text
given, whatever the text and the server's ``standard_conforming_strings``."""

from __future__ import annotations

import asyncpg
import pytest

from yoke import errors
from yoke.store.postgres.connection import quoted

AWKWARD = ["plain", "o'neil", "back\\slash", "\\'; DROP TABLE x; --", "''", "\\", "ünï©ødé", "tab\tnew\nline"]


@pytest.mark.parametrize("conforming", ["on", "off"])
async def test_a_quoted_literal_reads_back_as_given(pg_url: str, conforming: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f"SET standard_conforming_strings = {conforming}")
        for text in AWKWARD:
            await conn.execute(f"BEGIN; SELECT set_config('yoke.tenant', {quoted(text)}, true)")
            assert await conn.fetchval("SELECT current_setting('yoke.tenant')") == text
            await conn.execute("ROLLBACK")
    finally:
        await conn.close()


def test_nul_is_refused() -> None:
    with pytest.raises(errors.InvalidInput):
        quoted("a\x00b")


async def test_a_transaction_sees_its_tenant(pg_url: str, tenant: str) -> None:
    from yoke.config import Settings
    from yoke.store import connect_store

    store = connect_store(Settings(database_url=pg_url))
    await store.start(on_wakeup=lambda tenant, path: None, on_resync=lambda: None)
    try:
        async with store.actors._db.tx(tenant) as conn:
            assert await conn.fetchval("SELECT current_setting('yoke.tenant')") == tenant
        async with store.actors._db.tx("o'neil") as conn:
            assert await conn.fetchval("SELECT current_setting('yoke.tenant')") == "o'neil"
    finally:
        await store.close()
