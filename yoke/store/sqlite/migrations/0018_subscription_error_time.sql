-- When a subscription's last error happened (docs/basics/subscriptions.md).
-- The PostgreSQL schema
-- (store/postgres/migrations/0027_subscription_error_time.sql) explains the column.
ALTER TABLE subscriptions ADD COLUMN last_error_at INTEGER;
