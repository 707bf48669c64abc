"""The SQL catalogue: every actor instance's tables and Yoke's own records,
read by one query (docs/advanced/sql.md).

Each instance keeps its tables in a SQLite database of its own; the
catalogue keeps a mirror of them in the main database, maintained after
each run (``actors/sql_mirror.py``), so that one read-only query sees all
instances at once. This module holds what both drivers share: the values
a mirror write carries, the contract, and the rules that pick a column's
type from the types the instances declared.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import errors

if TYPE_CHECKING:
    from .catalogue_query import Plan

# Yoke's own records, as ``yoke.<name>``; each driver defines their columns.
YOKE_SCHEMA = "yoke"
# An instance's ctx.state document, as ``<actor>.yoke_state``.
STATE_RELATION = "yoke_state"
# The columns every actor table gets in front of its own.
INSTANCE_COLUMNS = ("instance_id", "key")


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    declared: str  # the type as the instance's CREATE TABLE wrote it ('' for none)


@dataclass(slots=True)
class TableRows:
    """One table's rows of one instance that a mirror write changes: by the
    SQLite row id, their values in ``columns`` order; ``whole``: these are
    all its rows (any other the mirror holds goes)."""

    columns: tuple[str, ...]
    upserts: dict[int, tuple[Any, ...]] = field(default_factory=dict)
    deletes: set[int] = field(default_factory=set)
    whole: bool = False


@dataclass(slots=True)
class InstanceRows:
    """What one mirror write brings for one instance. ``version`` counts the
    instance's changes (kept in its own database, moved by the same
    transactions as the rows), so a write never replaces a newer one.
    ``shapes``: the instance's tables and their declared columns, when
    they changed (None: as recorded). ``whole``: every table of the
    instance is resent (a first sync, or a repair)."""

    instance_id: str
    version: int
    tables: dict[str, TableRows] = field(default_factory=dict)
    shapes: dict[str, tuple[Column, ...]] | None = None
    whole: bool = False

    def merge(self, later: InstanceRows) -> InstanceRows:
        """This write followed by ``later`` as one (writes that could not be
        sent yet pile up): the later rows win."""
        if later.whole:
            return later
        merged = InstanceRows(self.instance_id, later.version, dict(self.tables), self.shapes, self.whole)
        if later.shapes is not None:
            merged.shapes = later.shapes
        for name, rows in later.tables.items():
            before = merged.tables.get(name)
            if before is None or rows.whole or before.columns != rows.columns:
                merged.tables[name] = rows  # (a shape change resends a table whole)
                continue
            upserts = {**before.upserts, **rows.upserts}
            deletes = (before.deletes - set(rows.upserts)) | rows.deletes
            for rid in rows.deletes:
                upserts.pop(rid, None)
            merged.tables[name] = TableRows(rows.columns, upserts, deletes, before.whole)
        if merged.shapes is not None:  # tables dropped meanwhile send nothing more
            merged.tables = {n: r for n, r in merged.tables.items() if n in merged.shapes}
        return merged


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    truncated: bool  # more rows than max_rows


# A bounded query's progress handler checks its deadline every this many
# SQLite VM steps (a step may be one costly function call: keep it small).
PROGRESS_STEPS = 1_000
# What one query may answer at most, in bytes of its values (about).
MAX_RESULT_BYTES = 64 * 1024 * 1024
FETCH_ROWS = 100  # rows fetched at a time, so the bytes are counted as they come


class ResultTooLarge(errors.InvalidInput):
    """The rows so far passed MAX_RESULT_BYTES."""

    code = "sql_result_too_large"


class Rows:
    """The rows a query answers, fetched in chunks: up to ``max_rows`` (and
    whether there were more), ``ResultTooLarge`` past MAX_RESULT_BYTES."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self.rows: list[list[Any]] = []
        self._bytes = 0

    def wanted(self) -> int:
        """How many to fetch next (0: enough)."""
        return max(min(FETCH_ROWS, self.max_rows + 1 - len(self.rows)), 0)

    def add(self, chunk: Sequence[Sequence[Any]]) -> bool:
        """Take a fetched chunk; whether to fetch on."""
        for row in chunk:
            self._bytes += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
            self.rows.append(list(row))
        if self._bytes > MAX_RESULT_BYTES:
            raise ResultTooLarge(
                f"the rows passed {MAX_RESULT_BYTES // 1024 // 1024} MiB: ask for fewer rows or columns", field="query"
            )
        return bool(chunk) and self.wanted() > 0

    def result(self, columns: list[str]) -> QueryResult:
        return QueryResult(columns, self.rows[: self.max_rows], len(self.rows) > self.max_rows)


def bounded_sqlite_query(
    conn: sqlite3.Connection, sql: str, params: Any, authorizer: Callable[..., int], *,
    max_rows: int, timeout_s: float,
) -> QueryResult:
    """One statement on a SQLite connection (an instance's database, or the
    catalogue's) under ``authorizer``, at most ``max_rows`` rows,
    MAX_RESULT_BYTES and ``timeout_s`` seconds: past it SQLite raises
    "interrupted". The real clock, not the runtime's: it bounds real work
    on this thread."""
    deadline = time.monotonic() + timeout_s
    conn.set_authorizer(authorizer)
    conn.set_progress_handler(lambda: time.monotonic() > deadline, PROGRESS_STEPS)
    try:
        cur = conn.execute(sql, params)
        try:
            rows = Rows(max_rows)
            while rows.add(cur.fetchmany(rows.wanted())):
                pass
            columns = [d[0] for d in cur.description or ()]
        finally:
            cur.close()
    finally:
        conn.set_authorizer(None)
        conn.set_progress_handler(None, 0)
    return rows.result(columns)


@dataclass(frozen=True, slots=True)
class CatalogueTable:
    """One table a query can name: ``schema.name`` with its columns."""

    schema: str
    name: str
    columns: tuple[Column, ...]


class CatalogueStore(Protocol):
    dialect: str  # the SQL a query is written in: 'sqlite' or 'postgres'

    async def mirror(self, tenant: str, changes: Sequence[InstanceRows]) -> set[str]:
        """Apply the instances' changes in one transaction. Each applies
        only if newer than what the mirror holds (by ``version``, whole or
        not) and while the instance exists. Returns the instances that need a whole resend (the mirror
        holds nothing of them yet, and this was not one)."""

    async def mirrored(self, tenant: str, instance_ids: Sequence[str]) -> dict[str, int]:
        """The version the mirror holds per instance (missing: none)."""

    async def tables(self, tenant: str) -> list[CatalogueTable]:
        """What a query can name in ``tenant``: each actor's tables (with
        ``yoke_state``) and Yoke's records."""

    async def query(
        self, tenant: str, plan: Plan, params: Sequence[Any], *, max_rows: int, timeout_s: float,
        failures: list[dict[str, Any]] | None = None,
    ) -> QueryResult:
        """One read-only query over the catalogue, checked already
        (``catalogue_query.plan`` in this store's ``dialect``): at most
        ``max_rows`` rows, ``MAX_RESULT_BYTES`` and ``timeout_s`` seconds.
        ``failures``: the rows of ``yoke.failures`` (the inbox is above the
        store), given when the query reads it."""


# --- column types ---------------------------------------------------------


def affinity(declared: str) -> str:
    """SQLite's type affinity of a declared type (sqlite.org/datatype3.html,
    3.1): INTEGER, TEXT, BLOB, REAL or NUMERIC."""
    t = declared.upper()
    if "INT" in t:
        return "INTEGER"
    if "CHAR" in t or "CLOB" in t or "TEXT" in t:
        return "TEXT"
    if not t or "BLOB" in t:
        return "BLOB"
    if "REAL" in t or "FLOA" in t or "DOUB" in t:
        return "REAL"
    return "NUMERIC"


def column_affinity(declared: Sequence[str]) -> str | None:
    """One affinity for a column of many instances: theirs when all agree,
    None when they differ (then the column reads as text on PostgreSQL)."""
    found = {affinity(d) for d in declared}
    return found.pop() if len(found) == 1 else None


@dataclass(frozen=True, slots=True)
class ColumnUnion:
    """A column of an actor's table across its instances: its name (as the
    first instance to declare it spelled it; SQLite's names ignore case),
    where it first appears, and every type declared for it."""

    name: str
    position: int
    declared: tuple[str, ...]

    @property
    def visible(self) -> str:
        """Its name in a query: an instance column named like one of the
        columns every table gets (instance_id, key) takes a trailing ``_``."""
        return self.name + "_" if self.name.lower() in INSTANCE_COLUMNS else self.name


def union_columns(rows: Sequence[tuple[str, str, str, str, int]]) -> dict[tuple[str, str], tuple[ColumnUnion, ...]]:
    """The catalogue's tables from its (actor, table, column, declared type,
    position) rows, one per instance declaration: each table's columns in
    order of first appearance, then by name."""
    found: dict[tuple[str, str], dict[str, tuple[str, int, set[str]]]] = {}
    for actor, table, column, declared, position in rows:
        columns = found.setdefault((actor, table), {})
        name, first, types = columns.get(column.lower(), (column, position, set()))
        if position < first:
            name, first = column, position
        types.add(declared)
        columns[column.lower()] = (name, first, types)
    return {
        t: tuple(sorted((ColumnUnion(n, p, tuple(sorted(d))) for n, p, d in cs.values()),
                        key=lambda c: (c.position, c.name)))
        for t, cs in sorted(found.items())
    }


def catalogue_tables(tables: dict[tuple[str, str], tuple[ColumnUnion, ...]]) -> list[CatalogueTable]:
    """What a tenant's queries can name, actors' tables first, as listed
    to users (a column's declared types joined by '/' where they differ)."""
    from .catalogue_query import YOKE_RELATIONS

    out = [
        CatalogueTable(actor, table, (
            Column("instance_id", "TEXT"), Column("key", "TEXT"),
            *(Column(c.visible, "/".join(d for d in c.declared if d)) for c in cols),
        ))
        for (actor, table), cols in tables.items()
    ]
    return out + [CatalogueTable(YOKE_SCHEMA, name, ()) for name in YOKE_RELATIONS]
