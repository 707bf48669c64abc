"""PostgreSQL implementation of the subscription storage contract
(``store.subscriptions``). ``control`` and ``append_copies`` lock the stream
row first (as ``yoke_append`` does), so they serialize with every append to
that stream and never deadlock with one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import asyncpg
import orjson

from ...events import Event, PreparedEvent
from ..actors import attempt_error
from ..results import CommitResult, Outcome, StreamSettings
from ..rows import (
    EVENT_COLUMNS,
    CHECKPOINT_COLUMNS,
    INBOUND_COLUMNS,
    SUBSCRIPTION_COLUMNS,
    SUBSCRIPTION_WITH_HEAD,
    SUBSCRIPTION_WRITE_COLUMNS,
    checkpoint_from_row,
    event_from_row,
    inbound_from_row,
    subscription_from_row,
    subscription_values,
)
from ..subscriptions import (
    CatalogueRecord,
    Change,
    Checkpoint,
    Decide,
    DeliveryOwner,
    InboundRecord,
    Probe,
    SourceState,
    Stamp,
    SubscriptionRow,
    SubscriptionTotals,
    all_accepted,
    fence_refuses,
)
from .actors import APPEND_ATTEMPT, DB_NOW_MS
from .listener import SUBSCRIPTION_CHANNEL as CHANNEL

if TYPE_CHECKING:
    from .appends import PgAppends
    from .connection import PgDb

KEY = "tenant_id=$1 AND path=$2 AND name=$3"
# A control change keeps the catalogue record's row count (when it has one).
CATALOGUE_COUNT = (
    "UPDATE subscription_catalogues SET subscriptions ="
    " (SELECT count(*) FROM subscriptions WHERE tenant_id=$1 AND path=$2) WHERE tenant_id=$1 AND path=$2"
)
STALE_CATALOGUES = """
SELECT s.path FROM streams s
LEFT JOIN subscription_catalogues c ON c.tenant_id = s.tenant_id AND c.path = s.path
WHERE s.tenant_id = $1 AND (
    (c.path IS NULL AND EXISTS (SELECT 1 FROM subscriptions x WHERE x.tenant_id = s.tenant_id AND x.path = s.path))
    OR (c.path IS NOT NULL AND (
        c.reducer <> $2 OR c.stream_id <> s.stream_id OR c.stage IS NOT NULL
        OR c.subscriptions <> (SELECT count(*) FROM subscriptions x
                               WHERE x.tenant_id = s.tenant_id AND x.path = s.path))))
ORDER BY s.path
"""
# The first key of the two-key advisory locks on a copy target (the second is
# a hash of tenant and target); two-key locks never meet single-key ones.
COPIES_INTO_LOCK = 0x5E0C
_PLACES = ", ".join(
    f"${i}::jsonb" if c in ("config", "halted", "attempt_errors") else f"${i}"
    for i, c in enumerate(SUBSCRIPTION_WRITE_COLUMNS, 1)
)
UPSERT = (
    f"INSERT INTO subscriptions ({', '.join(SUBSCRIPTION_WRITE_COLUMNS)}) VALUES ({_PLACES})"
    " ON CONFLICT (tenant_id, path, name) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in SUBSCRIPTION_WRITE_COLUMNS[3:])
)


class _Refused(Exception):
    """Rolls the transaction back; carries what the commit said."""

    def __init__(self, result: CommitResult) -> None:
        self.result = result


class PgSubscriptionStore:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends

    def _tx(self, tenant: str):  # noqa: ANN202 - an async context manager
        return self._db.tx(tenant)

    async def _lock_stream(
        self, conn: asyncpg.Connection, tenant: str, path: str, now: int, new_stream_id: str
    ) -> asyncpg.Record:
        await self._appends.ensure_stream(conn, tenant, path, new_stream_id, now, StreamSettings())
        return await conn.fetchrow(
            "SELECT stream_id, created_at, head FROM streams WHERE tenant_id=$1 AND path=$2"
            " FOR UPDATE",
            tenant, path,
        )

    async def control(
        self, tenant: str, path: str, name: str, decide: Decide, now: int, new_stream_id: str,
        *, copies_into: str | None = None, probe: Probe | None = None,
    ) -> tuple[Change, Sequence[Outcome]]:
        try:
            async with self._tx(tenant) as conn:
                s = await self._lock_stream(conn, tenant, path, now, new_stream_id)
                copies = 0
                if copies_into is not None:
                    # The target may not exist yet (no row to lock): a
                    # transaction-scoped advisory lock on (tenant, target)
                    # serializes the configures into it; taken after the
                    # source row, and held by nothing else, so no deadlock.
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock($1, hashtext($2::text || '|' || $3::text))",
                        COPIES_INTO_LOCK, tenant, copies_into,
                    )
                    copies = await conn.fetchval(
                        "SELECT count(*) FROM subscriptions WHERE tenant_id=$1 AND config->>'target'=$2"
                        " AND NOT (path=$3 AND name=$4)",
                        tenant, copies_into, path, name,
                    )
                probed = probe is not None and await conn.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM events WHERE tenant_id=$1"
                    " AND sid=(SELECT sid FROM streams WHERE tenant_id=$1 AND path=$2)"
                    " AND seq > $3 AND type = ANY($4::text[]) AND payload->>$5 = $6)",
                    tenant, path, probe.after, list(probe.types), probe.field, probe.value,
                )
                source = SourceState(s["stream_id"], s["created_at"], s["head"], copies, bool(probed), now)
                # Locks in one order everywhere: stream row, subscription row,
                # checkpoint (ack takes the last two in the same order).
                found = await conn.fetchrow(
                    f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE {KEY} FOR UPDATE",
                    tenant, path, name,
                )
                current = None if found is None else subscription_from_row(found, s["head"])
                change = decide(current, source)
                outcomes: list[Outcome] = []
                if change.events:
                    result = await self._appends.commit_batch(
                        conn, tenant, path, change.events, now, new_stream_id,
                        kernel=change.bookkeeping,
                    )
                    outcomes = result.outcomes
                    if not all_accepted(outcomes):
                        raise _Refused(result)
                if change.delete:
                    await conn.execute(f"DELETE FROM subscriptions WHERE {KEY}", tenant, path, name)
                elif change.row is not None:
                    if found is None:
                        await conn.execute(
                            "INSERT INTO subscription_tenants VALUES ($1) ON CONFLICT DO NOTHING", tenant
                        )
                    await conn.execute(UPSERT, *subscription_values(change.row))
                if change.drop_checkpoint:
                    await conn.execute(
                        f"DELETE FROM processor_checkpoints WHERE {KEY}",
                        tenant, path, change.row.name if change.row else name,
                    )
                if change.delete or change.row is not None:
                    await conn.execute(CATALOGUE_COUNT, tenant, path)
                    # Delivering processes look again (at commit).
                    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{tenant}|{path}")
                return change, outcomes
        except _Refused as refused:
            return Change(), refused.result.outcomes

    async def get(self, tenant: str, path: str, name: str) -> SubscriptionRow | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=$1 AND s.path=$2 AND s.name=$3",
                tenant, path, name,
            )
        return None if row is None else subscription_from_row(row[:-1], row[-1])

    async def totals(self, tenant: str, limit: int) -> tuple[SubscriptionTotals, list[SubscriptionRow]]:
        async with self._tx(tenant) as conn:
            counted = await conn.fetchrow(
                "SELECT count(*), coalesce(sum(CASE WHEN s.halted IS NULL THEN 0 ELSE 1 END), 0)::bigint,"
                " coalesce(sum(CASE WHEN coalesce(t.head, 0) > s.processed_through_offset"
                " THEN coalesce(t.head, 0) - s.processed_through_offset ELSE 0 END), 0)::bigint"
                " FROM subscriptions s LEFT JOIN streams t ON t.tenant_id = s.tenant_id AND t.path = s.path"
                " WHERE s.tenant_id=$1",
                tenant,
            )
            rows = await conn.fetch(
                f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=$1"
                " ORDER BY s.halted IS NULL, coalesce(t.head, 0) - s.processed_through_offset DESC, s.path, s.name"
                " LIMIT $2",
                tenant, limit,
            )
        return SubscriptionTotals(*counted), [subscription_from_row(r[:-1], r[-1]) for r in rows]

    async def list(self, tenant: str, path: str) -> list[SubscriptionRow]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=$1 AND s.path=$2 ORDER BY s.name",
                tenant, path,
            )
        return [subscription_from_row(r[:-1], r[-1]) for r in rows]

    # --- leases -------------------------------------------------------------

    async def register_owner(self, owner: DeliveryOwner, lease_ms: int) -> None:
        await self._db.beat(
            f"WITH joined AS (INSERT INTO delivery_owners VALUES ($1, {DB_NOW_MS}, {DB_NOW_MS}, $2, $3::jsonb)"
            " ON CONFLICT (owner) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
            " lease_ms = excluded.lease_ms, info = excluded.info RETURNING 1)"
            f" SELECT pg_notify('{CHANNEL}', '') FROM joined",
            owner.owner, lease_ms, orjson.dumps(owner.info()).decode(), method="fetch",
        )

    async def beat_owner(self, owner: str) -> bool:
        done = await self._db.beat(
            f"UPDATE delivery_owners SET heartbeat_at = {DB_NOW_MS} WHERE owner = $1", owner
        )
        return done == "UPDATE 1"

    async def reap_owners(self, by: str) -> list[DeliveryOwner]:
        rows = await self._db.beat(
            "WITH gone AS (DELETE FROM delivery_owners WHERE owner <> $1"
            f" AND heartbeat_at + lease_ms < {DB_NOW_MS} RETURNING owner, info)"
            f" SELECT owner, info, pg_notify('{CHANNEL}', '') FROM gone",
            by, method="fetch",
        )
        return [DeliveryOwner.of(r[0], orjson.loads(r[1])) for r in rows]

    async def owners(self) -> list[DeliveryOwner]:
        rows = await self._db.beat("SELECT owner, info FROM delivery_owners ORDER BY owner", method="fetch")
        return [DeliveryOwner.of(r[0], orjson.loads(r[1])) for r in rows]

    async def drop_owner(self, owner: str) -> None:
        await self._db.beat(
            "WITH gone AS (DELETE FROM delivery_owners WHERE owner = $1 RETURNING 1)"
            f" SELECT pg_notify('{CHANNEL}', '') FROM gone",
            owner, method="fetch",
        )

    async def tenants(self) -> list[str]:
        return [r[0] for r in await self._db.fetch("SELECT tenant_id FROM subscription_tenants")]

    async def leases(self, tenant: str, paths: Sequence[str] | None = None) -> list[SubscriptionRow]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=$1 AND ($2::text[] IS NULL OR s.path = ANY($2))",
                tenant, None if paths is None else list(paths),
            )
        return [subscription_from_row(r[:-1], r[-1]) for r in rows]

    async def take(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> list[SubscriptionRow]:
        async with self._tx(tenant) as conn:
            # Rows are locked in (path, name) order, as a catalogue rebuild
            # locks a stream's rows (by name): an UPDATE alone locks in heap
            # order, and the two deadlocked.
            rows = await conn.fetch(
                "UPDATE subscriptions SET lease_owner=$2"
                " WHERE tenant_id=$1 AND (path, name) IN (SELECT path, name FROM subscriptions"
                " WHERE tenant_id=$1 AND (path, name) IN (SELECT * FROM unnest($3::text[], $4::text[]))"
                " AND (lease_owner IS NULL OR lease_owner=$2"
                "  OR lease_owner NOT IN (SELECT owner FROM delivery_owners))"
                " ORDER BY path, name FOR UPDATE)"
                f" RETURNING {SUBSCRIPTION_COLUMNS}",
                tenant, owner, [k[0] for k in keys], [k[1] for k in keys],
            )
        return [subscription_from_row(r) for r in rows]

    async def give(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> None:
        async with self._tx(tenant) as conn:
            await conn.execute(
                "UPDATE subscriptions SET lease_owner=NULL"
                " WHERE tenant_id=$1 AND (path, name) IN (SELECT path, name FROM subscriptions"
                " WHERE tenant_id=$1 AND lease_owner=$2"
                " AND (path, name) IN (SELECT * FROM unnest($3::text[], $4::text[]))"
                " ORDER BY path, name FOR UPDATE)",
                tenant, owner, [k[0] for k in keys], [k[1] for k in keys],
            )
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, tenant)

    async def ack(
        self, tenant: str, path: str, name: str, generation: int, through: int, delivered: int,
        now: int, checkpoint: Checkpoint | None = None, *, keep_attempts: bool = False,
        stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                "UPDATE subscriptions SET processed_through_offset ="
                " greatest(processed_through_offset, $5),"
                " attempts=CASE WHEN $7 THEN attempts ELSE 0 END,"
                " skips=CASE WHEN $7 THEN skips ELSE 0 END, next_retry_at=0,"
                " attempt_errors=CASE WHEN $7 THEN attempt_errors END,"
                " gave_up=CASE WHEN $6 > 0 AND NOT $7 THEN NULL ELSE gave_up END,"
                f" delivered=delivered+$6 WHERE {KEY} AND generation=$4"
                " AND ($8::text IS NULL OR source_stream_id = $8)"
                f" RETURNING {SUBSCRIPTION_COLUMNS}",
                tenant, path, name, generation, through, delivered, keep_attempts, stream_id,
            )
            if row is not None and checkpoint is not None:
                await self._save_checkpoint(conn, checkpoint, now)
        return None if row is None else subscription_from_row(row)

    async def fail(
        self, tenant: str, path: str, name: str, generation: int, attempts: int, error: str,
        next_retry_at: int, *, stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        now = self._db.now_ms()
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                "UPDATE subscriptions SET attempts=$5, last_error=$6, last_error_at=$10, next_retry_at=$7,"
                f" failures=failures+1, attempt_errors={APPEND_ATTEMPT.format('$9')} WHERE {KEY} AND generation=$4"
                " AND ($8::text IS NULL OR source_stream_id = $8)"
                f" RETURNING {SUBSCRIPTION_COLUMNS}",
                tenant, path, name, generation, attempts, error, next_retry_at, stream_id,
                attempt_error(attempts, now, error), now,
            )
        return None if row is None else subscription_from_row(row)

    async def events_of_types(
        self, tenant: str, path: str, types: Sequence[str], after: int, limit: int
    ) -> list[Event]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE tenant_id=$1"
                " AND sid=(SELECT sid FROM streams WHERE tenant_id=$1 AND path=$2)"
                " AND seq > $3 AND type = ANY($4::text[]) ORDER BY seq LIMIT $5",
                tenant, path, after, list(types), limit,
            )
        return [event_from_row(tenant, path, r) for r in rows]

    async def append_copies(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], stamp: Stamp, now: int,
        new_stream_id: str,
    ) -> CommitResult | None:
        try:
            async with self._tx(tenant) as conn:
                await self._lock_stream(conn, tenant, path, now, new_stream_id)
                record = await conn.fetchrow(
                    "SELECT source_stream_id, source_created_at, generation FROM subscription_inbound"
                    " WHERE tenant_id=$1 AND path=$2 AND source_path=$3 AND name=$4",
                    tenant, path, stamp.source_path, stamp.name,
                )
                if record is not None and fence_refuses(tuple(record), stamp):
                    return None
                result = await self._appends.commit_batch(conn, tenant, path, events, now, new_stream_id)
                if not all_accepted(result.outcomes):
                    raise _Refused(result)  # roll back: the single batch was refused
                fresh = sum(1 for o in result.outcomes if o.status == "ok")
                await conn.execute(
                    "INSERT INTO subscription_inbound (tenant_id, path, source_path, name,"
                    " source_stream_id, source_created_at, generation, received, last_received_at)"
                    " VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9)"
                    " ON CONFLICT (tenant_id, path, source_path, name)"
                    " DO UPDATE SET source_stream_id=excluded.source_stream_id,"
                    " source_created_at=excluded.source_created_at, generation=excluded.generation,"
                    " received=subscription_inbound.received+excluded.received,"
                    " last_received_at=excluded.last_received_at",
                    tenant, path, stamp.source_path, stamp.name, stamp.source_stream_id,
                    stamp.source_created_at, stamp.generation, fresh, now,
                )
                return result
        except _Refused as refused:
            return refused.result

    async def inbound(self, tenant: str, path: str) -> list[InboundRecord]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {INBOUND_COLUMNS} FROM subscription_inbound WHERE tenant_id=$1 AND path=$2"
                " ORDER BY source_path, name",
                tenant, path,
            )
        return [inbound_from_row(r) for r in rows]

    async def checkpoint(self, tenant: str, path: str, name: str) -> Checkpoint | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {CHECKPOINT_COLUMNS} FROM processor_checkpoints WHERE {KEY}",
                tenant, path, name,
            )
        return None if row is None else checkpoint_from_row(row)

    async def save_checkpoint(self, checkpoint: Checkpoint, now: int) -> bool:
        c = checkpoint
        async with self._tx(c.tenant) as conn:
            current = await conn.fetchval(
                f"SELECT 1 FROM subscriptions WHERE {KEY} AND generation=$4 FOR UPDATE",
                c.tenant, c.path, c.name, c.generation,
            )
            if current is None:
                return False
            await self._save_checkpoint(conn, c, now)
            return True

    @staticmethod
    async def _save_checkpoint(conn: asyncpg.Connection, c: Checkpoint, now: int) -> None:
        await conn.execute(
            "INSERT INTO processor_checkpoints (tenant_id, path, name, version, stream_id,"
            " generation, through, state, complete, updated_at)"
            " VALUES ($1,$2,$3,$4,$5,$6,$7,$8::json,$9,$10)"
            " ON CONFLICT (tenant_id, path, name) DO UPDATE SET version=excluded.version,"
            " stream_id=excluded.stream_id, generation=excluded.generation,"
            " through=excluded.through, state=excluded.state, complete=excluded.complete,"
            " updated_at=excluded.updated_at",
            c.tenant, c.path, c.name, c.version, c.stream_id, c.generation, c.through,
            orjson.dumps(c.state).decode(), c.complete, now,
        )

    async def write_catalogue(
        self, tenant: str, path: str, head: int,
        merge: Callable[[list[SubscriptionRow]], list[SubscriptionRow]],
        *, reducer: str = "", stream_id: str = "", now: int = 0,
    ) -> bool:
        async with self._tx(tenant) as conn:
            locked = await conn.fetchrow(
                "SELECT head, stream_id FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if locked is None or locked["head"] != head or (stream_id and locked["stream_id"] != stream_id):
                return False
            current = [
                subscription_from_row(r, head) for r in await conn.fetch(
                    f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE tenant_id=$1 AND path=$2"
                    " ORDER BY name FOR UPDATE",
                    tenant, path,
                )
            ]
            rows = merge(current)
            await conn.execute(
                "DELETE FROM subscriptions WHERE tenant_id=$1 AND path=$2 AND NOT name = ANY($3)",
                tenant, path, [r.name for r in rows],
            )
            await conn.executemany(UPSERT, [subscription_values(r) for r in rows])
            if reducer:
                await conn.execute(
                    "INSERT INTO subscription_catalogues (tenant_id, path, stream_id, reducer,"
                    " subscriptions, stage, updated_at) VALUES ($1,$2,$3,$4,$5,NULL,$6)"
                    " ON CONFLICT (tenant_id, path) DO UPDATE SET stream_id=excluded.stream_id,"
                    " reducer=excluded.reducer, subscriptions=excluded.subscriptions, stage=NULL,"
                    " updated_at=excluded.updated_at",
                    tenant, path, locked["stream_id"], reducer, len(rows), now,
                )
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, f"{tenant}|{path}")
            return True

    async def stale_catalogues(self, tenant: str, reducer: str) -> list[str]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(STALE_CATALOGUES, tenant, reducer)
        return [r[0] for r in rows]

    async def catalogue(self, tenant: str, path: str) -> CatalogueRecord | None:
        async with self._tx(tenant) as conn:
            r = await conn.fetchrow(
                "SELECT path, stream_id, reducer, subscriptions, stage::text FROM subscription_catalogues"
                " WHERE tenant_id=$1 AND path=$2",
                tenant, path,
            )
        if r is None:
            return None
        return CatalogueRecord(r[0], r[1], r[2], r[3], orjson.loads(r[4]) if r[4] is not None else None)

    async def save_catalogue_stage(
        self, tenant: str, path: str, stream_id: str, reducer: str, stage: dict[str, Any], now: int
    ) -> bool:
        async with self._tx(tenant) as conn:
            current = await conn.fetchval(
                "SELECT stream_id FROM streams WHERE tenant_id=$1 AND path=$2 FOR UPDATE", tenant, path
            )
            if current != stream_id:
                return False
            await conn.execute(
                "INSERT INTO subscription_catalogues (tenant_id, path, stream_id, reducer, subscriptions,"
                " stage, updated_at) VALUES ($1,$2,$3,$4,-1,$5::jsonb,$6) ON CONFLICT (tenant_id, path)"
                " DO UPDATE SET stream_id=excluded.stream_id, reducer=excluded.reducer,"
                " stage=excluded.stage, updated_at=excluded.updated_at",
                tenant, path, stream_id, reducer, orjson.dumps(stage).decode(), now,
            )
            return True
