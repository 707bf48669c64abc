"""PostgreSQL implementation of the SQL catalogue (``store/catalogue.py``).

The mirror keeps every instance row in ``sql_rows`` as a JSON object of
its columns (a BLOB as ``{"$blob": base64}``). A query names an actor's
table; it reads a subquery over ``sql_rows`` giving each column the type
its instances declared (``column_sql``). The query runs as the runtime's
role in a read-only transaction with the tenant set, so row-level
security keeps it to the tenant's rows whatever its text, with a
statement timeout.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from ... import errors
from ..catalogue import (
    YOKE_SCHEMA,
    CatalogueTable,
    ColumnUnion,
    InstanceRows,
    QueryResult,
    Rows,
    catalogue_tables,
    column_affinity,
    union_columns,
)
from ..catalogue_query import Plan, SqlRefused
from .connection import quoted

if TYPE_CHECKING:
    from .connection import PgDb

SQL_QUERY_CONNECTIONS = 2  # catalogue queries at once, each on a connection of its own (more wait)
QUERY_WORK_MEM = "64MB"

YOKE_VIEWS: dict[str, str] = {
    "instances": (
        "SELECT instance_id, actor, key, config, filter, parent_id, worker_id, created_at"
        " FROM actor_instances WHERE tenant_id = ?T"
    ),
    "streams": (
        "SELECT path, stream_id, created_at, head, pruned_through, closed, legal_hold, durable_events,"
        " durable_bytes, unread_events, unread_bytes, min_ack, metadata"
        " FROM streams WHERE tenant_id = ?T"
    ),
    "queue": (
        "SELECT qid, instance_id, group_key, status, attempts, path, seq AS \"offset\", priority, available_at,"
        " lease_until, worker_id, enqueued_at, started_at, last_error,"
        # (a stream that pins its data handling keeps its events to its own surface)
        " CASE WHEN EXISTS (SELECT 1 FROM streams p WHERE p.tenant_id = q.tenant_id AND p.path = q.path"
        " AND p.data_handling IS NOT NULL) THEN NULL ELSE event END AS event"
        " FROM actor_queue q WHERE tenant_id = ?T"
    ),
    "schedules": (
        "SELECT instance_id, name, due_at, cron, stream, event, created_at"
        " FROM actor_schedules WHERE tenant_id = ?T"
    ),
    "subscriptions": (
        "SELECT s.path, s.name, s.config->>'kind' AS kind,"
        " CASE WHEN s.halted IS NOT NULL THEN 'halted' ELSE 'active' END AS state,"
        " s.processed_through_offset AS cursor,"
        " greatest(coalesce(st.head, 0) - s.processed_through_offset, 0) AS lag,"
        " s.attempts, s.last_error, s.next_retry_at, s.delivered, s.failures, s.halted, s.config"
        " FROM subscriptions s LEFT JOIN streams st ON st.tenant_id = s.tenant_id AND st.path = s.path"
        " WHERE s.tenant_id = ?T"
    ),
    "events": (
        "SELECT s.path, e.seq AS \"offset\", e.id, e.at, e.type, e.payload, e.metadata, e.source, e.correlation,"
        " e.priority, e.group_id, e.idempotency_key, e.size"
        " FROM streams s JOIN events e ON e.tenant_id = s.tenant_id AND e.sid = s.sid"
        " WHERE s.tenant_id = ?T AND s.data_handling IS NULL"
    ),
    "failures": (
        "SELECT * FROM jsonb_to_recordset(?F::jsonb) AS f(id text, kind text, receiver text, path text,"
        " \"offset\" bigint, failed_at bigint, attempt_count integer, error text, actor text,"
        " instance_id text, subscription text)"
    ),
}
# How a column of each affinity reads from its JSON value ({v}): as its type;
# a value of another type (SQLite lets an INTEGER column hold 'abc') as NULL.
_TYPED = {
    "INTEGER": "CASE WHEN jsonb_typeof({v}) = 'number' THEN ({v})::numeric::bigint END",
    "REAL": "CASE WHEN jsonb_typeof({v}) = 'number' THEN ({v})::float8 END",
    "NUMERIC": "CASE WHEN jsonb_typeof({v}) = 'number' THEN ({v})::numeric END",
    "BLOB": "CASE WHEN jsonb_typeof({v}) = 'object' THEN decode({v}->>'$blob', 'base64') END",
}


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def column_sql(column: ColumnUnion) -> str:
    """The column read from a mirrored row (``r.data``): typed by the
    affinity its instances declared, text where they differ or declared none."""
    value = f"r.data->{quoted(column.name)}"
    kind = None if "" in column.declared else column_affinity(column.declared)
    if kind is None or kind == "TEXT":
        return f"r.data->>{quoted(column.name)}"
    return _TYPED[kind].format(v=value)


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$blob": base64.b64encode(value).decode()}
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class PgCatalogue:
    dialect = "postgres"

    def __init__(self, db: PgDb) -> None:
        self._db = db
        self._cached: dict[str, tuple[int, dict[tuple[str, str], tuple[ColumnUnion, ...]]]] = {}

    # --- the mirror ------------------------------------------------------------

    async def mirror(self, tenant: str, changes: Sequence[InstanceRows]) -> set[str]:
        ids = [c.instance_id for c in changes]
        again: set[str] = set()
        async with self._db.tx(tenant) as conn:
            held = {
                r["instance_id"]: (r["version"], orjson.loads(r["shapes"]))
                for r in await conn.fetch(
                    "SELECT instance_id, version, shapes::text AS shapes FROM sql_instances"
                    " WHERE tenant_id = $1 AND instance_id = ANY($2::text[]) ORDER BY instance_id FOR UPDATE",
                    tenant, ids,
                )
            }
            live = {
                r["instance_id"]: (r["actor"], r["key"])
                for r in await conn.fetch(
                    # (locked against a removal until this commits: rows
                    # written after it would stay for good)
                    "SELECT instance_id, actor, key FROM actor_instances WHERE tenant_id = $1"
                    " AND instance_id = ANY($2::text[]) ORDER BY instance_id FOR KEY SHARE",
                    tenant, ids,
                )
            }
            clear: list[tuple[str, str]] = []  # (instance, table): every row goes
            deletes: list[tuple[str, str, int]] = []
            upserts: list[tuple[str, str, str, int, str, str]] = []  # actor, table, instance, rid, key, data
            reshaped: list[tuple[str, str, str, str, str, int]] = []  # actor, table, column, instance, declared, position
            reshaped_ids: list[str] = []
            instances: list[tuple[str, int, str]] = []
            for change in changes:
                iid = change.instance_id
                if iid not in live:
                    continue  # removed meanwhile
                actor, key = live[iid]
                before = held.get(iid)
                if before is None and not change.whole:
                    again.add(iid)
                    continue
                if before is not None and before[0] >= change.version:
                    continue  # the mirror has this or newer (a late send of an older copy, whole or not)
                old_shapes: dict[str, Any] = {} if before is None else before[1]
                shapes = old_shapes if change.shapes is None else {
                    t: [[c.name, c.declared] for c in cols] for t, cols in change.shapes.items()
                }
                gone = set(old_shapes) if change.whole else set(old_shapes) - set(shapes)
                clear += [(iid, t) for t in gone]
                if change.whole or change.shapes is not None:
                    reshaped_ids.append(iid)
                    reshaped += [
                        (actor, t, c[0], iid, c[1], i) for t, cols in shapes.items() for i, c in enumerate(cols)
                    ]
                for table, rows in change.tables.items():
                    if rows.whole:
                        clear.append((iid, table))
                    else:
                        deletes += [(iid, table, rid) for rid in rows.deletes]
                    for rid, values in rows.upserts.items():
                        data = {c: _json_value(v) for c, v in zip(rows.columns, values)}
                        upserts.append((actor, table, iid, rid, key, orjson.dumps(data).decode()))
                instances.append((iid, change.version, orjson.dumps(shapes).decode()))
            if clear:
                await conn.execute(
                    "DELETE FROM sql_rows WHERE tenant_id = $1 AND (instance_id, tbl) IN"
                    " (SELECT * FROM unnest($2::text[], $3::text[]))",
                    tenant, [c[0] for c in clear], [c[1] for c in clear],
                )
            if deletes:
                await conn.execute(
                    "DELETE FROM sql_rows WHERE tenant_id = $1 AND (instance_id, tbl, rid) IN"
                    " (SELECT * FROM unnest($2::text[], $3::text[], $4::bigint[]))",
                    tenant, [d[0] for d in deletes], [d[1] for d in deletes], [d[2] for d in deletes],
                )
            if upserts:
                await conn.execute(
                    "INSERT INTO sql_rows (tenant_id, actor, tbl, instance_id, rid, key, data)"
                    " SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::jsonb[])"
                    " ON CONFLICT (tenant_id, instance_id, tbl, rid)"
                    " DO UPDATE SET data = excluded.data, key = excluded.key",
                    tenant, *[list(column) for column in zip(*upserts)],
                )
            if reshaped_ids:
                await conn.execute(
                    "DELETE FROM sql_columns WHERE tenant_id = $1 AND instance_id = ANY($2::text[])",
                    tenant, reshaped_ids,
                )
                if reshaped:
                    await conn.execute(
                        "INSERT INTO sql_columns (tenant_id, actor, tbl, col, instance_id, declared, position)"
                        " SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int[])",
                        tenant, *[list(column) for column in zip(*reshaped)],
                    )
                await _bump(conn, tenant)
            if instances:
                await conn.execute(
                    "INSERT INTO sql_instances (tenant_id, instance_id, version, shapes)"
                    " SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::jsonb[])"
                    " ON CONFLICT (tenant_id, instance_id)"
                    " DO UPDATE SET version = excluded.version, shapes = excluded.shapes",
                    tenant, *[list(column) for column in zip(*instances)],
                )
        return again

    async def mirrored(self, tenant: str, instance_ids: Sequence[str]) -> dict[str, int]:
        async with self._db.tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT instance_id, version FROM sql_instances WHERE tenant_id = $1 AND instance_id = ANY($2::text[])",
                tenant, list(instance_ids),
            )
        return {r["instance_id"]: r["version"] for r in rows}

    # --- the catalogue ---------------------------------------------------------

    async def tables(self, tenant: str) -> list[CatalogueTable]:
        async with self._db.tx(tenant) as conn:
            return catalogue_tables(await self._catalogue(conn, tenant))

    async def _catalogue(
        self, conn: asyncpg.Connection, tenant: str
    ) -> dict[tuple[str, str], tuple[ColumnUnion, ...]]:
        version = await conn.fetchval("SELECT version FROM sql_catalogue_versions WHERE tenant_id = $1", tenant) or 0
        cached = self._cached.get(tenant)
        if cached is not None and cached[0] == version:
            return cached[1]
        rows = await conn.fetch(
            "SELECT actor, tbl, col, declared, min(position) FROM sql_columns WHERE tenant_id = $1"
            " GROUP BY actor, tbl, col, declared",
            tenant,
        )
        tables = union_columns([tuple(r) for r in rows])
        self._cached[tenant] = (version, tables)
        return tables

    # --- queries ---------------------------------------------------------------

    async def query(
        self, tenant: str, plan: Plan, params: Sequence[Any], *, max_rows: int, timeout_s: float,
        failures: list[dict[str, Any]] | None = None,
    ) -> QueryResult:
        values = list(params)
        async with self._db.read_only(tenant) as conn:
            tables = await self._catalogue(conn, tenant)
            replace: dict[tuple[str, str], str] = {}
            for schema, name in plan.relations:
                if schema == YOKE_SCHEMA:
                    body = YOKE_VIEWS[name].replace("?T", quoted(tenant))
                    if name == "failures":
                        values.append(orjson.dumps(failures or []).decode())
                        body = body.replace("?F", f"${len(values)}")
                else:
                    body = _relation(tenant, schema, name, tables)
                replace[(schema, name)] = f"({body})"
            # ? marks are parameters when the query has parameters and numbers
            # none ($1): otherwise a ? is the jsonb operator.
            text = plan.render(replace, "${n}" if params and not plan.numbered else None)
            # (work_mem: an aggregate over a million rows hashes in memory
            # instead of sorting on disk; two queries at most at a time)
            await conn.execute(
                f"SET LOCAL statement_timeout = {max(int(timeout_s * 1000), 1)}; SET LOCAL work_mem = '{QUERY_WORK_MEM}'"
            )
            try:
                statement = await conn.prepare(text, timeout=timeout_s + 5)
                cursor = await statement.cursor(*values, timeout=timeout_s + 5)
                rows = Rows(max_rows)
                while rows.add(await cursor.fetch(rows.wanted(), timeout=timeout_s + 5)):
                    pass
            except (asyncpg.DataError, TypeError, ValueError, OverflowError) as exc:
                # a parameter the query's types refuse
                raise errors.InvalidInput(f"params: {exc}", field="params") from None
            except asyncpg.QueryCanceledError:
                raise SqlRefused("sql_timeout", f"the query ran out of time ({timeout_s:g} s)") from None
            except (asyncpg.ReadOnlySQLTransactionError, asyncpg.InsufficientPrivilegeError) as exc:
                raise SqlRefused("sql_read_only", f"postgres: {exc}") from None
            except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                if isinstance(exc, asyncpg.PostgresConnectionError):
                    raise
                raise SqlRefused("sql_error", f"postgres: {exc}") from None
            result = rows.result([a.name for a in statement.get_attributes()])
        return QueryResult(result.columns, [[_plain(v) for v in r] for r in result.rows], result.truncated)


def _relation(tenant: str, schema: str, name: str, tables: dict[tuple[str, str], tuple[ColumnUnion, ...]]) -> str:
    columns = tables.get((schema, name))
    if columns is None:
        raise SqlRefused("sql_unknown_table", f"no table {schema}.{name}: no instance of {schema!r} has one")
    cols = "".join(f", {column_sql(c)} AS {quote(c.visible)}" for c in columns)
    return (
        f"SELECT r.instance_id, r.key{cols} FROM sql_rows r"
        f" WHERE r.tenant_id = {quoted(tenant)} AND r.actor = {quoted(schema)} AND r.tbl = {quoted(name)}"
    )


def _plain(value: Any) -> Any:
    """A value as Python's SQLite would give it: numeric as int or float."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**63 else float(value)
    return value


async def _bump(conn: asyncpg.Connection, tenant: str) -> None:
    await conn.execute(
        "INSERT INTO sql_catalogue_versions VALUES ($1, 1) ON CONFLICT (tenant_id)"
        " DO UPDATE SET version = sql_catalogue_versions.version + 1",
        tenant,
    )


async def forget_instance(conn: asyncpg.Connection, tenant: str, instance_id: str) -> None:
    """A removed instance leaves the mirror (in the removal's transaction)."""
    gone = await conn.fetchval(
        "DELETE FROM sql_instances WHERE tenant_id = $1 AND instance_id = $2 RETURNING 1", tenant, instance_id
    )
    if gone is None:
        return
    await conn.execute("DELETE FROM sql_rows WHERE tenant_id = $1 AND instance_id = $2", tenant, instance_id)
    await conn.execute("DELETE FROM sql_columns WHERE tenant_id = $1 AND instance_id = $2", tenant, instance_id)
    await _bump(conn, tenant)
