"""Consumers on PostgreSQL: named acknowledgement positions on a stream,
moved under the stream's row lock, with the stream's unread counters
(producer credit) kept exact."""

from __future__ import annotations

import asyncpg

from ... import errors
from ..faults import retry_reads
from ..results import ConsumerInfo
from ..rows import consumer_from_row
from ..rules import check_ack, unread_recount
from .connection import PgDb


class PgConsumers:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        async with self._db.tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if s is None:
                raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
            row = await conn.fetchrow(
                "SELECT acked, created_at FROM consumers WHERE tenant_id=$1 AND sid=$2 AND consumer_id=$3",
                tenant, s["sid"], consumer_id,
            )
            check_ack(consumer_id, offset, s["head"], None if row is None else row[0])
            created = row[1] if row is not None else now
            await conn.execute(
                "INSERT INTO consumers (tenant_id, sid, consumer_id, acked, created_at, updated_at)"
                " VALUES ($1,$2,$3,$4,$5,$6) ON CONFLICT (tenant_id, sid, consumer_id)"
                " DO UPDATE SET acked=excluded.acked, updated_at=excluded.updated_at",
                tenant, s["sid"], consumer_id, offset, created, now,
            )
            await self._recount_unread(conn, tenant, s)
            # Producers blocked on credit (in any process) should look again.
            await conn.execute("SELECT pg_notify('yoke_stream', $1)", f"{tenant}|{path}")
        return ConsumerInfo(consumer_id, offset, created, now)

    async def _recount_unread(self, conn: asyncpg.Connection, tenant: str, s: asyncpg.Record) -> None:
        """After consumers changed: move min_ack and keep the unread counters exact."""
        sid, old = s["sid"], s["min_ack"]
        new = await conn.fetchval(
            "SELECT min(acked) FROM consumers WHERE tenant_id=$1 AND sid=$2", tenant, sid
        )
        recount = unread_recount(old, new)
        if recount == "same":
            return
        if recount == "none":
            events = size = 0
        elif recount == "advance":
            n, b = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(size), 0) FROM events"
                " WHERE tenant_id=$1 AND sid=$2 AND seq > $3 AND seq <= $4",
                tenant, sid, old, new,
            )
            events, size = s["unread_events"] - n, s["unread_bytes"] - b
        else:
            events, size = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(size), 0) FROM events"
                " WHERE tenant_id=$1 AND sid=$2 AND seq > $3",
                tenant, sid, new,
            )
        await conn.execute(
            "UPDATE streams SET min_ack=$3, unread_events=$4, unread_bytes=$5"
            " WHERE tenant_id=$1 AND sid=$2",
            tenant, sid, new, events, size,
        )

    @retry_reads
    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT c.consumer_id, c.acked, c.created_at, c.updated_at FROM consumers c"
                " JOIN streams s ON s.tenant_id = c.tenant_id AND s.sid = c.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 ORDER BY c.consumer_id",
                tenant, path,
            )
        return [consumer_from_row(r) for r in rows]

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool:
        async with self._db.tx(tenant) as conn:
            s = await conn.fetchrow(
                "SELECT * FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if s is None:
                return False
            status = await conn.execute(
                "DELETE FROM consumers WHERE tenant_id=$1 AND sid=$2 AND consumer_id=$3",
                tenant, s["sid"], consumer_id,
            )
            deleted = status != "DELETE 0"
            if deleted:
                await self._recount_unread(conn, tenant, s)
        return deleted
