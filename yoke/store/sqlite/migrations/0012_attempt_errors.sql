-- Every failed attempt's error and time, for the failures inbox
-- (docs/failures.md). The PostgreSQL schema
-- (store/postgres/migrations/0018_attempt_errors.sql) explains the columns.
ALTER TABLE actor_queue ADD COLUMN attempt_errors TEXT;
ALTER TABLE subscriptions ADD COLUMN attempt_errors TEXT;
