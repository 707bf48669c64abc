-- The SQL catalogue's mirror of actor instances' tables (yoke/store/catalogue.py,
-- docs/advanced/sql.md). The PostgreSQL schema (store/postgres/migrations/
-- 0032_sql_catalogue.sql) explains each table.
CREATE TABLE sql_instances (
    tenant_id   TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    version     INTEGER NOT NULL,
    shapes      TEXT    NOT NULL,
    PRIMARY KEY (tenant_id, instance_id)
) WITHOUT ROWID;

CREATE TABLE sql_columns (
    tenant_id   TEXT    NOT NULL,
    actor       TEXT    NOT NULL,
    tbl         TEXT    NOT NULL,
    col         TEXT    NOT NULL,
    instance_id TEXT    NOT NULL,
    declared    TEXT    NOT NULL,
    position    INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, actor, tbl, col, instance_id)
) WITHOUT ROWID;
CREATE INDEX sql_columns_instance ON sql_columns (tenant_id, instance_id);

CREATE TABLE sql_catalogue_versions (
    tenant_id TEXT    PRIMARY KEY,
    version   INTEGER NOT NULL
) WITHOUT ROWID;

-- SQLite only: the rows of actor table (actor, tbl), of every tenant, are
-- in table `physical` (sql_rows_N: tenant_id, instance_id, rid, key, then a
-- column "u:<name>" per column any instance declared, without a type, so
-- each value keeps the type its instance stored it with).
CREATE TABLE sql_row_tables (
    actor    TEXT NOT NULL,
    tbl      TEXT NOT NULL,
    physical TEXT NOT NULL UNIQUE,
    PRIMARY KEY (actor, tbl)
) WITHOUT ROWID;
