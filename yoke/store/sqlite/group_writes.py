"""The writes a SQLite group commit holds back to its end.

The writer thread runs the commits waiting together in one transaction
(``SqliteStore._commit_group``). Every statement hands the GIL back twice
(step, reset) and the event loop's thread is quick to take it, so the
writer waited for it after each one. Run without savepoints, a group's
commits need not write their event rows and stream heads one by one: they
are held back here and written together at the group's end (or before a
statement that must see them), in as few statements as their count allows.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...events import PreparedEvent

INSERT_COLUMNS = (
    "tenant_id", "sid", "seq", "id", "at", "type", "payload", "metadata", "source",
    "correlation", "priority", "group_id", "idempotency_key", "fingerprint", "size", "data",
)
# The columns most events leave NULL: a chunk whose rows all do says NULL in
# the statement instead of binding None, which the sqlite3 module adapts
# through a slow lookup (about a fifth of the writer's time in batch appends).
_NULLABLE = tuple(i for i, c in enumerate(INSERT_COLUMNS) if c in {
    "source", "correlation", "group_id", "idempotency_key", "fingerprint", "data"})
_nullable_of = operator.itemgetter(*_NULLABLE)
_ALL_NULL = {(None,) * len(_NULLABLE)}
_ALL_NULLABLE = frozenset(_NULLABLE)
# Rows go in as multi-row INSERTs of power-of-two sizes up to this many
# (1024 x 16 parameters, well under SQLite's 32766): one statement steps once,
# where executemany steps a row at a time (100 rows beside a spinning thread:
# 465 ms stepped, 30 ms this way).
INSERT_CHUNK = 1024
HEADS_CHUNK = 256


def event_row(tenant: str, sid: int, seq: int, e: PreparedEvent, at: int) -> tuple[Any, ...]:
    """The ``events`` row of ``e`` at ``seq``: INSERT_COLUMNS' values, in order."""
    return (
        tenant, sid, seq, e.id, at, e.type, e.payload_json, e.metadata_json, e.source_json,
        e.correlation, e.priority, e.group_id, e.idempotency_key, e.fingerprint, e.size, e.data,
    )


def _chunks(items: Sequence[Any], cap: int) -> Iterator[Sequence[Any]]:
    """``items`` in chunks of power-of-two sizes up to ``cap``: a few
    statement shapes, each prepared once by the statement cache."""
    start = 0
    while start < len(items):
        n = min(cap, 1 << ((len(items) - start).bit_length() - 1))
        yield items[start : start + n]
        start += n


# The columns most chunks hold one value in (one tenant, one event type,
# metadata "{}", priority 0): a chunk whose rows all agree binds each once,
# as a numbered parameter every row names, instead of once a row (binding
# is most of the writer's Python time: 0.6-0.9 us a row less this way).
_SHARED = tuple(i for i, c in enumerate(INSERT_COLUMNS) if c in {"tenant_id", "type", "metadata", "priority"})
_shared_of = operator.itemgetter(*_SHARED)
_ALL_SHARED = frozenset(_SHARED)


@functools.lru_cache(maxsize=256)  # chunk sizes x NULL patterns met, like the statement cache
def _insert_sql(n: int, nulls: frozenset[int], shared: frozenset[int]) -> tuple[str, Callable[[Any], Any]]:
    """The INSERT of ``n`` rows whose columns ``nulls`` are all NULL and
    whose columns ``shared`` hold one value each (bound first, in column
    order), and the getter of the other columns' values from a row."""
    once = {column: f"?{k}" for k, column in enumerate(sorted(shared), 1)}
    per_row = [i for i in range(len(INSERT_COLUMNS)) if i not in nulls and i not in shared]
    rows = []
    k = len(once) + 1
    for _ in range(n):
        cells = []
        for i in range(len(INSERT_COLUMNS)):
            if i in nulls:
                cells.append("NULL")
            elif i in once:
                cells.append(once[i])
            else:
                cells.append(f"?{k}")
                k += 1
        rows.append("(" + ",".join(cells) + ")")
    sql = f"INSERT INTO events ({', '.join(INSERT_COLUMNS)}) VALUES " + ",".join(rows)
    return sql, operator.itemgetter(*per_row)


def insert_events(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """Insert event rows (INSERT_COLUMNS' values, in order)."""
    for chunk in _chunks(rows, INSERT_CHUNK):
        n = len(chunk)
        if set(map(_nullable_of, chunk)) == _ALL_NULL:  # most chunks: one pass in C
            nulls = _ALL_NULLABLE
        else:
            nulls = frozenset(
                i for i, column in zip(_NULLABLE, zip(*map(_nullable_of, chunk))) if column.count(None) == n
            )
        shared_values = set(map(_shared_of, chunk))
        if len(shared_values) == 1:  # most chunks, again one pass in C
            shared, params = _ALL_SHARED, list(shared_values.pop())
        else:
            shared, params = frozenset(), []
        sql, values_of = _insert_sql(n, nulls, shared)
        params.extend(itertools.chain.from_iterable(map(values_of, chunk)))
        conn.execute(sql, params)


@functools.lru_cache(maxsize=16)
def _heads_sql(n: int) -> str:
    return (
        "UPDATE streams SET head=v.column3, durable_events=durable_events+v.column4,"
        " durable_bytes=durable_bytes+v.column5, unread_events=unread_events+v.column6,"
        " unread_bytes=unread_bytes+v.column7"
        f" FROM (VALUES {','.join(['(?,?,?,?,?,?,?)'] * n)}) AS v"
        " WHERE streams.tenant_id=v.column1 AND streams.sid=v.column2"
    )


class GroupWrites:
    """Event rows and stream advances held back by a group's commits."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        # (tenant, sid) -> [head, durable events, durable bytes, unread events,
        # unread bytes] added: several commits on one stream add up.
        self.heads: dict[tuple[str, int], list[int]] = {}

    def advance(self, tenant: str, sid: int, head: int, events: int, size: int, unread: bool) -> None:
        """The stream's head is now ``head``, with ``events`` durable events
        of ``size`` bytes more (unread too when it has consumers)."""
        added = self.heads.get((tenant, sid))
        if added is None:
            self.heads[(tenant, sid)] = [head, events, size, events * unread, size * unread]
        else:
            added[0] = head
            added[1] += events
            added[2] += size
            added[3] += events * unread
            added[4] += size * unread

    def write(self, conn: sqlite3.Connection) -> None:
        """Write what is held back, in the open transaction."""
        if self.heads:
            heads = [(tenant, sid, *added) for (tenant, sid), added in self.heads.items()]
            self.heads = {}
            for chunk in _chunks(heads, HEADS_CHUNK):
                conn.execute(_heads_sql(len(chunk)), list(itertools.chain.from_iterable(chunk)))
        if self.rows:
            rows, self.rows = self.rows, []
            insert_events(conn, rows)
