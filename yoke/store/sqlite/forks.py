"""SQLite: forks of instances (``store/forks.py``)."""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING, Any

import orjson

from ..forks import ForkRow, fork_from_row

if TYPE_CHECKING:
    from .connection import SqliteDb

COLUMNS = "tenant_id, fork_id, instance_id, actor, key, upto, app, edits, summary, created_at, expires_at"


class SqliteForks:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def save(self, fork: ForkRow) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                conn.execute(
                    f"INSERT INTO actor_forks ({COLUMNS}, report, image) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (fork.tenant, fork.fork_id, fork.instance_id, fork.actor, fork.key, fork.upto, fork.app,
                     orjson.dumps(fork.edits).decode(), orjson.dumps(fork.summary).decode(), fork.created_at,
                     fork.expires_at, orjson.dumps(fork.report).decode(), fork.image),
                )

        await self._db.write(run)

    async def get(self, tenant: str, fork_id: str, *, now: int, whole: bool = False) -> ForkRow | None:
        columns = COLUMNS + (", report, image" if whole else "")

        def read() -> Any:
            return self._db.reader().execute(
                f"SELECT {columns} FROM actor_forks WHERE tenant_id=? AND fork_id=? AND expires_at > ?",
                (tenant, fork_id, now),
            ).fetchone()

        row = await self._db.read(read)
        return None if row is None else fork_from_row(row, whole)

    async def list(
        self, tenant: str, instance_id: str | None, *, after: str | None, limit: int, now: int,
    ) -> list[ForkRow]:
        def read() -> list[sqlite3.Row]:
            return self._db.reader().execute(
                f"SELECT {COLUMNS} FROM actor_forks WHERE tenant_id=? AND (? IS NULL OR instance_id=?)"
                " AND fork_id > ? AND expires_at > ? ORDER BY fork_id LIMIT ?",
                (tenant, instance_id, instance_id, after or "", now, limit),
            ).fetchall()

        return [fork_from_row(r) for r in await self._db.read(read)]

    async def delete(self, tenant: str, fork_id: str) -> bool:
        def run() -> bool:
            with self._db.transaction() as conn:
                return conn.execute(
                    "DELETE FROM actor_forks WHERE tenant_id=? AND fork_id=?", (tenant, fork_id)
                ).rowcount == 1

        return await self._db.write(run)

    async def expire(self, tenant: str, now: int, limit: int) -> int:
        def run() -> int:
            with self._db.transaction() as conn:
                return conn.execute(
                    "DELETE FROM actor_forks WHERE tenant_id=? AND fork_id IN (SELECT fork_id FROM actor_forks"
                    " WHERE tenant_id=? AND expires_at <= ? LIMIT ?)",
                    (tenant, tenant, now, limit),
                ).rowcount

        return await self._db.write(run)
