-- Every failed attempt's error and time, for the failures inbox
-- (docs/failures.md): an actor queue row and a subscription keep the
-- attempts of the event failing now as a JSON array of {number, at, error}
-- (the first 50 attempts; last_error stays the latest). Each failed attempt
-- appends one; the array goes with the queue row (a success deletes it), a
-- subscription's acknowledgement past the event clears it, and a redrive, a
-- resume or a cursor move starts it again. A halt adds its final attempt; a
-- skip moves the array into its audit line (yoke.error).
ALTER TABLE actor_queue ADD COLUMN attempt_errors jsonb;
ALTER TABLE subscriptions ADD COLUMN attempt_errors jsonb;
