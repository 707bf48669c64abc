"""Reads on SQLite, on the reader threads: pages of events after a cursor
(decoded, as stored, or as one JSON array of payloads), each with the
stream's row from the same snapshot."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import orjson

from ..faults import retry_reads
from ..results import PayloadPage, ReadPage
from ..rows import ONE_ROW_MAX_BYTES, EVENT_COLUMNS, event_from_row, stored_event_from_row
from . import event_blocks
from .connection import SqliteDb

T = TypeVar("T")

# What a read takes from the stream's row, in the read's snapshot.
READ_STREAM = (
    "SELECT sid, head, pruned_through, closed, stream_id, created_at FROM streams WHERE tenant_id=? AND path=?"
)
# read_stored takes these of EVENT_COLUMNS's positions (the rest: NULL).
STORED_COLUMNS = "seq, NULL, NULL, type, payload, NULL, NULL, NULL, NULL, NULL, NULL"
# Pages longer than this are read in one row (SqliteReads._read_range), when
# a byte cap keeps the row's text small (rows.ONE_ROW_MAX_BYTES).
STEPPED_ROWS = 32
# A page in one row: how many events the limit takes, and those the byte cap
# keeps (the first always; then while the running total of sizes stays
# within the cap) as one JSON array of [EVENT_COLUMNS (or STORED_COLUMNS)...,
# size, hex(data)]. The running total is taken over (row id, seq, size)
# alone, so rows past the cap are not read; the kept rows are then read by
# row id in the window's order (not sorted again: _page_in_one_row checks it).
NO_CAP = 2**62
PAGE_IN_ONE_ROW = """
WITH w AS (
    SELECT rid, sum(size) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS running,
           row_number() OVER (ORDER BY seq) AS rn
    FROM ({span} LIMIT :n)
), kept AS (SELECT rid FROM w WHERE rn = 1 OR running <= :cap)
SELECT (SELECT count(*) FROM w),
       (SELECT json_group_array(json_array({{columns}}, size, data))
        FROM (SELECT {{columns}}, size, CASE WHEN data IS NULL THEN NULL ELSE hex(data) END AS data
              FROM kept k JOIN event_rows e ON e.row_id = k.rid) e)
""".format(span=event_blocks.span("e.row_id AS rid, seq, size"))
# read_payloads: of the events the limit takes, how many, their total size,
# how many are of another type or carry bytes, their offsets, and their
# payload texts as one JSON array (bytes: no decoding in the sqlite3
# module). Before 3.44 SQLite does not promise group_concat's order (it
# keeps the subquery's in practice): the offsets say whether it did.
PAYLOAD_PAGE = (
    "SELECT count(*), coalesce(sum(size), 0), count(*) FILTER (WHERE type <> :type OR data IS NOT NULL),"
    " group_concat(seq), CAST('[' || coalesce(group_concat(payload, ','), '') || ']' AS BLOB)"
    f" FROM ({event_blocks.span('seq, size, type, payload, data')} LIMIT :n)"
)
EVENT_PAGE = PAGE_IN_ONE_ROW.format(columns=EVENT_COLUMNS.replace("seq,", "e.seq,", 1))
STORED_PAGE = PAGE_IN_ONE_ROW.format(columns=STORED_COLUMNS.replace("seq,", "e.seq,", 1))


class SqliteReads:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    @retry_reads
    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._db.read(self._read_range, tenant, path, after, limit, max_bytes, False)

    @retry_reads
    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._db.read(self._read_range, tenant, path, after, limit, max_bytes, True)

    @retry_reads
    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        return await self._db.read(self._read_payloads, tenant, path, after, limit, max_bytes, type)

    def _read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        def joined(conn: sqlite3.Connection, stream: tuple[Any, ...]) -> PayloadPage | None:
            sid, head, _, closed = stream[:4]
            count, size, others, seqs, body = conn.execute(
                PAYLOAD_PAGE, {"type": type, "t": tenant, "s": sid, "after": after, "n": limit}
            ).fetchone()
            if others or size > max_bytes:
                return None
            offsets = list(map(int, seqs.split(","))) if count else []
            if any(a >= b for a, b in zip(offsets, offsets[1:])):
                return None
            return PayloadPage(head, bool(closed), offsets[-1] if offsets else None, body)

        return self._in_snapshot(tenant, path, joined)

    @retry_reads
    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        def take(conn: sqlite3.Connection, sid: int, head: int) -> tuple[list[Any], list[int], bool]:
            return self._stepped(conn, tenant, path, sid, offset - 1, offset, None, None, event_from_row, EVENT_COLUMNS)

        return await self._db.read(self._read_snapshot, tenant, path, take)

    def _read_range(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None, stored: bool
    ) -> ReadPage:
        """Events after ``after`` (``read``, or ``read_stored``: StoredEvents).

        A page of more than STEPPED_ROWS is built by SQLite as one JSON
        array, in one row: the sqlite3 module lets go of the GIL around every
        row it steps, and a reader thread then waits for the event loop's
        thread to hand it back, row after row (with the loop busy, up to the
        interpreter's switch interval each: seconds for a page of 1,000
        rows). A short page (a tail near the head) is stepped: one row
        costs 0.03 ms that way and 0.18 ms as an aggregate; so is a page
        without a byte cap (ONE_ROW_MAX_BYTES)."""
        make = stored_event_from_row if stored else event_from_row
        columns = STORED_COLUMNS if stored else EVENT_COLUMNS

        def take(conn: sqlite3.Connection, sid: int, head: int) -> tuple[list[Any], list[int], bool]:
            long_page = min(limit, head - after) > STEPPED_ROWS
            if long_page and max_bytes is not None and max_bytes <= ONE_ROW_MAX_BYTES:
                taken = self._page_in_one_row(conn, tenant, path, sid, after, limit, max_bytes, stored)
                if taken is not None:
                    return taken
            return self._stepped(conn, tenant, path, sid, after, None, limit, max_bytes, make, columns)

        return self._read_snapshot(tenant, path, take)

    def _in_snapshot(
        self, tenant: str, path: str, fn: Callable[[sqlite3.Connection, tuple[Any, ...]], T]
    ) -> T | None:
        """``fn(conn, stream)`` in one read transaction, ``stream`` the
        stream's READ_STREAM row; None when there is no stream at the path."""
        conn = self._db.reader()
        conn.execute("BEGIN")
        try:
            row = conn.execute(READ_STREAM, (tenant, path)).fetchone()
            return None if row is None else fn(conn, row)
        finally:
            conn.execute("COMMIT")

    def _read_snapshot(
        self, tenant: str, path: str,
        take: Callable[[sqlite3.Connection, int, int], tuple[list[Any], list[int], bool]],
    ) -> ReadPage:
        """The stream row and the events ``take(conn, sid, head)`` reads, in one read transaction."""

        def page(conn: sqlite3.Connection, stream: tuple[Any, ...]) -> ReadPage:
            sid, head, pruned_through, closed, stream_id, created_at = stream
            events, sizes, capped = take(conn, sid, head)
            return ReadPage(
                exists=True, head=head, pruned_through=pruned_through, events=events, closed=bool(closed),
                sizes=sizes, capped=capped, stream_id=stream_id, created_at=created_at,
            )

        found = self._in_snapshot(tenant, path, page)
        return found if found is not None else ReadPage(exists=False, head=0, pruned_through=0, events=[])

    @staticmethod
    def _page_in_one_row(
        conn: sqlite3.Connection, tenant: str, path: str, sid: int, after: int, limit: int,
        max_bytes: int | None, stored: bool,
    ) -> tuple[list[Any], list[int], bool] | None:
        counted, kept = conn.execute(
            STORED_PAGE if stored else EVENT_PAGE,
            {"t": tenant, "s": sid, "after": after, "n": limit, "cap": NO_CAP if max_bytes is None else max_bytes},
        ).fetchone()
        items = orjson.loads(kept) if kept else []
        if any(a[0] >= b[0] for a, b in zip(items, items[1:])):
            # SQLite (before 3.44) does not promise the aggregate's order; it
            # keeps the subquery's in practice. Were it not to: step the rows.
            return None
        make = stored_event_from_row if stored else event_from_row
        events = [make(tenant, path, i, None if i[12] is None else bytes.fromhex(i[12])) for i in items]
        return events, [i[11] for i in items], len(items) < counted

    @staticmethod
    def _stepped(
        conn: sqlite3.Connection, tenant: str, path: str, sid: int, after: int, hi: int | None, limit: int | None,
        max_bytes: int | None, make: Callable[..., Any], columns: str,
    ) -> tuple[list[Any], list[int], bool]:
        """The rows after offset ``after`` (through ``hi``), at most ``limit``,
        one at a time: past the byte cap, none is fetched but the first."""
        events: list[Any] = []
        sizes: list[int] = []
        total = 0
        capped = False
        sql = event_blocks.span(f"{columns}, size, data", bounded=hi is not None)
        rows = conn.execute(
            sql if limit is None else sql + " LIMIT :n", {"t": tenant, "s": sid, "after": after, "hi": hi, "n": limit}
        )
        try:
            for r in rows:
                size = r[11]
                if max_bytes is not None and events and total + size > max_bytes:
                    capped = True
                    break
                total += size
                events.append(make(tenant, path, r, r[12]))
                sizes.append(size)
        finally:
            rows.close()
        return events, sizes, capped
