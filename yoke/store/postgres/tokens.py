"""API tokens on PostgreSQL."""

from __future__ import annotations

from ..faults import retry_reads
from ..results import TokenInfo
from ..rows import TOKEN_COLUMNS, token_from_row
from .connection import PgDb


class PgTokens:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    async def create_token(self, token: TokenInfo) -> None:
        async with self._db.tx(token.tenant) as conn:
            await conn.execute(
                f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES ($1,$2,$3,$4,$5,$6,$7,$8)",
                token.token_id, token.tenant, token.name, list(token.scopes), token.secret_hash,
                token.created_at, token.revoked_at, token.expires_at,
            )

    @retry_reads
    async def find_token(self, token_id: str) -> TokenInfo | None:
        # The one read across tenants: a SECURITY DEFINER function returning
        # the row of this id (migrations 0006, 0026); the table's policy is tenant-bound.
        row = await self._db.fetchrow("SELECT * FROM yoke_find_token($1)", token_id)
        return token_from_row(row) if row else None

    @retry_reads
    async def list_tokens(self, tenant: str) -> list[TokenInfo]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id=$1 ORDER BY created_at, token_id",
                tenant,
            )
        return [token_from_row(r) for r in rows]

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool:
        async with self._db.tx(tenant) as conn:
            status = await conn.execute(
                "UPDATE tokens SET revoked_at=$3 WHERE tenant_id=$1 AND token_id=$2 AND revoked_at IS NULL",
                tenant, token_id, now,
            )
        return status != "UPDATE 0"
