-- Where the instances' state databases live (yoke/actors/state_home.py):
-- one row, recorded by the first executor on this database; a process whose
-- state would live elsewhere refuses to run actors (see the PostgreSQL
-- migration 0024_actor_state_home.sql).
CREATE TABLE actor_state_home (
    one         INTEGER PRIMARY KEY CHECK (one = 1),
    storage     TEXT    NOT NULL,
    location    TEXT    NOT NULL,
    label       TEXT    NOT NULL,
    recorded_at INTEGER NOT NULL
);
