-- The SQL catalogue (yoke/store/catalogue.py, docs/advanced/sql.md): a
-- mirror of every actor instance's tables, which the process running the
-- instance brings up to date after each run (yoke/actors/sql_mirror.py), so
-- that one read-only query sees all instances.

-- Per mirrored instance: the version of its database the mirror holds (its
-- change counter, then its schema's counter; both only grow) and the shapes
-- of its tables as {table: [[column, declared type], ...]}.
CREATE TABLE sql_instances (
    tenant_id   text   NOT NULL,
    instance_id text   NOT NULL,
    version     bigint NOT NULL,
    shapes      jsonb  NOT NULL,
    PRIMARY KEY (tenant_id, instance_id)
);

-- Which instance declared which column of an actor's table: a tenant's
-- queries see the union of its own instances' columns.
CREATE TABLE sql_columns (
    tenant_id   text    NOT NULL,
    actor       text    NOT NULL,
    tbl         text    NOT NULL,
    col         text    NOT NULL,
    instance_id text    NOT NULL,
    declared    text    NOT NULL,
    position    integer NOT NULL,
    PRIMARY KEY (tenant_id, actor, tbl, col, instance_id)
);
CREATE INDEX sql_columns_instance ON sql_columns (tenant_id, instance_id);

-- Moves with every change of a tenant's sql_columns: a process's cached
-- union of them is current while its version matches.
CREATE TABLE sql_catalogue_versions (
    tenant_id text   PRIMARY KEY,
    version   bigint NOT NULL
);

-- The rows: one per instance row (rid: its SQLite row id), its values as a
-- JSON object by column (a BLOB as {"$blob": base64}).
CREATE TABLE sql_rows (
    tenant_id   text   NOT NULL,
    instance_id text   NOT NULL,
    tbl         text   NOT NULL,
    rid         bigint NOT NULL,
    actor       text   NOT NULL,
    key         text   NOT NULL,
    data        jsonb  NOT NULL,
    PRIMARY KEY (tenant_id, instance_id, tbl, rid)
);
CREATE INDEX sql_rows_tables ON sql_rows (tenant_id, actor, tbl, key);

DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['sql_instances', 'sql_columns', 'sql_catalogue_versions', 'sql_rows'] LOOP
        EXECUTE format('ALTER TABLE %I ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('ALTER TABLE %I FORCE ROW LEVEL SECURITY', t);
        EXECUTE format(
            'CREATE POLICY tenant_isolation ON %I'
            ' USING (tenant_id = current_setting(''yoke.tenant'', true))'
            ' WITH CHECK (tenant_id = current_setting(''yoke.tenant'', true))', t);
    END LOOP;
END
$$;

GRANT SELECT, INSERT, UPDATE, DELETE ON sql_instances, sql_columns, sql_catalogue_versions, sql_rows
    TO yoke_runtime;
