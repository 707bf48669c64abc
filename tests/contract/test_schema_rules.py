"""The PostgreSQL schema stays distributable by tenant (docs/production/scaling.md).

Citus distributes a table by one column and routes a statement to one node
when it filters on that column; a unique index or primary key must contain
it, and foreign keys must join on it. Yoke keeps that path open by rule:
these tests read the catalogue after every migration, so a migration that
breaks a rule fails here, naming the table, index or function.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from tests.conftest import PG_ADMIN_URL, with_database
from yoke.store.postgres import migrate

# Tables without a tenant: each would be a Citus reference table (replicated
# to every node) or stay on the coordinator.
GLOBAL_TABLES = {
    "yoke_schema_version": "migration bookkeeping, one row per migration",
    "runtime_workers": "worker heartbeats; workers serve every tenant",
    "yoke_relay": "one row: the secret channel name of the ephemeral relay",
    "actor_state_home": "one row: where every instance's state lives (storage, data directory), for all tenants",
    "delivery_owners": "delivering processes' heartbeats (their subscription leases); they deliver every tenant's",
}

# Unique indexes that do not lead with tenant_id, and why they are allowed.
GLOBAL_UNIQUE = {
    # Sign-in finds a token by its id before the tenant is known. A token id
    # is 128 random bits; on Citus this index becomes a reference table
    # (token_id -> tenant_id) and the token row stays distributed.
    "tokens_token_id_key": "sign-in lookup by token id",
}

# Functions that run before a tenant is known.
TENANTLESS_FUNCTIONS = {
    "yoke_find_token": "sign-in",
    # Trigger functions take no arguments: each acts on its row's own tenant_id.
    "yoke_stream_fact": "trigger on streams (lifecycle facts)",
    "yoke_instance_fact": "trigger on actor_instances (lifecycle facts)",
}


async def read_catalogue() -> dict[str, list]:
    """Migrate a fresh database and read what the rules look at."""
    name = f"yoke_rules_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        conn = await asyncpg.connect(with_database(PG_ADMIN_URL, name))
        try:
            await migrate.migrate(conn)
            tables = await conn.fetch(
                "SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid"
                " AND a.attname = 'tenant_id' AND NOT a.attisdropped) AS has_tenant"
                " FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace"
                " AND c.relkind IN ('r', 'p', 'u')"
            )
            unique = await conn.fetch(
                "SELECT t.relname AS tbl, i.relname AS idx, ix.indisprimary AS pk,"
                " (SELECT array_agg(a.attname ORDER BY k.ord) FROM unnest(ix.indkey)"
                "  WITH ORDINALITY k(attnum, ord) JOIN pg_attribute a"
                "  ON a.attrelid = t.oid AND a.attnum = k.attnum) AS cols"
                " FROM pg_index ix JOIN pg_class t ON t.oid = ix.indrelid"
                " JOIN pg_class i ON i.oid = ix.indexrelid"
                " WHERE t.relnamespace = 'public'::regnamespace AND ix.indisunique"
            )
            foreign = await conn.fetch(
                "SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def"
                " FROM pg_constraint WHERE contype = 'f'"
                " AND connamespace = 'public'::regnamespace"
            )
            functions = await conn.fetch(
                "SELECT p.proname, p.proargnames FROM pg_proc p"
                " WHERE p.pronamespace = 'public'::regnamespace"
            )
        finally:
            await conn.close()
        return {"tables": tables, "unique": unique, "foreign": foreign, "functions": functions}
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture(scope="module")
def catalogue() -> dict[str, list]:
    return asyncio.run(read_catalogue())


def test_every_table_has_a_tenant_or_is_a_named_global_table(catalogue):
    tenantless = {r["relname"] for r in catalogue["tables"] if not r["has_tenant"]}
    assert tenantless == set(GLOBAL_TABLES), (
        "a table without tenant_id must be listed (with why) in GLOBAL_TABLES: "
        f"{sorted(tenantless ^ set(GLOBAL_TABLES))}"
    )


def test_every_key_and_unique_index_leads_with_the_tenant(catalogue):
    global_tables = set(GLOBAL_TABLES)
    offenders = [
        (r["tbl"], r["idx"], r["cols"])
        for r in catalogue["unique"]
        if r["tbl"] not in global_tables
        and r["idx"] not in GLOBAL_UNIQUE
        and (not r["cols"] or r["cols"][0] != "tenant_id")
    ]
    assert offenders == [], f"unique indexes must lead with tenant_id: {offenders}"
    primary = {r["tbl"] for r in catalogue["unique"] if r["pk"]}
    tenant_tables = {r["relname"] for r in catalogue["tables"] if r["has_tenant"]}
    assert tenant_tables <= primary, f"tables without a primary key: {sorted(tenant_tables - primary)}"


def test_foreign_keys_join_on_the_tenant(catalogue):
    offenders = [
        (r["tbl"], r["conname"], r["def"])
        for r in catalogue["foreign"]
        if "tenant_id" not in r["def"].split("REFERENCES")[0]
    ]
    assert offenders == [], f"a foreign key must include tenant_id on both sides: {offenders}"


def test_every_function_takes_the_tenant_first(catalogue):
    offenders = [
        (r["proname"], (r["proargnames"] or [None])[0])
        for r in catalogue["functions"]
        if r["proname"] not in TENANTLESS_FUNCTIONS
        and (not r["proargnames"] or r["proargnames"][0] != "p_tenant")
    ]
    assert offenders == [], (
        "a function's first argument is the tenant (its distribution argument on Citus): "
        f"{offenders}"
    )
