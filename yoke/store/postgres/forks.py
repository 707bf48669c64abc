"""PostgreSQL: forks of instances (``store/forks.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from ..forks import ForkRow, fork_from_row

if TYPE_CHECKING:
    from .connection import PgDb

COLUMNS = "tenant_id, fork_id, instance_id, actor, key, upto, app, edits::text, summary::text, created_at, expires_at"


class PgForks:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def save(self, fork: ForkRow) -> None:
        async with self._db.tx(fork.tenant) as conn:
            await conn.execute(
                "INSERT INTO actor_forks (tenant_id, fork_id, instance_id, actor, key, upto, app, edits, summary,"
                " created_at, expires_at, report, image)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,$8::json,$9::json,$10,$11,$12::json,$13)",
                fork.tenant, fork.fork_id, fork.instance_id, fork.actor, fork.key, fork.upto, fork.app,
                orjson.dumps(fork.edits).decode(), orjson.dumps(fork.summary).decode(), fork.created_at,
                fork.expires_at, orjson.dumps(fork.report).decode(), fork.image,
            )

    async def get(self, tenant: str, fork_id: str, *, now: int, whole: bool = False) -> ForkRow | None:
        columns = COLUMNS + (", report::text, image" if whole else "")
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {columns} FROM actor_forks WHERE tenant_id=$1 AND fork_id=$2 AND expires_at > $3",
                tenant, fork_id, now,
            )
        return None if row is None else fork_from_row(row, whole)

    async def list(
        self, tenant: str, instance_id: str | None, *, after: str | None, limit: int, now: int,
    ) -> list[ForkRow]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {COLUMNS} FROM actor_forks WHERE tenant_id=$1 AND ($2::text IS NULL OR instance_id=$2)"
                " AND fork_id > $3 AND expires_at > $4 ORDER BY fork_id LIMIT $5",
                tenant, instance_id, after or "", now, limit,
            )
        return [fork_from_row(r) for r in rows]

    async def delete(self, tenant: str, fork_id: str) -> bool:
        async with self._db.tx(tenant) as conn:
            status = await conn.execute("DELETE FROM actor_forks WHERE tenant_id=$1 AND fork_id=$2", tenant, fork_id)
        return status == "DELETE 1"

    async def expire(self, tenant: str, now: int, limit: int) -> int:
        async with self._db.tx(tenant) as conn:
            status = await conn.execute(
                "DELETE FROM actor_forks WHERE tenant_id=$1 AND fork_id IN (SELECT fork_id FROM actor_forks"
                " WHERE tenant_id=$1 AND expires_at <= $2 LIMIT $3)",
                tenant, now, limit,
            )
        return int(status.split()[-1])
