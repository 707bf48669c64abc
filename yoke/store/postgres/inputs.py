"""PostgreSQL: an instance's kept inputs (``store/inputs.py``).

Completions are kept by yoke_complete_and_claim (functions/); ``record``
keeps one in the actor store's other finishing transactions (a row buried
as dead, an atomic run's commit), from what the statement that finished the
row returned; ``PgInputs`` lists and prunes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

from ..inputs import INPUT_COLUMNS, Completion, InputPage, input_from_row

if TYPE_CHECKING:
    from .connection import PgDb

# A finished queue row (the values its delete or update returned) kept as its
# instance's next input; the caller holds the instance's lock (LOCK_INSTANCE).
RECORD = (
    "INSERT INTO actor_inputs (tenant_id, instance_id, seq, qid, path, stream_seq, event, attempts, outcome,"
    " enqueued_at, started_at, processed_at, code_version, tape, last_error)"
    " SELECT $1, $2, coalesce((SELECT max(a.seq) FROM actor_inputs a"
    "                          WHERE a.tenant_id = $1 AND a.instance_id = $2), 0) + 1,"
    " $3, $4, $5, $6::json, $7, $8, $9, $10, $11, $12, $13::json, $14"
)
# The transactions that number an instance's inputs take its lock first, as
# yoke_complete_and_claim does (functions/).
LOCK_INSTANCE = "SELECT pg_advisory_xact_lock(24066, hashtext($1 || '/' || $2))"
# What RECORD needs of a queue row, returned by the statement that finishes it.
RETURNING = " RETURNING instance_id, qid, path, seq, event::text, attempts, enqueued_at, started_at"
# As read back (json columns as text: input_from_row parses them).
COLUMNS = INPUT_COLUMNS.replace("event,", "event::text,").replace("tape,", "tape::text,")


async def lock_instance(conn: asyncpg.Connection, tenant: str, instance_id: str) -> None:
    await conn.execute(LOCK_INSTANCE, tenant, instance_id)


async def record(
    conn: asyncpg.Connection, tenant: str, row: asyncpg.Record, done: Completion, now: int, outcome: str = "done",
    error: str | None = None,
) -> None:
    """Keep ``row`` (a queue row as RETURNING returned it) as its instance's
    next input; the instance's lock is held (lock_instance)."""
    if not done.keep:
        return
    await conn.execute(
        RECORD, tenant, row["instance_id"], row["qid"], row["path"], row["seq"], row["event"], row["attempts"],
        outcome, row["enqueued_at"], row["started_at"], done.processed_at or now, done.code_version, done.tape,
        error,
    )


class PgInputs:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def inputs(
        self, tenant: str, instance_id: str, *, after: int = 0, upto: int | None = None, limit: int = 100,
    ) -> InputPage:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {COLUMNS} FROM actor_inputs WHERE tenant_id=$1 AND instance_id=$2 AND seq > $3"
                " AND ($4::bigint IS NULL OR seq <= $4) ORDER BY seq, input_id LIMIT $5",
                tenant, instance_id, after, upto, limit + 1,
            )
        found = [input_from_row(r) for r in rows]
        more = len(found) > limit
        found = found[:limit]
        return InputPage(found, found[-1].seq if more else None)

    async def prune(
        self, tenant: str, actor: str, *, keep: int | None, before_ms: int | None, limit: int,
    ) -> int:
        async with self._db.tx(tenant) as conn:
            status = await conn.execute(
                "DELETE FROM actor_inputs WHERE tenant_id=$1 AND input_id IN ("
                " SELECT a.input_id FROM actor_inputs a JOIN actor_instances i"
                "  ON i.tenant_id = a.tenant_id AND i.instance_id = a.instance_id"
                " WHERE a.tenant_id=$1 AND i.actor=$2"
                "  AND (($3::bigint IS NOT NULL AND a.processed_at < $3 AND a.seq < (SELECT max(b.seq) FROM actor_inputs b"
                "        WHERE b.tenant_id = a.tenant_id AND b.instance_id = a.instance_id))"
                "   OR ($4::bigint IS NOT NULL AND a.seq <= (SELECT max(b.seq) FROM actor_inputs b"
                "        WHERE b.tenant_id = a.tenant_id AND b.instance_id = a.instance_id) - $4))"
                " LIMIT $5)",
                tenant, actor, before_ms, keep, limit,
            )
        return int(status.split()[-1])

    async def complete(self, tenant: str, instance_id: str) -> bool:
        async with self._db.tx(tenant) as conn:
            incomplete = await conn.fetchval(
                "SELECT inputs_incomplete FROM actor_instances WHERE tenant_id=$1 AND instance_id=$2",
                tenant, instance_id,
            )
        return incomplete is False

    async def mark_incomplete(self, tenant: str, actor: str) -> int:
        async with self._db.tx(tenant) as conn:
            status = await conn.execute(
                "UPDATE actor_instances SET inputs_incomplete = true WHERE tenant_id=$1 AND actor=$2"
                " AND NOT inputs_incomplete", tenant, actor,
            )
        return int(status.split()[-1])
