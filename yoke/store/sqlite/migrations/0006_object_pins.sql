-- Prepare pins an object's schema and an authorization receipt (seed 004;
-- yoke/streams/objects.py).
ALTER TABLE objects ADD COLUMN schema_ref TEXT;
ALTER TABLE objects ADD COLUMN auth_receipt TEXT;
