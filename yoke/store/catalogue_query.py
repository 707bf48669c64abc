"""Checks a catalogue query and finds what to rewrite in it
(docs/advanced/sql.md), the same way for both drivers.

A query is one read-only statement in the dialect of the database it runs
on (SQLite's, or PostgreSQL's). It names actor tables as ``actor.table``
and Yoke's records as ``yoke.table``; every other name it reads must be a
common table expression of its own. The driver replaces each named table
with what holds its rows (the mirror, Yoke's tables), by position in the
text, so the rest of the query runs exactly as written.

Refused, each with its own error code and nothing run: more than one
statement, anything but a query (writes, DDL, ``ATTACH``, ``PRAGMA``,
``SET``, locking reads, ``SELECT INTO``), functions that reach outside the
query (files, the network, settings, other SQL), and a read of
``yoke.events`` that does not name the stream's path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sqlglot
import sqlglot.errors
import sqlglot.expressions as exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from .. import errors
from .catalogue import YOKE_SCHEMA

MAX_QUERY_CHARS = 32_768
# Yoke's records a query can name as yoke.<name>.
YOKE_RELATIONS = ("instances", "streams", "queue", "schedules", "subscriptions", "failures", "events")

# Statement kinds that change something or leave the query.
_REFUSED_NODES = tuple(
    cls for cls in (
        getattr(exp, name, None) for name in (
            "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Command", "Pragma",
            "Transaction", "Commit", "Rollback", "Set", "Attach", "Detach", "Use", "Copy", "Into",
            "Lock", "LoadData", "Grant", "Revoke", "Analyze", "Kill", "TruncateTable", "Refresh",
        )
    ) if cls is not None
)
# Functions that read files or the network, change or read settings, run
# other SQL, sleep, or load code (lower case; the prefixes end in '_').
_REFUSED_FUNCTIONS = frozenset({
    "load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "sqlite_offset",
    "set_config", "current_setting", "dblink", "query_to_xml", "query_to_xml_and_xmlschema",
    "query_to_xmlschema", "table_to_xml", "table_to_xml_and_xmlschema", "table_to_xmlschema",
    "cursor_to_xml", "cursor_to_xmlschema", "schema_to_xml", "schema_to_xml_and_xmlschema",
    "schema_to_xmlschema", "database_to_xml", "database_to_xml_and_xmlschema", "database_to_xmlschema",
    "ts_stat", "ts_rewrite", "nextval", "setval", "currval", "lastval", "txid_current",
    "has_table_privilege", "has_schema_privilege", "has_database_privilege", "to_regclass",
    "to_regproc", "to_regprocedure", "to_regtype", "to_regnamespace", "to_regrole", "version",
    "current_version", "sleep",
})
_REFUSED_PREFIXES = ("pg_", "lo_", "dblink_", "sqlite_", "yoke_", "gen_random", "inet_", "row_security", "read_")


@dataclass(frozen=True, slots=True)
class TableRef:
    """A named table in the text: ``text[start:end]`` is its name."""

    start: int
    end: int
    schema: str
    name: str
    aliased: bool  # the query gave it an alias (otherwise the driver names it ``name``)


@dataclass(frozen=True, slots=True)
class Plan:
    sql: str
    tables: list[TableRef]
    # Spans to cut (a column's ``actor.`` in ``actor.table.column``).
    cuts: list[tuple[int, int]] = field(default_factory=list)
    # ``?`` marks by position (PostgreSQL numbers them as parameters).
    placeholders: list[int] = field(default_factory=list)
    numbered: bool = False  # the query numbers its parameters ($1): a ? there is jsonb's operator

    @property
    def relations(self) -> set[tuple[str, str]]:
        return {(t.schema, t.name) for t in self.tables}

    def render(self, replace: dict[tuple[str, str], str], placeholder: str | None = None) -> str:
        """The query with each named table replaced by ``replace[(schema,
        name)]`` (aliased as the table's name unless the query aliased it)
        and, given ``placeholder`` (a format with ``{n}``), each ``?`` by it."""
        edits: list[tuple[int, int, str]] = []
        for t in self.tables:
            text = replace[(t.schema, t.name)]
            edits.append((t.start, t.end, text if t.aliased else f"{text} AS {_quote(t.name)}"))
        edits += [(a, b, "") for a, b in self.cuts]
        if placeholder is not None:
            edits += [(p, p + 1, placeholder.format(n=i)) for i, p in enumerate(self.placeholders, 1)]
        out, at = [], 0
        for start, end, text in sorted(edits):
            out.append(self.sql[at:start])
            out.append(text)
            at = end
        out.append(self.sql[at:])
        return "".join(out)


def plan(sql: object, dialect: str) -> Plan:
    """Check ``sql`` and find its named tables (``dialect``: 'sqlite' or
    'postgres'). CPU work that grows with the text (MAX_QUERY_CHARS keeps
    it to a fraction of a second): run it off the event loop."""
    if not isinstance(sql, str) or not sql.strip():
        raise errors.InvalidInput("query must be a non-empty string", field="query")
    if len(sql) > MAX_QUERY_CHARS:
        raise SqlRefused("sql_too_long", f"a query has at most {MAX_QUERY_CHARS} characters")
    if "\x00" in sql:
        raise errors.InvalidInput("query must not contain NUL", field="query")
    try:
        statements = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except (sqlglot.errors.SqlglotError, RecursionError, ValueError) as exc:
        raise SqlRefused("sql_syntax", f"the query does not parse: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise SqlRefused("sql_one_statement", "send exactly one statement")
    tree = statements[0]
    if not isinstance(tree, exp.Query):
        raise SqlRefused("sql_read_only", f"only queries are allowed, not {tree.key.upper()}")
    for node in tree.walk():
        if isinstance(node, _REFUSED_NODES):
            raise SqlRefused("sql_read_only", f"only queries are allowed: {node.key.upper()} is not")
        if isinstance(node, exp.Func):
            name = _function_name(node)
            if name and (name in _REFUSED_FUNCTIONS or name.startswith(_REFUSED_PREFIXES)):
                raise SqlRefused("sql_function_refused", f"the function {name}() is not allowed in a query")
    ctes = _cte_references(tree)
    tables: list[TableRef] = []
    for table in tree.find_all(exp.Table):
        if not isinstance(table.this, exp.Identifier):
            continue  # a table function (its name was checked above)
        db, name = table.args.get("db"), table.this
        if table.args.get("catalog") is not None:
            raise SqlRefused("sql_unknown_table", f"no table {table.sql(dialect=dialect)}: name tables as ACTOR.TABLE or yoke.TABLE")
        if db is None:
            if id(table) in ctes:
                continue
            raise SqlRefused(
                "sql_unknown_table",
                f"no table {name.name!r}: name tables as ACTOR.TABLE (an actor's) or yoke.TABLE (Yoke's records)",
            )
        schema = db.name
        if schema.lower() == YOKE_SCHEMA:
            schema = YOKE_SCHEMA
            if name.name.lower() not in YOKE_RELATIONS:
                raise SqlRefused(
                    "sql_unknown_table", f"no table yoke.{name.name}: Yoke's are {', '.join(YOKE_RELATIONS)}"
                )
            if name.name.lower() == "events":
                _check_events_bounded(table)
        start, end = db.meta.get("start"), name.meta.get("end")
        if start is None or end is None:  # (sqlglot keeps positions for parsed names)
            raise SqlRefused("sql_syntax", f"cannot place {table.sql(dialect=dialect)} in the query")
        end += 1  # (positions include the quotes; end is the last character's)
        aliased = table.args.get("alias") is not None
        rel = name.name.lower() if schema == YOKE_SCHEMA else name.name
        tables.append(TableRef(start, end, schema, rel, aliased))
    cuts = []
    for column in tree.find_all(exp.Column):
        db = column.args.get("db")
        if db is not None and column.args.get("table") is not None:
            start, table_start = db.meta.get("start"), column.args["table"].meta.get("start")
            if start is not None and table_start is not None:
                cuts.append((start, table_start))
    placeholders: list[int] = []
    numbered = False
    if dialect == "postgres":  # ? becomes $n there (asyncpg numbers its parameters)
        tokens = sqlglot.Dialect.get_or_raise(dialect).tokenize(sql)
        placeholders = [t.start for t in tokens if t.token_type == sqlglot.TokenType.PLACEHOLDER and t.text == "?"]
        numbered = any(t.token_type == sqlglot.TokenType.PARAMETER for t in tokens)
    return Plan(sql, tables, cuts, placeholders, numbered)


class SqlRefused(errors.InvalidInput):
    """A catalogue query refused before it ran; ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message, field="query")
        self.code = code


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.lower()  # (the name itself: "quoted" names call the same function)
    return node.sql_name().lower()  # sqlglot's own type for it (VERSION() is CURRENT_VERSION)


def _cte_references(tree: exp.Expression) -> set[int]:
    """The table names that read a common table expression of the query
    where they stand (by SQL's scoping: a CTE is seen by the query it
    heads and the CTEs after it, by itself only when recursive). The same
    name elsewhere is the database's table, and refused."""
    try:
        scopes = traverse_scope(tree)
    except Exception as exc:  # (sqlglot could not follow the query's scopes)
        raise SqlRefused("sql_syntax", f"the query's names cannot be resolved: {_first_line(exc)}") from None
    return {
        id(table) for scope in scopes for table in scope.tables
        if isinstance(scope.sources.get(table.alias_or_name), Scope)
    }


def _check_events_bounded(table: exp.Table) -> None:
    """yoke.events is read one stream at a time: the SELECT that reads it
    compares ``path`` with a value (= or IN a list of values) in its WHERE,
    as one of the ANDed terms (not under an OR or a NOT)."""
    select = table.find_ancestor(exp.Select)
    alias = table.alias_or_name.lower()
    conditions = []  # (the ON of an outer join keeps the other side's rows: only WHERE counts)
    if select is not None and select.args.get("where") is not None:
        conditions.append(select.args["where"].this)
    for condition in conditions:
        for term in _conjuncts(condition):
            if isinstance(term, exp.In):  # every value in the list a value: IN ('/a', path) bounds nothing
                values = term.expressions
                if not values or any(v.find(exp.Column, exp.Select) for v in values):
                    continue
                pairs = [(term.this, values[0])]
            elif isinstance(term, exp.EQ):
                pairs = [(term.this, term.expression), (term.expression, term.this)]
            else:
                continue
            for column, value in pairs:
                if _path_of(column, alias) and value is not None and not value.find(exp.Column, exp.Select):
                    return
    raise SqlRefused(
        "sql_events_unbounded",
        "yoke.events is read one stream at a time: compare its path with a value (WHERE path = ...)",
    )


def _conjuncts(condition: exp.Expression) -> list[exp.Expression]:
    while isinstance(condition, exp.Paren):
        condition = condition.this
    if isinstance(condition, exp.And):
        return _conjuncts(condition.this) + _conjuncts(condition.expression)
    return [condition]


def _path_of(node: exp.Expression, alias: str) -> bool:
    return isinstance(node, exp.Column) and node.name.lower() == "path" and node.table.lower() in ("", alias)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _first_line(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text.replace("\x1b[4m", "").replace("\x1b[0m", "")
