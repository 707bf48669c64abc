"""Noting an instance database's changed rows (actors/state_capture.py)."""

from __future__ import annotations

import sqlite3

from yoke.actors.state_capture import Capture
from yoke.store.catalogue import InstanceRows, TableRows


def database() -> tuple[sqlite3.Connection, Capture]:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE items (sku TEXT, qty INTEGER)")
    capture = Capture("inst_1")
    capture.attach(conn)
    return conn, capture


def test_first_collect_sends_every_table_then_only_changes() -> None:
    conn, capture = database()
    conn.execute("INSERT INTO items VALUES ('tea', 1), ('cup', 2)")
    first = capture.collect(conn, whole=False)
    assert first is not None and first.shapes is not None
    assert first.tables["items"].whole and first.tables["items"].upserts == {1: ("tea", 1), 2: ("cup", 2)}
    conn.execute("UPDATE items SET qty = 5 WHERE sku = 'tea'")
    conn.execute("DELETE FROM items WHERE sku = 'cup'")
    second = capture.collect(conn, whole=False)
    assert second is not None and second.shapes is None and second.version > first.version
    assert second.tables == {"items": TableRows(("sku", "qty"), {1: ("tea", 5)}, {2})}
    assert capture.collect(conn, whole=False) is None  # nothing since


def test_a_rolled_back_change_reads_as_the_row_is() -> None:
    conn, capture = database()
    conn.execute("INSERT INTO items VALUES ('tea', 1)")
    capture.collect(conn, whole=False)
    version = capture.collect(conn, whole=True).version
    conn.execute("BEGIN")
    conn.execute("UPDATE items SET qty = 9")
    conn.execute("ROLLBACK")
    rows = capture.collect(conn, whole=False)
    assert rows.tables["items"].upserts == {1: ("tea", 1)} and rows.version == version


def test_an_open_transaction_is_not_collected() -> None:
    conn, capture = database()
    capture.collect(conn, whole=False)
    conn.execute("BEGIN")
    conn.execute("INSERT INTO items VALUES ('tea', 1)")
    assert capture.collect(conn, whole=False) is None
    conn.execute("COMMIT")
    assert capture.collect(conn, whole=False).tables["items"].upserts == {1: ("tea", 1)}


def test_schema_changes_resend_the_table_and_name_the_tables() -> None:
    conn, capture = database()
    conn.execute("INSERT INTO items VALUES ('tea', 1)")
    capture.collect(conn, whole=False)
    conn.execute("ALTER TABLE items ADD COLUMN note TEXT DEFAULT 'x'")
    conn.execute("CREATE TABLE tags (tag TEXT PRIMARY KEY) WITHOUT ROWID")
    conn.execute("INSERT INTO tags VALUES ('a')")
    rows = capture.collect(conn, whole=False)
    assert set(rows.shapes) == {"items", "tags"}
    assert rows.tables["items"] == TableRows(("sku", "qty", "note"), {1: ("tea", 1, "x")}, whole=True)
    assert rows.tables["tags"].whole and list(rows.tables["tags"].upserts.values()) == [("a",)]
    conn.execute("INSERT INTO tags VALUES ('b')")  # no row ids: the table goes whole
    again = capture.collect(conn, whole=False)
    assert again.tables["tags"].whole and sorted(again.tables["tags"].upserts.values()) == [("a",), ("b",)]
    conn.execute("DROP TABLE tags")
    dropped = capture.collect(conn, whole=False)
    assert "tags" not in dropped.shapes and "tags" not in dropped.tables


def test_the_state_table_is_yoke_state_and_kernel_tables_are_left_out() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE _yoke_state (id INTEGER PRIMARY KEY CHECK (id = 1), value TEXT NOT NULL, version INTEGER NOT NULL)")
    conn.execute("CREATE TABLE _yoke_applied (qid INTEGER PRIMARY KEY, effects TEXT NOT NULL, at INTEGER NOT NULL)")
    capture = Capture("inst_1")
    capture.attach(conn)
    conn.execute("INSERT INTO _yoke_state VALUES (1, '{\"n\":1}', 1)")
    rows = capture.collect(conn, whole=False)
    assert set(rows.shapes) == {"yoke_state"}
    assert rows.tables["yoke_state"].columns == ("value", "version")
    assert rows.tables["yoke_state"].upserts == {1: ('{"n":1}', 1)}


def test_a_closing_connection_stashes_its_notes() -> None:
    conn, capture = database()
    capture.collect(conn, whole=False)
    conn.execute("INSERT INTO items VALUES ('tea', 1)")
    capture.close(conn)
    conn.close()
    assert capture.pending
    stashed = capture.collect(None, whole=False)
    assert stashed.tables["items"].upserts == {1: ("tea", 1)}
    assert not capture.pending


def test_merging_writes_keeps_the_later_rows() -> None:
    cols = ("sku", "qty")
    first = InstanceRows("i", 1, {"items": TableRows(cols, {1: ("a", 1), 2: ("b", 1)}, {3})})
    later = InstanceRows("i", 2, {"items": TableRows(cols, {3: ("c", 1)}, {1})})
    merged = first.merge(later)
    assert merged.version == 2
    assert merged.tables["items"] == TableRows(cols, {2: ("b", 1), 3: ("c", 1)}, {1})
    assert first.merge(InstanceRows("i", 3, {}, whole=True)).whole
