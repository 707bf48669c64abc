"""SQLite: an instance's kept inputs (``store/inputs.py``).

``record`` runs in the actor store's completing transactions, before the
queue row it copies is deleted or buried; ``SqliteInputs`` lists and
prunes them."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..inputs import INPUT_COLUMNS, Completion, InputPage, input_from_row

if TYPE_CHECKING:
    from .connection import SqliteDb

# One finished queue row kept as its instance's next input (if it is still
# the claim that ran: processing, at these attempts).
RECORD = (
    "INSERT INTO actor_inputs (tenant_id, instance_id, seq, qid, path, stream_seq, event, attempts, outcome,"
    " enqueued_at, started_at, processed_at, code_version, tape, last_error)"
    " SELECT q.tenant_id, q.instance_id,"
    "  coalesce((SELECT max(a.seq) FROM actor_inputs a"
    "            WHERE a.tenant_id = q.tenant_id AND a.instance_id = q.instance_id), 0) + 1,"
    "  q.qid, q.path, q.seq, q.event, q.attempts, ?, q.enqueued_at, q.started_at, ?, ?, ?, ?"
    " FROM actor_queue q WHERE q.tenant_id=? AND q.qid=? AND q.attempts=? AND q.status='processing'"
)


def record(
    conn: sqlite3.Connection, tenant: str, done: Sequence[Completion], now: int,
    outcome: str = "done", error: str | None = None,
) -> None:
    conn.executemany(
        RECORD,
        [(outcome, c.processed_at or now, c.code_version, c.tape, error, tenant, c.qid, c.attempts)
         for c in done if c.keep],
    )


class SqliteInputs:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def inputs(
        self, tenant: str, instance_id: str, *, after: int = 0, upto: int | None = None, limit: int = 100,
    ) -> InputPage:
        def read() -> list[sqlite3.Row]:
            return self._db.reader().execute(
                f"SELECT {INPUT_COLUMNS} FROM actor_inputs WHERE tenant_id=? AND instance_id=? AND seq > ?"
                " AND (? IS NULL OR seq <= ?) ORDER BY seq, input_id LIMIT ?",
                (tenant, instance_id, after, upto, upto, limit + 1),
            ).fetchall()

        rows = [input_from_row(r) for r in await self._db.read(read)]
        more = len(rows) > limit
        rows = rows[:limit]
        return InputPage(rows, rows[-1].seq if more else None)

    async def prune(
        self, tenant: str, actor: str, *, keep: int | None, before_ms: int | None, limit: int,
    ) -> int:
        def run() -> int:
            with self._db.transaction() as conn:
                return conn.execute(
                    "DELETE FROM actor_inputs WHERE input_id IN ("
                    " SELECT a.input_id FROM actor_inputs a JOIN actor_instances i"
                    "  ON i.tenant_id = a.tenant_id AND i.instance_id = a.instance_id"
                    " WHERE a.tenant_id=? AND i.actor=?"
                    "  AND ((? IS NOT NULL AND a.processed_at < ? AND a.seq < (SELECT max(b.seq) FROM actor_inputs b"
                    "        WHERE b.tenant_id = a.tenant_id AND b.instance_id = a.instance_id))"
                    "   OR (? IS NOT NULL AND a.seq <= (SELECT max(b.seq) FROM actor_inputs b"
                    "        WHERE b.tenant_id = a.tenant_id AND b.instance_id = a.instance_id) - ?))"
                    " LIMIT ?)",
                    (tenant, actor, before_ms, before_ms, keep, keep, limit),
                ).rowcount

        return await self._db.write(run)

    async def complete(self, tenant: str, instance_id: str) -> bool:
        def read() -> Any:
            return self._db.reader().execute(
                "SELECT inputs_incomplete FROM actor_instances WHERE tenant_id=? AND instance_id=?",
                (tenant, instance_id),
            ).fetchone()

        row = await self._db.read(read)
        return row is not None and not row[0]

    async def mark_incomplete(self, tenant: str, actor: str) -> int:
        def run() -> int:
            with self._db.transaction() as conn:
                return conn.execute(
                    "UPDATE actor_instances SET inputs_incomplete = 1 WHERE tenant_id=? AND actor=?"
                    " AND inputs_incomplete = 0", (tenant, actor),
                ).rowcount

        return await self._db.write(run)
