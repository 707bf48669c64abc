-- Where the instances' state databases live (yoke/actors/state_home.py):
-- one row, recorded by the first executor that runs on this database. Its
-- storage (file, pg_sqlite, s3) and location (for file storage, the id of
-- the data directory's actors/ folder; for s3, the bucket and prefix); a
-- process whose state would live elsewhere refuses to run actors, and its
-- API answers state_elsewhere, rather than run or read on an empty database.
-- The runtime only records and reads it; an operator who means to move the
-- state for good deletes the row (as the owner).
CREATE TABLE actor_state_home (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    storage     text    NOT NULL,
    location    text    NOT NULL,
    label       text    NOT NULL,
    recorded_at bigint  NOT NULL
);

GRANT SELECT, INSERT ON actor_state_home TO yoke_runtime;
