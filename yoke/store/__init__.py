"""Storage: the contract (``contract.Store``) and its two backends."""

from __future__ import annotations

from ..config import Settings
from .contract import CommitResult, Outcome, ReadPage, Retention, Store, StreamInfo


def connect_store(settings: Settings) -> Store:
    """The backend for ``settings.database_url`` (not started yet)."""
    url = settings.database_url
    if url.startswith("sqlite:///"):
        from .sqlite.store import SqliteStore

        return SqliteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres.store import PostgresStore

        return PostgresStore(
            url,
            role=settings.pg_role,
            runtime_dsn=settings.pg_runtime_url or None,
            pool_min=settings.pg_pool_min,
            pool_max=settings.pg_pool_max,
        )
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


__all__ = ["CommitResult", "Outcome", "ReadPage", "Retention", "Store", "StreamInfo", "connect_store"]
