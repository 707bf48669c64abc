"""Large objects on PostgreSQL: intents, uploads (the bytes a column of
the object's row, deleted with it), aborts and cleanup."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from ... import errors
from ..faults import retry_reads
from ..results import ObjectInfo
from ..rows import OBJECT_COLUMNS, check_object_bytes, object_from_row
from .appends import PgAppends
from .connection import PgDb

# An object's row by stream path, with its stream's sid and closed flag.
OBJECT_SELECT = (
    f"SELECT {', '.join('o.' + c.strip() for c in OBJECT_COLUMNS.split(','))}, s.sid, s.closed"
    " FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
    " WHERE s.tenant_id=$1 AND s.path=$2 AND o.object_id=$3"
)


class PgObjects:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        async with self._db.tx(tenant) as conn:
            await self._appends.ensure_stream(conn, tenant, path, new_stream_id, now)
            sid, closed = await conn.fetchrow(
                "SELECT sid, closed FROM streams WHERE tenant_id=$1 AND path=$2", tenant, path
            )
            if closed:
                row = await conn.fetchrow(
                    f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=$1 AND sid=$2 AND idempotency_key=$3",
                    tenant, sid, key,
                )
                if row is None:  # a closed stream takes no new object; a retry finds its own
                    raise errors.StreamClosed(f"stream {path} is closed", path=path)
                return object_from_row(path, row)
            await conn.execute(
                "INSERT INTO objects (tenant_id, sid, object_id, idempotency_key, sha256, size,"
                " content_type, state, created_at, expires_at, schema_ref, auth_receipt)"
                " VALUES ($1,$2,$3,$4,$5,$6,$7,'prepared',$8,$9,$10,$11::json) ON CONFLICT DO NOTHING",
                tenant, sid, object_id, key, sha256, size, content_type, now, expires_at, schema,
                None if authorization is None else orjson.dumps(authorization).decode(),
            )
            row = await conn.fetchrow(
                f"SELECT {OBJECT_COLUMNS} FROM objects WHERE tenant_id=$1 AND sid=$2 AND idempotency_key=$3",
                tenant, sid, key,
            )
        return object_from_row(path, row)

    async def upload_object(self, tenant: str, path: str, object_id: str, data: bytes) -> ObjectInfo:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(OBJECT_SELECT + " FOR UPDATE OF o", tenant, path, object_id)
            if row is None:
                raise errors.ObjectNotFound(f"no object {object_id}", object_id=object_id)
            info = object_from_row(path, row)
            if row["closed"] and info.state != "committed":
                raise errors.StreamClosed(f"stream {path} is closed", path=path)
            if info.state in ("uploaded", "committed"):
                return info  # a retried upload of the same bytes
            if info.state != "prepared":
                raise errors.ObjectStateConflict(f"object {object_id} is {info.state}", state=info.state)
            check_object_bytes(info, data)
            await conn.execute(
                "UPDATE objects SET state='uploaded', data=$4 WHERE tenant_id=$1 AND sid=$2 AND object_id=$3",
                tenant, row["sid"], object_id, data,
            )
        return replace(info, state="uploaded")

    @retry_reads
    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(OBJECT_SELECT, tenant, path, object_id)
        return object_from_row(path, row) if row else None

    @retry_reads
    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        async with self._db.tx(tenant) as conn:
            return await conn.fetchval(
                "SELECT o.data FROM objects o JOIN streams s ON s.tenant_id = o.tenant_id AND s.sid = o.sid"
                " WHERE s.tenant_id=$1 AND s.path=$2 AND o.object_id=$3"
                " AND o.state = 'committed'",
                tenant, path, object_id,
            )

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        async with self._db.tx(tenant) as conn:
            row = await conn.fetchrow(OBJECT_SELECT + " FOR UPDATE OF o", tenant, path, object_id)
            if row is None:
                return None
            info = object_from_row(path, row)
            if info.state == "committed":
                raise errors.ObjectStateConflict(f"object {object_id} is committed", state="committed")
            await conn.execute(
                "UPDATE objects SET state='aborted', data=NULL WHERE tenant_id=$1 AND sid=$2 AND object_id=$3",
                tenant, row["sid"], object_id,
            )
        return replace(info, state="aborted")

    async def pending_deletions(self) -> int:
        return 0  # object bytes are a column of their row: they go with it

    async def cleanup_objects(self, now: int) -> int:
        removed = 0
        for tenant in await self._appends.tenants():
            async with self._db.tx(tenant) as conn:
                status = await conn.execute(
                    "DELETE FROM objects o USING streams s"
                    " WHERE o.tenant_id = $1 AND s.tenant_id = o.tenant_id AND s.sid = o.sid"
                    " AND NOT s.legal_hold AND o.state != 'committed'"
                    " AND (o.state = 'aborted' OR o.expires_at < $2)",
                    tenant, now,
                )
            removed += int(status.split()[-1])
        return removed
