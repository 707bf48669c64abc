"""PostgreSQL: an instance's kept inputs (``store/inputs.py``).

Completions are kept by yoke_complete_and_claim (functions/); ``record``
keeps one in the actor store's other finishing transactions (a row buried
as dead, an atomic run's commit), before the queue row it copies changes;
``PgInputs`` lists and prunes them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg

from ..inputs import INPUT_COLUMNS, Completion, InputPage, input_from_row

if TYPE_CHECKING:
    from .connection import PgDb

RECORD = (
    "INSERT INTO actor_inputs (tenant_id, instance_id, seq, qid, path, stream_seq, event, attempts, outcome,"
    " enqueued_at, started_at, processed_at, code_version, tape, last_error)"
    " SELECT q.tenant_id, q.instance_id,"
    "  coalesce((SELECT max(a.seq) FROM actor_inputs a"
    "            WHERE a.tenant_id = q.tenant_id AND a.instance_id = q.instance_id), 0) + 1,"
    "  q.qid, q.path, q.seq, q.event, q.attempts, $4, q.enqueued_at, q.started_at, $5, $6, $7::json, $8"
    " FROM actor_queue q WHERE q.tenant_id=$1 AND q.qid=$2 AND q.attempts=$3 AND q.status='processing'"
)
# As read back (json columns as text: input_from_row parses them).
COLUMNS = INPUT_COLUMNS.replace("event,", "event::text,").replace("tape,", "tape::text,")


async def record(
    conn: asyncpg.Connection, tenant: str, done: Completion, now: int, outcome: str = "done",
    error: str | None = None,
) -> None:
    if not done.keep:
        return
    await conn.execute(
        RECORD, tenant, done.qid, done.attempts, outcome, done.processed_at or now, done.code_version, done.tape,
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
                "  AND (($3::bigint IS NOT NULL AND a.processed_at < $3)"
                "   OR ($4::bigint IS NOT NULL AND a.seq <= (SELECT max(b.seq) FROM actor_inputs b"
                "        WHERE b.tenant_id = a.tenant_id AND b.instance_id = a.instance_id) - $4))"
                " LIMIT $5)",
                tenant, actor, before_ms, keep, limit,
            )
        return int(status.split()[-1])
