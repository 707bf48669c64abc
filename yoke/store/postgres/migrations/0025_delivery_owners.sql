-- Delivering processes (yoke/subscriptions/engine.py, leases.py): one row
-- each, heartbeat on the database's clock. A process holds the
-- subscriptions whose lease_owner it is while its row lives: one heartbeat
-- renews them all (subscriptions.lease_until is no longer written). A row
-- silent for longer than its lease_ms is reaped by the other processes, and
-- its subscriptions are free. info: what it can deliver (deploy version,
-- call functions, processors), host and pid.
CREATE TABLE delivery_owners (
    owner        text   PRIMARY KEY,
    started_at   bigint NOT NULL,
    heartbeat_at bigint NOT NULL,
    lease_ms     bigint NOT NULL,
    info         jsonb  NOT NULL DEFAULT '{}'
);

GRANT SELECT, INSERT, UPDATE, DELETE ON delivery_owners TO yoke_runtime;
