"""Storage: the contract (``contract.Store``) and its two backends."""

from __future__ import annotations

from collections.abc import Callable

from ..clock import SYSTEM, Clock
from ..config import Settings
from .contract import Store
from .results import CommitResult, Outcome, ReadPage, Retention, StreamInfo

# How a component reaches the store: called at each use, it answers the open
# store, or raises ``RuntimeClosed`` once the runtime closed (the closed gate
# stays exact however a component was built).
OpenStore = Callable[[], Store]


def connect_store(settings: Settings, clock: Clock = SYSTEM) -> Store:
    """The backend for ``settings.database_url`` (not started yet), stamping
    the times it takes itself by ``clock``."""
    url = settings.database_url
    if url.startswith("sqlite:///"):
        from .sqlite.store import SqliteStore

        return SqliteStore(url, migrate=settings.migrate, clock=clock)
    if url.startswith(("postgresql://", "postgres://")):
        from .postgres.store import PostgresStore

        return PostgresStore(
            url,
            role=settings.pg_role,
            role_password=settings.pg_role_password,
            runtime_dsn=settings.pg_runtime_url or None,
            pool_min=settings.pg_pool_min,
            pool_max=settings.pg_pool_max,
            migrate=settings.migrate,
            application_name=settings.pg_application_name,
            statement_timeout_s=settings.pg_statement_timeout_s,
            connect_timeout_s=settings.pg_connect_timeout_s,
            command_timeout_s=settings.pg_command_timeout_s,
            clock=clock,
        )
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


__all__ = ["CommitResult", "OpenStore", "Outcome", "ReadPage", "Retention", "Store", "StreamInfo", "connect_store"]
