"""Checking a catalogue query and placing its tables (store/catalogue_query.py)."""

from __future__ import annotations

import pytest

from yoke.store.catalogue_query import SqlRefused, plan

REPLACE = {("order", "lines"): "(L)", ("yoke", "instances"): "(I)", ("yoke", "events"): "(E)"}


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_tables_are_replaced_in_place_and_keep_their_names(dialect: str) -> None:
    checked = plan('SELECT lines.sku, i.key FROM "order".lines JOIN yoke.instances i USING (instance_id)', dialect)
    assert checked.render(REPLACE) == 'SELECT lines.sku, i.key FROM (L) AS "lines" JOIN (I) i USING (instance_id)'


def test_a_three_part_column_loses_its_schema() -> None:
    checked = plan('SELECT "order".lines.sku FROM "order".lines', "sqlite")
    assert checked.render(REPLACE) == 'SELECT lines.sku FROM (L) AS "lines"'


def test_question_marks_are_numbered_for_postgres() -> None:
    checked = plan('SELECT * FROM "order".lines WHERE key = ? AND sku = ?', "postgres")
    assert checked.render(REPLACE, "${n}") == 'SELECT * FROM (L) AS "lines" WHERE key = $1 AND sku = $2'
    # With numbered parameters, a ? is jsonb's operator.
    assert plan("SELECT * FROM \"order\".lines WHERE key = $1 AND data ? 'x'", "postgres").numbered


def test_ctes_are_the_query_s_own_tables() -> None:
    checked = plan('WITH t AS (SELECT * FROM "order".lines) SELECT * FROM t', "sqlite")
    assert checked.relations == {("order", "lines")}
    recursive = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT * FROM n"
    assert plan(recursive, "postgres").relations == set()
    assert plan("WITH a AS (SELECT 1 x), b AS (SELECT * FROM a) SELECT * FROM b x", "sqlite").relations == set()


@pytest.mark.parametrize(("sql", "code"), [
    ("", "invalid_input"),
    ("SELECT 1; SELECT 2", "sql_one_statement"),
    ("INSERT INTO x.y VALUES (1)", "sql_read_only"),
    ("WITH d AS (DELETE FROM x.y RETURNING *) SELECT * FROM d", "sql_read_only"),
    ("SELECT * FROM lines", "sql_unknown_table"),
    ("SELECT * FROM a.b.c", "sql_unknown_table"),
    ("SELECT * FROM yoke.tokens", "sql_unknown_table"),
    ("SELECT * FROM yoke.events", "sql_events_unbounded"),
    ("SELECT * FROM yoke.events e JOIN yoke.streams s ON s.path = e.path", "sql_events_unbounded"),
    ("SELECT pg_sleep(10)", "sql_function_refused"),
    ("SELECT current_setting('yoke.tenant')", "sql_function_refused"),
    ("SELECT * FROM pg_ls_dir('.')", "sql_function_refused"),
    ("SELECT (", "sql_syntax"),
    # A CTE's name is the CTE only where SQL's scoping sees it.
    ("WITH yoke_tenants AS (SELECT * FROM yoke_tenants) SELECT * FROM yoke_tenants", "sql_unknown_table"),
    ("SELECT (SELECT count(*) FROM tokens), (WITH tokens AS (SELECT 1) SELECT 1)", "sql_unknown_table"),
    ("SELECT * FROM (WITH t AS (SELECT 1 x) SELECT * FROM t) s, t", "sql_unknown_table"),
    ("SELECT * FROM yoke.events WHERE path = '/a' OR 1 = 1", "sql_events_unbounded"),
    ("SELECT * FROM yoke.events WHERE NOT path = '/a'", "sql_events_unbounded"),
    ("SELECT version()", "sql_function_refused"),
    ("SELECT \"query_to_xml\"('SELECT 1', true, false, '')", "sql_function_refused"),
    ("SELECT \"set_config\"('yoke.tenant', 'other', true)", "sql_function_refused"),
    ("SELECT * FROM yoke.events WHERE path IN ('/nope', path)", "sql_events_unbounded"),
    ("SELECT 1 /*" + "x" * 40_000 + "*/", "sql_too_long"),
])
def test_refusals(sql: str, code: str) -> None:
    with pytest.raises(Exception) as caught:
        plan(sql, "postgres")
    assert getattr(caught.value, "code", None) == code


def test_events_of_a_named_stream() -> None:
    assert plan("SELECT * FROM yoke.events WHERE path = '/a' AND \"offset\" > 3", "sqlite").relations == {("yoke", "events")}
    assert plan("SELECT * FROM yoke.events e WHERE e.path IN ('/a', '/b')", "sqlite").relations == {("yoke", "events")}
