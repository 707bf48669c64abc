"""SQLite implementation of the SQL catalogue (``store/catalogue.py``).

The mirror keeps one table of rows per actor table, shared by the
tenants (``sql_row_tables`` names it): a row is the instance's row with
its tenant, instance, key and SQLite row id, its values in columns named
``u:<column>`` added as instances declare them, stored as the instance
stored them. ``sql_columns`` records which instance declared which
column, so a tenant's query shows the columns of its own instances.

A query runs on a read-only connection of its own per reader thread. Each
table it names becomes a temporary view over the mirror (or Yoke's
tables) for the tenant alone, and an authorizer lets the query read
nothing but those views: whatever the query's text, no other tenant's
rows and no other table can be reached.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ... import errors
from ..catalogue import (
    YOKE_SCHEMA,
    ColumnUnion,
    InstanceRows,
    QueryResult,
    bounded_sqlite_query,
    catalogue_tables,
    union_columns,
)
from ..catalogue_query import _REFUSED_FUNCTIONS, _REFUSED_PREFIXES, Plan, SqlRefused

if TYPE_CHECKING:
    from .connection import SqliteDb

# Yoke's records, each for one tenant (?T: the tenant, as a literal).
QUERY_THREADS = 2  # catalogue queries at once (more wait)
MAX_VALUE_BYTES = 16 * 1024 * 1024  # the longest string or blob a query may make

YOKE_VIEWS: dict[str, str] = {
    "instances": (
        "SELECT instance_id, actor, key, config, filter, parent_id, worker_id, created_at"
        " FROM main.actor_instances WHERE tenant_id = ?T"
    ),
    "streams": (
        "SELECT path, stream_id, created_at, head, pruned_through, closed, legal_hold, durable_events,"
        " durable_bytes, unread_events, unread_bytes, min_ack, metadata"
        " FROM main.streams WHERE tenant_id = ?T"
    ),
    "queue": (
        "SELECT qid, instance_id, group_key, status, attempts, path, seq AS \"offset\", priority, available_at,"
        " lease_until, worker_id, enqueued_at, started_at, last_error,"
        # (a stream that pins its data handling keeps its events to its own surface)
        " CASE WHEN EXISTS (SELECT 1 FROM main.streams p WHERE p.tenant_id = q.tenant_id AND p.path = q.path"
        " AND p.data_handling IS NOT NULL) THEN NULL ELSE event END AS event"
        " FROM main.actor_queue q WHERE tenant_id = ?T"
    ),
    "schedules": (
        "SELECT instance_id, name, due_at, cron, stream, event, created_at"
        " FROM main.actor_schedules WHERE tenant_id = ?T"
    ),
    "subscriptions": (
        "SELECT s.path, s.name, json_extract(s.config, '$.kind') AS kind,"
        " CASE WHEN s.halted IS NOT NULL THEN 'halted' ELSE 'active' END AS state,"
        " s.processed_through_offset AS cursor, max(coalesce(st.head, 0) - s.processed_through_offset, 0) AS lag,"
        " s.attempts, s.last_error, s.next_retry_at, s.delivered, s.failures, s.halted, s.config"
        " FROM main.subscriptions s LEFT JOIN main.streams st ON st.tenant_id = s.tenant_id AND st.path = s.path"
        " WHERE s.tenant_id = ?T"
    ),
    "events": (
        "SELECT s.path, r.seq AS \"offset\", r.id, r.at, r.type, r.payload, r.metadata, r.source, r.correlation,"
        " r.priority, r.group_id, r.idempotency_key, r.size"
        " FROM main.streams s JOIN main.event_blocks b ON b.tenant_id = s.tenant_id AND b.sid = s.sid"
        " JOIN main.event_rows r ON r.row_id BETWEEN b.first_rowid AND b.first_rowid + b.last_seq - b.first_seq"
        " WHERE s.tenant_id = ?T AND s.data_handling IS NULL"
    ),
}
YOKE_TABLES = {
    "instances": ("actor_instances",), "streams": ("streams",), "queue": ("actor_queue", "streams"),
    "schedules": ("actor_schedules",), "subscriptions": ("subscriptions", "streams"),
    "events": ("streams", "event_blocks", "event_rows"),
}
FAILURE_COLUMNS = (
    "id", "kind", "receiver", "path", "offset", "failed_at", "attempt_count", "error", "actor",
    "instance_id", "subscription",
)


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def physical_column(name: str) -> str:
    return "u:" + name.lower()


class SqliteCatalogue:
    dialect = "sqlite"

    def __init__(self, db: SqliteDb) -> None:
        self._db = db
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        # Per tenant: (catalogue version, its tables, the physical tables).
        self._threads = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="yoke-sql-query")
        self._physical = PhysicalTables()  # the writer thread's
        self._cached: dict[str, tuple[int, dict[tuple[str, str], tuple[ColumnUnion, ...]], dict[tuple[str, str], str]]] = {}

    # --- the mirror ------------------------------------------------------------

    async def mirror(self, tenant: str, changes: Sequence[InstanceRows]) -> set[str]:
        def run() -> set[str]:
            again: set[str] = set()
            try:
                with self._db.transaction() as conn:
                    for change in changes:
                        if not _apply(conn, tenant, change, self._physical):
                            again.add(change.instance_id)
            except BaseException:
                self._physical.known.clear()  # tables or columns made here were rolled back
                raise
            return again

        return await self._db.write(run, streams_unchanged=True)

    async def mirrored(self, tenant: str, instance_ids: Sequence[str]) -> dict[str, int]:
        def run() -> dict[str, int]:
            conn = self._db.reader()
            found: dict[str, int] = {}
            for at in range(0, len(instance_ids), 500):
                chunk = list(instance_ids[at : at + 500])
                marks = ",".join("?" * len(chunk))
                for row in conn.execute(
                    f"SELECT instance_id, version FROM sql_instances WHERE tenant_id = ? AND instance_id IN ({marks})",
                    [tenant, *chunk],
                ):
                    found[row[0]] = row[1]
            return found

        return await self._db.read(run)

    # --- the catalogue ---------------------------------------------------------

    async def tables(self, tenant: str) -> list[CatalogueTable]:
        loop = asyncio.get_running_loop()
        tables, _ = await loop.run_in_executor(self._threads, lambda: self._catalogue(self._connection(), tenant))
        return catalogue_tables(tables)

    def _catalogue(
        self, conn: sqlite3.Connection, tenant: str
    ) -> tuple[dict[tuple[str, str], tuple[ColumnUnion, ...]], dict[tuple[str, str], str]]:
        row = conn.execute("SELECT version FROM sql_catalogue_versions WHERE tenant_id = ?", (tenant,)).fetchone()
        version = 0 if row is None else row[0]
        cached = self._cached.get(tenant)
        if cached is not None and cached[0] == version:
            return cached[1], cached[2]
        tables = union_columns([
            tuple(r) for r in conn.execute(
                "SELECT actor, tbl, col, declared, min(position) FROM sql_columns WHERE tenant_id = ?"
                " GROUP BY actor, tbl, col, declared",
                (tenant,),
            )
        ])
        physical = {(r[0], r[1]): r[2] for r in conn.execute("SELECT actor, tbl, physical FROM sql_row_tables")}
        self._cached[tenant] = (version, tables, physical)
        return tables, physical

    # --- queries ---------------------------------------------------------------

    async def query(
        self, tenant: str, plan: Plan, params: Sequence[Any], *, max_rows: int, timeout_s: float,
        failures: list[dict[str, Any]] | None = None,
    ) -> QueryResult:
        def run() -> QueryResult:
            conn = self._connection()
            tables, physical = self._catalogue(conn, tenant)
            views: dict[tuple[str, str], str] = {}
            allowed: set[str] = set()
            bases: set[str] = set()  # the tables the views read
            tables_made: set[str] = set()  # temporary tables (yoke.failures), not views
            try:
                for i, (schema, name) in enumerate(sorted(plan.relations)):
                    view = f"yoke_query_{i}"
                    if schema == YOKE_SCHEMA and name == "failures":
                        _failures_table(conn, view, failures or [])
                        tables_made.add(view)
                    else:
                        body, base = _relation(tenant, schema, name, tables, physical)
                        bases.update(base)
                        conn.execute(f"CREATE TEMP VIEW {quote(view)} AS {body}")
                    views[(schema, name)] = f"temp.{quote(view)}"
                    allowed.add(view)
                return bounded_sqlite_query(
                    conn, plan.render(views), list(params), _authorizer(allowed, bases),
                    max_rows=max_rows, timeout_s=timeout_s,
                )
            except (OverflowError, ValueError) as exc:  # a parameter SQLite cannot take
                raise errors.InvalidInput(f"params: {exc}", field="params") from None
            except sqlite3.Error as exc:
                if "interrupted" in str(exc):
                    raise SqlRefused("sql_timeout", f"the query ran out of time ({timeout_s:g} s)") from None
                if "not authorized" in str(exc) or "prohibited" in str(exc):
                    raise SqlRefused("sql_read_only", f"sqlite: {exc}") from None
                raise SqlRefused("sql_error", f"sqlite: {exc}") from None
            finally:
                for view in allowed:
                    kind = "TABLE" if view in tables_made else "VIEW"
                    conn.execute(f"DROP {kind} IF EXISTS temp.{quote(view)}")

        # Threads of their own: a long query never holds up the store's reads.
        return await asyncio.get_running_loop().run_in_executor(self._threads, run)

    def _connection(self) -> sqlite3.Connection:
        """This reader thread's query connection: read-only, its own (an
        authorizer and a progress handler are set on it per query)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                f"file:{self._db.path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA busy_timeout=10000")
            # No value a query makes may pass this (a string or blob: memory).
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    async def close(self) -> None:
        await asyncio.to_thread(self._threads.shutdown, wait=True)  # (a query ends by its time limit)
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()


def _relation(
    tenant: str, schema: str, name: str, tables: dict[tuple[str, str], tuple[ColumnUnion, ...]],
    physical: dict[tuple[str, str], str],
) -> tuple[str, Sequence[str]]:
    """The view's body and the tables it reads."""
    if schema == YOKE_SCHEMA:
        return YOKE_VIEWS[name].replace("?T", literal(tenant)), YOKE_TABLES[name]
    columns = tables.get((schema, name))
    if columns is None:
        raise SqlRefused("sql_unknown_table", f"no table {schema}.{name}: no instance of {schema!r} has one")
    table = physical.get((schema, name))
    if table is None:  # declared, but no row was ever mirrored
        cols = ", ".join(f"NULL AS {quote(c.visible)}" for c in columns)
        return f"SELECT NULL AS instance_id, NULL AS key{', ' if cols else ''}{cols} WHERE 0", ()
    cols = ", ".join(f"{quote(physical_column(c.name))} AS {quote(c.visible)}" for c in columns)
    return (
        f"SELECT instance_id, key{', ' if cols else ''}{cols} FROM main.{quote(table)}"
        f" WHERE tenant_id = {literal(tenant)}"
    ), (table,)


def _failures_table(conn: sqlite3.Connection, name: str, failures: list[dict[str, Any]]) -> None:
    cols = ", ".join(quote(c) for c in FAILURE_COLUMNS)
    conn.execute(f"CREATE TEMP TABLE {quote(name)} ({cols})")
    conn.executemany(
        f"INSERT INTO temp.{quote(name)} VALUES ({','.join('?' * len(FAILURE_COLUMNS))})",
        [[f.get(c) for c in FAILURE_COLUMNS] for f in failures],
    )


# The JSON table functions, and the schema SQLite reads to set them up.
_ALWAYS_READABLE = {"json_each", "json_tree", "sqlite_master"}


def _authorizer(allowed: set[str], bases: set[str]) -> Any:
    """Reads of the query's own views (and through them) and nothing else;
    no function that reaches outside the query."""
    def check(action: int, arg1: str | None, arg2: str | None, db: str | None, by: str | None) -> int:
        if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE):
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_READ:
            # A read of no column (count(*)) names no view: the views' own
            # tables. A common table expression is in no database. The JSON
            # table functions are read as tables.
            ok = (
                db is None or by in allowed or arg1 in allowed or (not arg2 and arg1 in bases)
                or arg1 in _ALWAYS_READABLE
            )
            return sqlite3.SQLITE_OK if ok else sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and by is None:
            # (how SQLite sets up json_each on first use; the connection is read-only)
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            name = (arg2 or "").lower()
            if name in _REFUSED_FUNCTIONS or name.startswith(_REFUSED_PREFIXES):
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        return sqlite3.SQLITE_DENY

    return check


# --- the mirror's writes (the writer thread, in one transaction) ---------------


def _apply(conn: sqlite3.Connection, tenant: str, change: InstanceRows, physical: PhysicalTables) -> bool:
    """One instance's change; False when it needs a whole resend."""
    found = conn.execute(
        "SELECT actor, key FROM actor_instances WHERE tenant_id = ? AND instance_id = ?",
        (tenant, change.instance_id),
    ).fetchone()
    if found is None:
        return True  # removed meanwhile: nothing to keep
    actor, key = found[0], found[1]
    held = conn.execute(
        "SELECT version, shapes FROM sql_instances WHERE tenant_id = ? AND instance_id = ?",
        (tenant, change.instance_id),
    ).fetchone()
    if held is None and not change.whole:
        return False
    if held is not None and held[0] >= change.version:
        return True  # the mirror has this or newer (a late send of an older copy, whole or not)
    if change.shapes is None and not change.whole:  # rows only: the shapes as held
        before: dict[str, list[list[str]]] = {}
        shapes = before
    else:
        before = {} if held is None else orjson.loads(held[1])
        shapes = before if change.shapes is None else {
            t: [[c.name, c.declared] for c in cols] for t, cols in change.shapes.items()
        }
    gone = set(before) if change.whole else set(before) - set(shapes)
    for table in gone:
        phys = _physical_name(conn, actor, table)
        if phys is not None:
            conn.execute(f"DELETE FROM {quote(phys)} WHERE tenant_id = ? AND instance_id = ?", (tenant, change.instance_id))
    if change.whole or change.shapes is not None:
        conn.execute("DELETE FROM sql_columns WHERE tenant_id = ? AND instance_id = ?", (tenant, change.instance_id))
        conn.executemany(
            "INSERT INTO sql_columns (tenant_id, actor, tbl, col, instance_id, declared, position) VALUES (?,?,?,?,?,?,?)",
            [
                (tenant, actor, table, c[0], change.instance_id, c[1], i)
                for table, cols in shapes.items() for i, c in enumerate(cols)
            ],
        )
        conn.execute(
            "INSERT INTO sql_catalogue_versions VALUES (?, 1) ON CONFLICT (tenant_id) DO UPDATE SET version = version + 1",
            (tenant,),
        )
    for table, rows in change.tables.items():
        phys = physical.holding(conn, actor, table, rows.columns)
        if rows.whole:
            conn.execute(f"DELETE FROM {quote(phys)} WHERE tenant_id = ? AND instance_id = ?", (tenant, change.instance_id))
        elif rows.deletes:
            conn.executemany(
                f"DELETE FROM {quote(phys)} WHERE tenant_id = ? AND instance_id = ? AND rid = ?",
                [(tenant, change.instance_id, rid) for rid in rows.deletes],
            )
        if rows.upserts:
            cols = ", ".join(quote(physical_column(c)) for c in rows.columns)
            marks = ",".join("?" * (4 + len(rows.columns)))
            conn.executemany(
                f"INSERT OR REPLACE INTO {quote(phys)} (tenant_id, instance_id, rid, key{', ' if cols else ''}{cols})"
                f" VALUES ({marks})",
                [(tenant, change.instance_id, rid, key, *values) for rid, values in rows.upserts.items()],
            )
    if held is not None and change.shapes is None and not change.whole:  # the shapes stay
        conn.execute(
            "UPDATE sql_instances SET version = ? WHERE tenant_id = ? AND instance_id = ?",
            (change.version, tenant, change.instance_id),
        )
        return True
    conn.execute(
        "INSERT INTO sql_instances (tenant_id, instance_id, version, shapes) VALUES (?,?,?,?)"
        " ON CONFLICT (tenant_id, instance_id) DO UPDATE SET version = excluded.version, shapes = excluded.shapes",
        (tenant, change.instance_id, change.version, orjson.dumps(shapes).decode()),
    )
    return True


def _physical_name(conn: sqlite3.Connection, actor: str, table: str) -> str | None:
    row = conn.execute("SELECT physical FROM sql_row_tables WHERE actor = ? AND tbl = ?", (actor, table)).fetchone()
    return None if row is None else row[0]


class PhysicalTables:
    """The mirror's tables of rows and their columns, as the writer made
    them (cleared when a transaction that may have made some rolls back)."""

    def __init__(self) -> None:
        self.known: dict[tuple[str, str], tuple[str, set[str]]] = {}

    def holding(self, conn: sqlite3.Connection, actor: str, table: str, columns: Sequence[str]) -> str:
        """The table of ``actor.table``'s rows, made or widened to hold ``columns``."""
        known = self.known.get((actor, table))
        if known is None:
            name = _physical_name(conn, actor, table)
            if name is None:
                name = _make_table(conn, actor, table)
            known = self.known[(actor, table)] = (name, {r[1].lower() for r in conn.execute(f"PRAGMA table_info({quote(name)})")})
        name, have = known
        for column in columns:
            if physical_column(column) not in have:
                conn.execute(f"ALTER TABLE {quote(name)} ADD COLUMN {quote(physical_column(column))}")
                have.add(physical_column(column))
        return name


def _make_table(conn: sqlite3.Connection, actor: str, table: str) -> str:
    number = conn.execute("SELECT count(*) + 1 FROM sql_row_tables").fetchone()[0]
    name = f"sql_rows_{number}"
    conn.execute(
        f"CREATE TABLE {quote(name)} (tenant_id TEXT NOT NULL, instance_id TEXT NOT NULL,"
        " rid INTEGER NOT NULL, key TEXT NOT NULL)"
    )
    conn.execute(f"CREATE UNIQUE INDEX {quote(name + '_rows')} ON {quote(name)} (tenant_id, instance_id, rid)")
    conn.execute(f"CREATE INDEX {quote(name + '_keys')} ON {quote(name)} (tenant_id, key)")
    conn.execute("INSERT INTO sql_row_tables (actor, tbl, physical) VALUES (?, ?, ?)", (actor, table, name))
    return name


def forget_instance(conn: sqlite3.Connection, tenant: str, actor: str, instance_id: str) -> None:
    """A removed instance leaves the mirror (in the removal's transaction)."""
    held = conn.execute(
        "DELETE FROM sql_instances WHERE tenant_id = ? AND instance_id = ? RETURNING shapes", (tenant, instance_id)
    ).fetchone()
    if held is None:
        return
    for table in orjson.loads(held[0]):
        phys = _physical_name(conn, actor, table)
        if phys is not None:
            conn.execute(f"DELETE FROM {quote(phys)} WHERE tenant_id = ? AND instance_id = ?", (tenant, instance_id))
    conn.execute("DELETE FROM sql_columns WHERE tenant_id = ? AND instance_id = ?", (tenant, instance_id))
    conn.execute(
        "INSERT INTO sql_catalogue_versions VALUES (?, 1) ON CONFLICT (tenant_id) DO UPDATE SET version = version + 1",
        (tenant,),
    )
