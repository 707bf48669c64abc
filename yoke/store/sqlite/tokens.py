"""API tokens on SQLite."""

from __future__ import annotations

from ..faults import retry_reads
from ..results import TokenInfo
from ..rows import TOKEN_COLUMNS, token_from_row
from .connection import SqliteDb


class SqliteTokens:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    async def create_token(self, token: TokenInfo) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                conn.execute(
                    f"INSERT INTO tokens ({TOKEN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?)",
                    (
                        token.token_id, token.tenant, token.name, ",".join(token.scopes),
                        token.secret_hash, token.created_at, token.revoked_at, token.expires_at,
                    ),
                )

        await self._db.write(run)

    @retry_reads
    async def find_token(self, token_id: str) -> TokenInfo | None:
        def run() -> TokenInfo | None:
            row = self._db.reader().execute(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE token_id=?", (token_id,)
            ).fetchone()
            return token_from_row(row) if row else None

        return await self._db.read(run)

    @retry_reads
    async def list_tokens(self, tenant: str) -> list[TokenInfo]:
        def run() -> list[TokenInfo]:
            rows = self._db.reader().execute(
                f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE tenant_id=? ORDER BY created_at, token_id",
                (tenant,),
            ).fetchall()
            return [token_from_row(r) for r in rows]

        return await self._db.read(run)

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool:
        def run() -> bool:
            with self._db.transaction() as conn:
                cur = conn.execute(
                    "UPDATE tokens SET revoked_at=? WHERE tenant_id=? AND token_id=? AND revoked_at IS NULL",
                    (now, tenant, token_id),
                )
                return cur.rowcount > 0

        return await self._db.write(run)
