"""Reads on PostgreSQL: one round trip each into yoke_read, yoke_read_stored
or yoke_read_payloads (functions/), the stream's row read with the page."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from ...events import Event
from ..faults import retry_reads
from ..results import PayloadPage, ReadPage, StoredEvent
from ..rows import ONE_ROW_MAX_BYTES, event_from_row, stored_event_from_row
from .connection import PgDb

MAX_OFFSET = 2**63 - 1


class PgReads:
    def __init__(self, db: PgDb) -> None:
        self._db = db

    @retry_reads
    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._read(tenant, path, after, MAX_OFFSET, limit, max_bytes)

    @retry_reads
    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        if max_bytes is None or max_bytes > ONE_ROW_MAX_BYTES:
            return await self._read(tenant, path, after, MAX_OFFSET, limit, max_bytes, stored_event_from_row)
        # The page in one row (migration 0021): a record of eighteen
        # columns per event was most of a catch-up read's CPU.
        row = await self._db.fetchrow(
            "SELECT * FROM yoke_read_stored($1, $2, $3, $4, $5)", tenant, path, after, limit, max_bytes
        )
        if row is None:
            return ReadPage(exists=False, head=0, pruned_through=0, events=[])
        head, pruned_through, closed, stream_id, created_at, counted, page = row
        items = orjson.loads(page) if page else []
        return ReadPage(
            exists=True, head=head, pruned_through=pruned_through, closed=closed,
            events=[StoredEvent(i[0], i[1], i[2], None if i[4] is None else bytes.fromhex(i[4])) for i in items],
            sizes=[i[3] for i in items], capped=len(items) < counted, stream_id=stream_id, created_at=created_at,
        )

    @retry_reads
    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        row = await self._db.fetchrow(
            "SELECT * FROM yoke_read_payloads($1, $2, $3, $4, $5)", tenant, path, after, limit, type
        )
        if row is None:
            return None
        head, closed, _, total, others, last, body = row
        if others or total > max_bytes:
            return None
        return PayloadPage(head, closed, last, body)

    @retry_reads
    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        return await self._read(tenant, path, offset - 1, offset, 1, None)

    async def _read(
        self, tenant: str, path: str, after: int, upto: int, limit: int, max_bytes: int | None,
        make: Callable[..., Any] = event_from_row,
    ) -> ReadPage:
        rows = await self._db.fetch(
            "SELECT * FROM yoke_read($1, $2, $3, $4, $5, $6)", tenant, path, after, upto, limit, max_bytes
        )
        if not rows:
            return ReadPage(exists=False, head=0, pruned_through=0, events=[])
        head, pruned_through, closed = rows[0][0], rows[0][1], rows[0][2]
        stream_id, created_at = rows[0][15], rows[0][16]
        events: list[Event] = []
        sizes: list[int] = []
        total = 0
        capped = False
        for r in rows:
            if r[3] is None:  # the stream, without events
                continue
            size = r[14]
            if max_bytes is not None and events and total + size > max_bytes:
                capped = True  # yoke_read's one row past the cap
                break
            total += size
            events.append(make(tenant, path, r[3:14], r[17]))
            sizes.append(size)
        return ReadPage(
            exists=True, head=head, pruned_through=pruned_through, events=events, closed=closed,
            sizes=sizes, capped=capped, stream_id=stream_id, created_at=created_at,
        )
