-- Prepare pins an object's schema and an authorization receipt (seed 004,
-- "Input and large-object recovery"; yoke/streams/objects.py): who
-- prepared it, with which scopes, when, and the digest of what was pinned.
ALTER TABLE objects ADD COLUMN schema_ref text, ADD COLUMN auth_receipt json;
