"""``y.sql(tenant, query)``: one read-only SQL query over every actor
instance's tables, their ``ctx.state`` and Yoke's own records
(docs/advanced/sql.md).

The store answers it (``store/catalogue.py``: the mirror the runtime keeps
of instance tables, and each driver's views of its own tables); this adds
the limits and what only the layers above the store know (the failures
inbox, for ``yoke.failures``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import errors
from .events import validate_tenant
from .failures.model import Selection
from .store.catalogue import CatalogueTable, QueryResult
from .store.catalogue_query import plan

if TYPE_CHECKING:
    from .failures.inbox import Failures
    from .store import OpenStore

MAX_ROWS = 100_000  # a query's row limit may be set up to this
MAX_TIMEOUT_S = 300.0
FAILURES_SEEN = 10_000  # yoke.failures: the oldest open failures, at most this many


class SqlCatalogue:
    def __init__(
        self, store: OpenStore, failures: Callable[[str], Failures], *, max_rows: int, timeout_s: float
    ) -> None:
        self._store = store
        self._failures = failures
        self.max_rows = max_rows
        self.timeout_s = timeout_s

    async def query(
        self, tenant: str, query: str, params: Sequence[Any] | None = None, *,
        max_rows: int | None = None, timeout_s: float | None = None,
    ) -> QueryResult:
        """Run ``query`` in ``tenant``: at most ``max_rows`` rows (the
        setting ``sql_max_rows`` when None; a result cut short says
        ``truncated``) and ``timeout_s`` seconds (``sql_timeout_s``)."""
        validate_tenant(tenant)
        rows = self.max_rows if max_rows is None else max_rows
        if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= MAX_ROWS:
            raise errors.InvalidInput(f"max_rows must be 1-{MAX_ROWS}", field="max_rows")
        seconds = self.timeout_s if timeout_s is None else timeout_s
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not 0 < seconds <= MAX_TIMEOUT_S:
            raise errors.InvalidInput(f"timeout_s must be more than 0 and at most {MAX_TIMEOUT_S:g}", field="timeout_s")
        values = [] if params is None else params
        if not isinstance(values, (list, tuple)):
            raise errors.InvalidInput("params must be a list", field="params")
        for value in values:
            if not (value is None or isinstance(value, (str, int, float, bytes))):
                raise errors.InvalidInput("params must be strings, numbers or null", field="params")
        # Checked once, off the event loop (parsing grows with the text).
        checked = await asyncio.to_thread(plan, query, self._store().catalogue.dialect)
        failures = None
        if ("yoke", "failures") in checked.relations:
            found = await self._failures(tenant).select(Selection(), FAILURES_SEEN)
            failures = [f.to_dict() for f in found]
        return await self._store().catalogue.query(
            tenant, checked, list(values), max_rows=rows, timeout_s=float(seconds), failures=failures
        )

    async def tables(self, tenant: str) -> list[CatalogueTable]:
        """What a query in ``tenant`` can name, with the columns of actor tables."""
        validate_tenant(tenant)
        return await self._store().catalogue.tables(tenant)
