-- When a subscription's last error happened (docs/basics/subscriptions.md):
-- ms since the epoch, by the runtime's clock, set with last_error by each
-- failed attempt, a halt and a skip, and kept like last_error when the
-- subscription recovers (so a running subscription still says "it last
-- failed at T"). NULL: no error recorded since this migration.
ALTER TABLE subscriptions ADD COLUMN last_error_at bigint;
