"""Which rows of an instance's database changed: what the SQL catalogue's
mirror (``actors/sql_mirror.py``) sends after a run.

On each connection it opens, a ``Capture`` installs temporary triggers on
the instance's tables (temporary: nothing is added to the user's schema,
and a copy of the database carries none). Each changed row calls back
with its table and row id, and moves ``_yoke_seq``, a counter in the
database itself: it commits with the change, so a change whose mirror
write was lost in a crash shows as a counter the mirror does not hold
(then the instance is sent whole); with the schema's own counter (a
change of tables alone moves no row) it makes the version a mirror write
carries. ``collect`` reads the changed rows'
current values: a row noted by a transaction that rolled back reads as it
is, so noting too much costs a read and is never wrong.

Runs on the instance's connection thread, under its operation lock.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from ..store.catalogue import STATE_RELATION, Column, InstanceRows, TableRows

SEQ_TABLE = "_yoke_seq"
SEQ_SCHEMA = f"CREATE TABLE IF NOT EXISTS {SEQ_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL)"
STATE_TABLE = "_yoke_state"  # (actors/state.py's): mirrored as <actor>.yoke_state
_NOTE = "_yoke_row_changed"  # the function the triggers call
_CHUNK = 500  # row ids per read


def quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class Capture:
    """One instance's change notes; outlives its connections (a connection
    closed with notes unsent leaves them to ``stash``)."""

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self.noted: dict[str, set[int | None]] = {}  # table -> row ids (None: the whole table)
        self.shapes: dict[str, tuple[Column, ...]] | None = None  # as last sent
        self._rowid: dict[str, bool] = {}  # table -> has row ids
        self._schema_version: int | None = None
        self.version_at_open = 0  # the database's version when its connection opened
        self.opened = False  # a connection opened since the mirror last looked
        self.stash: InstanceRows | None = None  # collected from a connection that closed
        self._current: dict[str, tuple[Column, ...]] | None = None  # the connection's tables now
        self._remade: set[str] = set()  # tables whose triggers were missing: made anew (or renamed)
        self.resend_whole = False  # what was noted no longer holds (a reload): send the database whole
        self.wrote = False  # an operation wrote since the last collect (maybe the schema alone)

    @property
    def pending(self) -> bool:
        return bool(self.noted) or self.stash is not None

    def attach(self, conn: sqlite3.Connection) -> None:
        """A connection opened: note its changes from now on."""
        conn.create_function(_NOTE, 2, self._note)
        # A REPLACE's deletes of the rows it replaces fire the delete
        # triggers only so (otherwise the replaced row stays in the mirror).
        conn.execute("PRAGMA recursive_triggers = ON")
        # A new instance's file has the counter (state._template): no write
        # here then.
        conn.execute(SEQ_SCHEMA)
        if conn.execute(f"SELECT 1 FROM {SEQ_TABLE} WHERE id = 1").fetchone() is None:
            conn.execute(f"INSERT OR IGNORE INTO {SEQ_TABLE} VALUES (1, 0)")
        self._schema_version = None  # a new connection has no triggers yet
        self._shapes_now(conn)
        self._remade.clear()  # (all of them, new on this connection: the version check covers it)
        self.version_at_open = _version(conn)
        self.opened = True

    def discard(self) -> None:
        """What was noted no longer holds (the connection's copy is dropped
        for the stored one): the next send is the database whole."""
        self.noted.clear()
        self.stash = None
        self.resend_whole = True

    def mirror_current(self) -> None:
        """The mirror holds the database as it was at open: its tables as
        they were then are what was sent."""
        self.shapes = dict(self._current or {})

    def _note(self, table: str, rid: int | None) -> None:
        self.noted.setdefault(table, set()).add(rid)

    def _shapes_now(self, conn: sqlite3.Connection) -> dict[str, tuple[Column, ...]]:
        """The tables and their columns, with triggers on each (looked up
        again only when the schema changed)."""
        version = conn.execute("PRAGMA schema_version").fetchone()[0]
        current = self._current
        if version == self._schema_version and current is not None:
            return current
        shapes: dict[str, tuple[Column, ...]] = {}
        for _schema, name, kind, _n, without_rowid, _strict in conn.execute("PRAGMA main.table_list"):
            if kind != "table" or name.startswith("sqlite_") or (name.startswith("_yoke_") and name != STATE_TABLE):
                continue
            columns = tuple(
                Column(row[1], row[2] or "") for row in conn.execute(f"PRAGMA main.table_info({quote(name)})")
            )
            if name == STATE_TABLE:
                columns = tuple(c for c in columns if c.name != "id")
            elif name == STATE_RELATION or any(c.name.lower() in ("rowid", "oid", "_rowid_") for c in columns):
                continue  # shadows the state's name, or hides the row id: not mirrored
            shapes[_relation(name)] = columns
            self._rowid[_relation(name)] = not without_rowid
        self._remade |= {_relation(t) for t in _sync_triggers(conn, {_table(r): self._rowid[r] for r in shapes})}
        self._schema_version = version
        self._current = shapes
        return shapes

    def collect(self, conn: sqlite3.Connection | None, *, whole: bool) -> InstanceRows | None:
        """What the mirror lacks, read now (None: nothing). Without a
        connection (it closed for good), only what was stashed."""
        stash, self.stash = self.stash, None
        if conn is None:
            return stash
        if conn.in_transaction:  # an atomic run's, not committed: later
            self.stash = stash
            return None
        shapes = self._shapes_now(conn)
        self.wrote = False
        # The first send from this process is whole: what the mirror holds
        # is unknown here (a crash elsewhere may have left it behind).
        whole = whole or self.resend_whole or self.shapes is None
        before = self.shapes
        reshaped = {t for t, cols in shapes.items() if before is None or before.get(t) != cols} | self._remade
        if before is not None and set(before) - set(shapes):
            reshaped.add("")  # a table went: the new shapes say which
        noted, self.noted = self.noted, {}
        if not whole and not noted and not reshaped:
            return stash
        out = InstanceRows(self.instance_id, _version(conn), whole=whole)
        if whole or reshaped:
            out.shapes = dict(shapes)
        for relation, columns in shapes.items():
            rids = noted.get(_table(relation), set())
            names = tuple(c.name for c in columns)
            if whole or relation in reshaped or None in rids or not self._rowid[relation]:
                if whole or relation in reshaped or rids:
                    out.tables[relation] = TableRows(names, dict(_all_rows(conn, relation, names, self._rowid[relation])), whole=True)
            elif rids:
                found = dict(_rows(conn, relation, names, sorted(r for r in rids if r is not None)))
                out.tables[relation] = TableRows(names, found, {r for r in rids if r not in found and r is not None})
        self.shapes = dict(shapes)
        self._remade.clear()
        self.resend_whole = False
        return out if stash is None else stash.merge(out)

    def close(self, conn: sqlite3.Connection) -> None:
        """The connection is closing: what it noted is read now, kept for
        the next send."""
        if self.noted:
            self.stash = self.collect(conn, whole=False)
        self._schema_version = None


def _version(conn: sqlite3.Connection) -> int:
    """The rows' counter, then the schema's: both only grow."""
    row = conn.execute(f"SELECT seq FROM {SEQ_TABLE} WHERE id = 1").fetchone()
    schema = conn.execute("PRAGMA schema_version").fetchone()[0]
    return ((0 if row is None else int(row[0])) << 32) | (schema & 0xFFFFFFFF)


def _relation(table: str) -> str:
    return STATE_RELATION if table == STATE_TABLE else table


def _table(relation: str) -> str:
    return STATE_TABLE if relation == STATE_RELATION else relation


_TRIGGER = "_yoke_capture:"  # + event + ":" + the table's name (the one its body notes)
_EVENTS = ("insert", "update", "delete")


def _sync_triggers(conn: sqlite3.Connection, tables: dict[str, bool]) -> set[str]:
    """Triggers on each of ``tables`` (name -> has row ids); returns the
    tables that had none (new, made anew, or renamed to this name). A
    trigger moves with a renamed table, its body still noting the old name:
    it goes, and the table gets its own."""
    have: dict[str, set[str]] = {}
    for name, table in conn.execute(
        "SELECT name, tbl_name FROM temp.sqlite_master WHERE type = 'trigger' AND name LIKE ?", (_TRIGGER + "%",)
    ):
        event, _, noted = name[len(_TRIGGER):].partition(":")
        if noted != table or table not in tables:
            conn.execute(f"DROP TRIGGER IF EXISTS temp.{quote(name)}")
        else:
            have.setdefault(table, set()).add(event)
    made = set()
    for table, rowid in tables.items():
        if have.get(table) != set(_EVENTS):
            _triggers(conn, table, rowid)
            made.add(table)
    return made


def _triggers(conn: sqlite3.Connection, table: str, rowid: bool) -> None:
    q = quote(table)
    literal = "'" + table.replace("'", "''") + "'"
    bump = f"UPDATE {SEQ_TABLE} SET seq = seq + 1 WHERE id = 1;"  # (a trigger names no schema)
    new, old = ("NEW.rowid", "OLD.rowid") if rowid else ("NULL", "NULL")
    for event, notes in (("insert", [new]), ("delete", [old]), ("update", [old] if old == new else [old, new])):
        name = quote(f"{_TRIGGER}{event}:{table}")
        calls = " ".join(f"SELECT {_NOTE}({literal}, {n});" for n in notes)
        conn.execute(
            f"CREATE TEMP TRIGGER IF NOT EXISTS {name} AFTER {event.upper()} ON main.{q} BEGIN {calls} {bump} END"
        )


def _all_rows(conn: sqlite3.Connection, relation: str, names: tuple[str, ...], rowid: bool) -> Any:
    cols = ", ".join(quote(n) for n in names) or "NULL"
    table = quote(_table(relation))
    if rowid:
        return ((r[0], r[1:]) for r in conn.execute(f"SELECT rowid, {cols} FROM main.{table}"))
    return ((i, r) for i, r in enumerate(conn.execute(f"SELECT {cols} FROM main.{table}"), 1))


def _rows(conn: sqlite3.Connection, relation: str, names: tuple[str, ...], rids: list[int]) -> Any:
    cols = ", ".join(quote(n) for n in names) or "NULL"
    table = quote(_table(relation))
    for at in range(0, len(rids), _CHUNK):
        chunk = rids[at : at + _CHUNK]
        marks = ",".join("?" * len(chunk))
        for r in conn.execute(f"SELECT rowid, {cols} FROM main.{table} WHERE rowid IN ({marks})", chunk):
            yield r[0], r[1:]
