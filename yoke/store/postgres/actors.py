"""PostgreSQL implementation of the actor storage contract (``store.actors``).

Every tenant-scoped query runs in a transaction with ``yoke.tenant`` set, so
row-level security applies; ``runtime_workers`` alone is tenant-free.
Enqueues NOTIFY ``yoke_queue`` with the tenant name (delivered at commit),
which wakes the owning worker's scheduler in any process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import asyncpg
import orjson

from ...events import PreparedEvent
from ..actors import (
    Agenda,
    DRAINING,
    MAX_ATTEMPT_ERRORS,
    Effect,
    FanoutLag,
    InstanceInfo,
    Message,
    Policy,
    QueueDepth,
    QueueItem,
    QueueRow,
    Reaped,
    RunCommit,
    RunUndone,
    Schedule,
    StateHome,
    attempt_error,
    message_from_record,
    message_record,
    new_instance_id,
)
from ..inputs import Completion, completions
from ..results import Outcome
from ..rows import (
    INSTANCE_COLUMNS,
    MESSAGE_COLUMNS,
    QUEUE_COLUMNS,
    SCHEDULE_COLUMNS,
    instance_from_row,
    message_from_row,
    queue_row_from_row,
    schedule_from_row,
)

from . import inputs
from .catalogue import forget_instance
from .listener import QUEUE_CHANNEL

if TYPE_CHECKING:
    from .appends import PgAppends
    from .connection import PgDb

# Now in milliseconds by the database server's clock: heartbeats and reaps
# of every process compare times from this one clock.
DB_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"


# Completing finished rows (kept as inputs) and claiming the next ones is one
# round trip: the yoke_complete_and_claim function
# (functions/yoke_complete_and_claim.sql), whose claim (yoke_claim_in_turns)
# begins after the group where this worker's last pass stopped and returns,
# with each row it claimed, the group the next pass begins after.
CLAIM = (
    "SELECT * FROM yoke_complete_and_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,"
    " $17)"
)
# The first key of the two-key advisory lock on a worker's claims (the second
# is a hash of its id): shared by the claims, exclusive in release_excess.
CLAIM_LOCK = 24065
# An instance's database image written (pg_sqlite storage): on its own, or in
# an atomic run's transaction, whose tenant the function checks it is in.
SAVE_STATE = "SELECT yoke_save_state($1, $2, $3, $4)"

ENQUEUE = """
INSERT INTO actor_queue (tenant_id, instance_id, group_key, priority, path, seq, event,
                         available_at, enqueued_at)
SELECT $1, t.instance_id, t.group_key, t.priority, t.path, t.seq, t.event::json,
       greatest(t.available_at, $2), $2
FROM unnest($3::text[], $4::text[], $5::int[], $6::text[], $7::bigint[], $8::text[], $9::bigint[])
     AS t(instance_id, group_key, priority, path, seq, event, available_at)
"""


async def _recorded(conn: asyncpg.Connection, tenant: str, effect: Effect | None) -> Any:
    """The journaled result of ``effect`` (None: not performed yet)."""
    if effect is None:
        return None
    text = await conn.fetchval(
        "SELECT result FROM actor_effects WHERE tenant_id=$1 AND qid=$2 AND digest=$3 AND occurrence=$4",
        tenant, effect.qid, effect.digest, effect.occurrence,
    )
    return None if text is None else orjson.loads(text)


async def _record(conn: asyncpg.Connection, tenant: str, effect: Effect | None, result: Any) -> None:
    if effect is not None:
        await conn.execute(
            "INSERT INTO actor_effects VALUES ($1, $2, $3, $4, $5::json)",
            tenant, effect.qid, effect.digest, effect.occurrence, orjson.dumps(result).decode(),
        )


# Append one failed attempt ({number, at, error}: the parameter, its number
# given by format) to an attempt_errors array, up to MAX_ATTEMPT_ERRORS
# (docs/advanced/failures.md).
APPEND_ATTEMPT = (
    "CASE WHEN jsonb_array_length(coalesce(attempt_errors, '[]'::jsonb)) < " + str(MAX_ATTEMPT_ERRORS) +
    " THEN coalesce(attempt_errors, '[]'::jsonb) || jsonb_build_array({0}::jsonb) ELSE attempt_errors END"
)


class PgActorStore:
    def __init__(self, db: PgDb, appends: PgAppends) -> None:
        self._db = db
        self._appends = appends
        # Where the next claim pass of (tenant, worker, shard) begins: the
        # queued groups take turns (yoke_claim_in_turns).
        self._claim_from: dict[tuple[str, str, tuple[int, int]], tuple[str, str]] = {}

    def _tx(self, tenant: str):  # noqa: ANN202 - an async context manager
        return self._db.tx(tenant)

    # --- instances -----------------------------------------------------------

    async def create_instance(
        self, instance: InstanceInfo, effect: Effect | None = None
    ) -> tuple[InstanceInfo, bool]:
        t = instance.tenant
        async with self._tx(t) as conn:
            recorded = await _recorded(conn, t, effect)
            if recorded is not None:
                return InstanceInfo(**recorded), False
            row = await self._insert_instance(conn, instance)
            created = row is not None
            if row is None:
                row = await conn.fetchrow(
                    f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                    " WHERE tenant_id=$1 AND actor=$2 AND key=$3",
                    t, instance.actor, instance.key,
                )
            info = instance_from_row(row)
            await _record(conn, t, effect, dataclasses.asdict(info))
        return info, created

    async def remove_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        async with self._tx(tenant) as conn:
            # The delete's trigger appends yoke.instance.removed to '/'.
            row = await conn.fetchrow(
                f"DELETE FROM actor_instances WHERE tenant_id=$1 AND instance_id=$2 RETURNING {INSTANCE_COLUMNS}",
                tenant, instance_id,
            )
            if row is None:
                return None
            for table in ("actor_queue", "actor_schedules", "actor_sqlite", "actor_inputs"):
                await conn.execute(f"DELETE FROM {table} WHERE tenant_id=$1 AND instance_id=$2", tenant, instance_id)
            await forget_instance(conn, tenant, instance_id)
            if row["filter"] is not None:
                await conn.execute(
                    "INSERT INTO routing_versions VALUES ($1, 1) ON CONFLICT (tenant_id)"
                    " DO UPDATE SET version = routing_versions.version + 1",
                    tenant,
                )
        return instance_from_row(row)

    @staticmethod
    async def _insert_instance(conn: asyncpg.Connection, i: InstanceInfo) -> Any:
        await conn.execute(
            "INSERT INTO yoke_tenants VALUES ($1, $2) ON CONFLICT DO NOTHING", i.tenant, i.created_at
        )
        row = await conn.fetchrow(
            "INSERT INTO actor_instances (tenant_id, instance_id, actor, key, config, filter,"
            " parent_id, worker_id, created_at) VALUES ($1,$2,$3,$4,$5::json,$6::jsonb,$7,$8,$9)"
            f" ON CONFLICT (tenant_id, actor, key) DO NOTHING RETURNING {INSTANCE_COLUMNS}",
            i.tenant, i.instance_id, i.actor, i.key, orjson.dumps(i.config).decode(),
            None if i.filter is None else orjson.dumps(i.filter).decode(),
            i.parent_id, i.worker_id, i.created_at,
        )
        if row is not None and i.filter is not None:
            await conn.execute(
                "INSERT INTO routing_versions VALUES ($1, 1) ON CONFLICT (tenant_id)"
                " DO UPDATE SET version = routing_versions.version + 1",
                i.tenant,
            )
        return row

    async def get_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=$1 AND instance_id=$2",
                tenant, instance_id,
            )
        return None if row is None else instance_from_row(row)

    async def get_instances(self, tenant: str, instance_ids: Sequence[str]) -> list[InstanceInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                " WHERE tenant_id=$1 AND instance_id = ANY($2)",
                tenant, list(instance_ids),
            )
        return [instance_from_row(r) for r in rows]

    async def find_instance(self, tenant: str, actor: str, key: str) -> InstanceInfo | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                " WHERE tenant_id=$1 AND actor=$2 AND key=$3",
                tenant, actor, key,
            )
        return None if row is None else instance_from_row(row)

    async def list_instances(
        self, tenant: str, actor: str | None, limit: int, after: str | None
    ) -> list[InstanceInfo]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=$1"
                " AND ($2::text IS NULL OR actor=$2) AND instance_id > coalesce($3, '')"
                " ORDER BY instance_id LIMIT $4",
                tenant, actor, after, limit,
            )
        return [instance_from_row(r) for r in rows]

    async def routing(self, tenant: str) -> tuple[int, list[InstanceInfo]]:
        async with self._tx(tenant) as conn:
            version = await conn.fetchval(
                "SELECT version FROM routing_versions WHERE tenant_id=$1", tenant
            )
            rows = await conn.fetch(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                " WHERE tenant_id=$1 AND filter IS NOT NULL",
                tenant,
            )
        return version or 0, [instance_from_row(r) for r in rows]

    async def tenants(self) -> list[str]:
        return await self._appends.tenants()

    # --- fan-out -------------------------------------------------------------

    async def fanout_lag(self, tenant: str) -> list[FanoutLag]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT s.path, s.head, coalesce(c.through, 0) FROM streams s"
                " LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
                " WHERE s.tenant_id=$1 AND s.head > coalesce(c.through, 0)",
                tenant,
            )
        return [FanoutLag(r[0], r[1], r[2]) for r in rows]

    async def fanout_cursor(self, tenant: str, path: str) -> int | None:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                "SELECT coalesce(c.through, 0) FROM streams s LEFT JOIN fanout_cursors c"
                " ON c.tenant_id = s.tenant_id AND c.sid = s.sid WHERE s.tenant_id=$1 AND s.path=$2",
                tenant, path,
            )
        return None if row is None else row[0]

    async def fanout_commit(
        self, tenant: str, path: str, expected: int, through: int, routing_version: int,
        items: Sequence[QueueItem], worker_id: str | None, now: int,
    ) -> Literal["ok", "moved", "stale"]:
        return await self._db.fetchval(
            "SELECT yoke_fanout($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)",
            tenant, path, expected, through, routing_version, worker_id, now,
            [i.instance_id for i in items], [i.actor for i in items], [i.key for i in items],
            [None if i.instance_id else new_instance_id() for i in items],
            [i.group_id for i in items], [i.priority for i in items], [i.offset for i in items],
            [i.event_json for i in items],
        )

    async def _enqueue(
        self, conn: asyncpg.Connection, tenant: str, items: Sequence[QueueItem], now: int,
    ) -> None:
        """Rows for named instances (fan-out, which may create keyed
        instances, goes through yoke_fanout)."""
        if any(item.instance_id is None for item in items):
            raise ValueError("enqueue needs instance ids")
        await conn.execute(
            ENQUEUE, tenant, now, [i.instance_id for i in items],
            [i.group_id or "" for i in items],
            [i.priority for i in items],
            [i.path for i in items],
            [i.offset for i in items],
            [i.event_json for i in items],
            [i.available_at for i in items],
        )
        await conn.execute("SELECT pg_notify($1, $2)", QUEUE_CHANNEL, tenant)

    # --- queue ---------------------------------------------------------------

    async def enqueue(self, tenant: str, items: Sequence[QueueItem], now: int) -> None:
        async with self._tx(tenant) as conn:
            await self._enqueue(conn, tenant, items, now)

    async def claim(
        self, tenant: str, worker_id: str, policies: Sequence[Policy], now: int, limit: int,
        done: Sequence[Completion | tuple[int, int]] = (),
        shard: tuple[int, int] = (0, 1),
    ) -> list[QueueRow]:
        resume = (tenant, worker_id, shard)
        start = self._claim_from.get(resume, ("", ""))
        done = completions(done)
        at = self._db.now_ms() if done else 0
        rows = await self._db.fetch(
            CLAIM, tenant, worker_id,
            [p.actor for p in policies], [p.concurrency for p in policies],
            [p.lease_ms for p in policies], now, limit,
            [d.qid for d in done], [d.attempts for d in done], [d.processed_at or at for d in done],
            [d.code_version for d in done], [d.tape for d in done], [d.keep for d in done], shard[0], shard[1],
            *start,
        )
        if limit > 0:
            # Each row names the group the next pass begins after; none: from the first.
            self._claim_from[resume] = (rows[0][-2], rows[0][-1]) if rows else ("", "")
        return sorted((queue_row_from_row(r[:-2]) for r in rows), key=lambda q: (-q.priority, q.qid))

    async def complete(self, tenant: str, done: Sequence[Completion | tuple[int, int]]) -> None:
        await self.claim(tenant, "", (), 0, 0, done)

    async def fail(
        self, tenant: str, qid: int, attempts: int, *, retry_at: int | None, error: str,
        traceback: str, kept: Completion | None = None,
    ) -> None:
        async with self._tx(tenant) as conn:
            if retry_at is None:  # buried: kept as its instance's input, numbered under its lock
                instance_id = await conn.fetchval(
                    "SELECT instance_id FROM actor_queue WHERE tenant_id=$1 AND qid=$2", tenant, qid
                )
                if instance_id is not None:
                    await inputs.lock_instance(conn, tenant, instance_id)
            row = await conn.fetchrow(
                "UPDATE actor_queue SET status=CASE WHEN $3::bigint IS NULL THEN 'dead' ELSE 'pending' END,"
                " available_at=coalesce($3, available_at), lease_until=NULL, worker_id=NULL,"
                f" last_error=$5, last_traceback=$6, attempt_errors={APPEND_ATTEMPT.format('$7')}"
                " WHERE tenant_id=$1 AND qid=$2 AND attempts=$4 AND status='processing'" + inputs.RETURNING,
                tenant, qid, retry_at, attempts, error, traceback,
                attempt_error(attempts, self._db.now_ms(), error),
            )
            if retry_at is None and row is not None:
                await inputs.record(conn, tenant, row, kept or Completion(qid, attempts), self._db.now_ms(),
                                    "dead", error)
            if retry_at is not None:
                await conn.execute("SELECT pg_notify($1, $2)", QUEUE_CHANNEL, tenant)

    async def queue_rows(
        self, tenant: str, instance_id: str, status: str | None, limit: int
    ) -> list[QueueRow]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {QUEUE_COLUMNS}, (SELECT i.actor FROM actor_instances i"
                "  WHERE i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id)"
                " FROM actor_queue q WHERE tenant_id=$1 AND instance_id=$2"
                " AND ($3::text IS NULL OR status=$3) ORDER BY qid LIMIT $4",
                tenant, instance_id, status, limit,
            )
        return [queue_row_from_row(r) for r in rows]

    async def dead_by_instance(self, tenant: str, limit: int) -> list[tuple[str, int]]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT instance_id, count(*) AS n FROM actor_queue WHERE tenant_id=$1 AND status='dead'"
                " GROUP BY instance_id ORDER BY n DESC, instance_id LIMIT $2",
                tenant, limit,
            )
        return [(r[0], r[1]) for r in rows]

    async def queue_depth(self, tenant: str, instance_id: str | None) -> QueueDepth:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT status, count(*) FROM actor_queue WHERE tenant_id=$1"
                " AND ($2::text IS NULL OR instance_id=$2) GROUP BY status",
                tenant, instance_id,
            )
        return QueueDepth(**{r[0]: r[1] for r in rows})

    async def redrive(
        self, tenant: str, instance_id: str, qids: Sequence[int] | None, now: int, replayed_in: str | None = None
    ) -> int:
        async with self._tx(tenant) as conn:
            result = await conn.execute(
                "UPDATE actor_queue SET status='pending', attempts=0, attempt_errors=NULL, available_at=$3,"
                " lease_until=NULL, worker_id=NULL,"
                # The key goes at the end of the text as stored (a json value keeps its
                # text: through jsonb its numbers would be rewritten); the last of a
                # repeated key is the one a reader takes.
                " event=CASE WHEN $5::text IS NULL THEN event"
                " ELSE (left(rtrim(event::text), -1) || ',\"replayed_in\":' || to_json($5::text)::text || '}')::json END"
                " WHERE tenant_id=$1 AND instance_id=$2 AND status='dead'"
                " AND ($4::bigint[] IS NULL OR qid = ANY($4))",
                tenant, instance_id, now, None if qids is None else list(qids), replayed_in,
            )
            await conn.execute("SELECT pg_notify($1, $2)", QUEUE_CHANNEL, tenant)
        return int(result.split()[-1])

    async def drop_dead(self, tenant: str, instance_id: str, qids: Sequence[int] | None) -> int:
        async with self._tx(tenant) as conn:
            result = await conn.execute(
                "DELETE FROM actor_queue WHERE tenant_id=$1 AND instance_id=$2 AND status='dead'"
                " AND ($3::bigint[] IS NULL OR qid = ANY($3))",
                tenant, instance_id, None if qids is None else list(qids),
            )
        return int(result.split()[-1])

    async def dead_letters(
        self, tenant: str, *, qid: int | None = None, instance_id: str | None = None,
        actor: str | None = None, path: str | None = None, since: int | None = None,
        until: int | None = None, limit: int = 100,
    ) -> list[QueueRow]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {QUEUE_COLUMNS}, (SELECT i.actor FROM actor_instances i"
                "  WHERE i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id)"
                ", attempt_errors FROM actor_queue q WHERE tenant_id=$1 AND status='dead'"
                " AND ($2::bigint IS NULL OR qid=$2) AND ($3::text IS NULL OR instance_id=$3)"
                " AND ($4::text IS NULL OR path=$4)"
                " AND ($5::text IS NULL OR instance_id IN"
                "  (SELECT instance_id FROM actor_instances WHERE tenant_id=$1 AND actor=$5))"
                " AND ($6::bigint IS NULL OR coalesce(started_at, enqueued_at) >= $6)"
                " AND ($7::bigint IS NULL OR coalesce(started_at, enqueued_at) < $7)"
                " ORDER BY coalesce(started_at, enqueued_at), qid LIMIT $8",
                tenant, qid, instance_id, path, actor, since, until, limit,
            )
        return [queue_row_from_row(r) for r in rows]

    async def dead_letter_times(self, tenant: str, limit: int) -> list[int]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                "SELECT coalesce(started_at, enqueued_at) AS at FROM actor_queue WHERE tenant_id=$1 AND status='dead'"
                " ORDER BY at LIMIT $2",
                tenant, limit,
            )
        return [r[0] for r in rows]

    async def resolve_dead(
        self, tenant: str, qid: int, *, drop: bool, event_json: str | None, audit: PreparedEvent, path: str,
        now: int, new_stream_id: str,
    ) -> Outcome | None:
        async with self._tx(tenant) as conn:
            if drop:
                result = await conn.execute(
                    "DELETE FROM actor_queue WHERE tenant_id=$1 AND qid=$2 AND status='dead'", tenant, qid
                )
            else:
                result = await conn.execute(
                    "UPDATE actor_queue SET status='pending', attempts=0, attempt_errors=NULL, available_at=$3,"
                    " lease_until=NULL, worker_id=NULL, event=coalesce($4::json, event)"
                    " WHERE tenant_id=$1 AND qid=$2 AND status='dead'",
                    tenant, qid, now, event_json,
                )
            if result.split()[-1] != "1":
                return None
            committed = await self._appends.commit_batch(conn, tenant, path, [audit], now, new_stream_id, kernel=True)
            if not drop:
                await conn.execute("SELECT pg_notify($1, $2)", QUEUE_CHANNEL, tenant)
        return committed.outcomes[0]

    async def unfinished(self, actors: Sequence[str]) -> int:
        total = 0
        for tenant in await self.tenants():
            async with self._tx(tenant) as conn:
                total += await conn.fetchval(
                    "SELECT (SELECT count(*) FROM actor_queue q JOIN actor_instances i"
                    "    ON i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id"
                    "    WHERE q.tenant_id=$1 AND q.status <> 'dead' AND i.actor = ANY($2))"
                    " + (SELECT coalesce(sum(s.head - coalesce(c.through, 0)), 0) FROM streams s"
                    "    LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
                    "    WHERE s.tenant_id=$1 AND s.head > coalesce(c.through, 0))",
                    tenant, list(actors),
                )
        return int(total)

    async def agenda(self, tenant: str, now: int) -> Agenda:
        async with self._tx(tenant) as conn:
            row = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM actor_queue WHERE tenant_id = $1"
                "        AND (status = 'processing' OR (status = 'pending' AND available_at <= $2)))"
                " + (SELECT coalesce(sum(s.head - coalesce(c.through, 0)), 0) FROM streams s"
                "    LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
                "    WHERE s.tenant_id = $1 AND s.head > coalesce(c.through, 0))"
                " + (SELECT count(*) FROM actor_schedules WHERE tenant_id = $1 AND due_at <= $2),"
                " least((SELECT min(available_at) FROM actor_queue"
                "        WHERE tenant_id = $1 AND status = 'pending' AND available_at > $2),"
                "       (SELECT min(due_at) FROM actor_schedules WHERE tenant_id = $1 AND due_at > $2))",
                tenant, now,
            )
        return Agenda(int(row[0]), None if row[1] is None else int(row[1]))

    async def unfinished_rows(self, tenant: str, actors: Sequence[str], limit: int) -> list[QueueRow]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {', '.join('q.' + c.strip() for c in QUEUE_COLUMNS.split(','))}, i.actor"
                " FROM actor_queue q JOIN actor_instances i"
                " ON i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id"
                " WHERE q.tenant_id=$1 AND q.status <> 'dead' AND i.actor = ANY($2)"
                " ORDER BY q.attempts DESC, q.qid LIMIT $3",
                tenant, list(actors), limit,
            )
        return [queue_row_from_row(r) for r in rows]

    # --- workers -------------------------------------------------------------

    async def register_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        await self._db.beat(
            f"INSERT INTO runtime_workers VALUES ($1, {DB_NOW_MS}, {DB_NOW_MS}, $2::jsonb)"
            " ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            worker_id, orjson.dumps(info).decode(), method="execute",
        )

    async def heartbeat(self, worker_id: str) -> bool:
        result = await self._db.beat(
            f"UPDATE runtime_workers SET heartbeat_at = {DB_NOW_MS} WHERE worker_id=$1", worker_id,
            method="execute",
        )
        return result == "UPDATE 1"

    async def unregister_worker(self, worker_id: str) -> None:
        await self._db.execute("DELETE FROM runtime_workers WHERE worker_id=$1", worker_id)
        for tenant in await self.tenants():
            await self.release_instances(tenant, [worker_id])

    async def reap_workers(self, by: str, stale_ms: int) -> list[Reaped]:
        rows = await self._db.beat(
            f"WITH now AS (SELECT {DB_NOW_MS} AS ms)"
            " DELETE FROM runtime_workers w USING now WHERE w.worker_id <> $1"
            " AND w.heartbeat_at < now.ms - $2 RETURNING w.worker_id, now.ms - w.heartbeat_at, w.info",
            by, stale_ms, method="fetch",
        )
        return [Reaped(r[0], r[1], orjson.loads(r[2])) for r in rows]

    async def live_workers(self) -> list[str]:
        return [r[0] for r in await self._db.fetch("SELECT worker_id FROM runtime_workers")]

    async def release_instances(self, tenant: str, worker_ids: Sequence[str]) -> int:
        async with self._tx(tenant) as conn:
            result = await conn.execute(
                "UPDATE actor_instances SET worker_id=NULL WHERE tenant_id=$1 AND worker_id = ANY($2)",
                tenant, list(worker_ids),
            )
        return int(result.split()[-1])

    async def release_excess(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> list[str]:
        names = None if actors is None else list(actors)
        async with self._tx(tenant) as conn:
            # Exclusive with this worker's claims (yoke_claim_in_turns): those under way
            # commit first, and the statements below see the rows they took.
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))", CLAIM_LOCK, worker_id)
            total, mine = await conn.fetchrow(
                "SELECT count(*), count(*) FILTER (WHERE worker_id=$2) FROM actor_instances"
                " WHERE tenant_id=$1 AND ($3::text[] IS NULL OR actor = ANY($3))",
                tenant, worker_id, names,
            )
            excess = mine - -(-total // max(workers, 1))
            if excess <= 0:  # at its share (workers left meanwhile): nothing drains
                await conn.execute(
                    "UPDATE actor_instances SET claimable_after=0 WHERE tenant_id=$1 AND worker_id=$2"
                    " AND claimable_after=$3", tenant, worker_id, DRAINING,
                )
                return []
            # Released: the excess with no row processing, draining ones first.
            rows = await conn.fetch(
                "WITH pick AS (SELECT i.instance_id FROM actor_instances i WHERE i.tenant_id=$1 AND i.worker_id=$2"
                " AND ($4::text[] IS NULL OR i.actor = ANY($4))"
                " AND NOT EXISTS (SELECT 1 FROM actor_queue q WHERE q.tenant_id=$1"
                "   AND q.instance_id = i.instance_id AND q.status='processing')"
                " ORDER BY i.claimable_after = $5 DESC, i.instance_id DESC LIMIT $3 FOR UPDATE SKIP LOCKED)"
                " UPDATE actor_instances i SET worker_id=NULL, claimable_after=0 FROM pick"
                " WHERE i.tenant_id=$1 AND i.instance_id = pick.instance_id RETURNING i.instance_id",
                tenant, worker_id, excess, names, DRAINING,
            )
            # The rest of the excess is busy: it drains (claims take no new
            # row of it) until a later pass finds it idle.
            await conn.execute(
                "WITH pick AS (SELECT instance_id FROM actor_instances WHERE tenant_id=$1 AND worker_id=$2"
                " AND ($5::text[] IS NULL OR actor = ANY($5)) AND claimable_after <> $4"
                " ORDER BY instance_id DESC LIMIT greatest($3 - (SELECT count(*) FROM actor_instances"
                "   WHERE tenant_id=$1 AND worker_id=$2 AND claimable_after = $4), 0) FOR UPDATE SKIP LOCKED)"
                " UPDATE actor_instances i SET claimable_after=$4 FROM pick"
                " WHERE i.tenant_id=$1 AND i.instance_id = pick.instance_id",
                tenant, worker_id, excess - len(rows), DRAINING, names,
            )
        return [r[0] for r in rows]

    async def adopt_instances(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> int:
        async with self._tx(tenant) as conn:
            # Orphans: owners that are no longer registered (reaped elsewhere).
            await conn.execute(
                "UPDATE actor_instances SET worker_id=NULL WHERE tenant_id=$1 AND worker_id IS NOT NULL"
                " AND worker_id NOT IN (SELECT worker_id FROM runtime_workers)",
                tenant,
            )
            total, mine = await conn.fetchrow(
                "SELECT count(*), count(*) FILTER (WHERE worker_id=$2) FROM actor_instances"
                " WHERE tenant_id=$1 AND ($3::text[] IS NULL OR actor = ANY($3))",
                tenant, worker_id, None if actors is None else list(actors),
            )
            share = -(-total // max(workers, 1)) - mine
            if share <= 0:
                return 0
            # A CTE, evaluated once: as an IN (...) subquery under row-level
            # security it can be rerun per row and take more than the share.
            result = await conn.execute(
                "WITH pick AS (SELECT instance_id FROM actor_instances WHERE tenant_id=$1"
                " AND worker_id IS NULL AND ($4::text[] IS NULL OR actor = ANY($4))"
                " ORDER BY instance_id LIMIT $3 FOR UPDATE SKIP LOCKED)"
                # Rows still processing belong to the previous owners: claim
                # nothing of the instance before their leases end.
                " UPDATE actor_instances i SET worker_id=$2, claimable_after=coalesce(("
                "   SELECT max(q.lease_until) FROM actor_queue q WHERE q.tenant_id=$1"
                "   AND q.instance_id = i.instance_id AND q.status='processing'), 0)"
                " FROM pick WHERE i.tenant_id=$1 AND i.instance_id = pick.instance_id",
                tenant, worker_id, share, None if actors is None else list(actors),
            )
            adopted = int(result.split()[-1])
            if adopted:
                await conn.execute("SELECT pg_notify($1, $2)", QUEUE_CHANNEL, tenant)
        return adopted

    # --- where the per-instance databases live -----------------------------------

    async def record_state_home(self, home: StateHome) -> StateHome:
        # Two statements: the insert waits for a concurrent one to commit,
        # and the select (a new snapshot) then sees whichever won.
        await self._db.execute(
            "INSERT INTO actor_state_home (storage, location, label, recorded_at) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT DO NOTHING",
            home.storage, home.location, home.label, self._db.now_ms(),
        )
        recorded = await self.state_home()
        assert recorded is not None
        return recorded

    async def state_home(self) -> StateHome | None:
        row = await self._db.fetchrow("SELECT storage, location, label, recorded_at FROM actor_state_home")
        return None if row is None else StateHome(*row)

    # --- per-instance SQLite databases ---------------------------------------

    # One round trip each (functions/yoke_load_state.sql, yoke_save_state.sql):
    # an image is read when an instance opens and written after each run.
    async def load_state(self, tenant: str, instance_id: str) -> bytes | None:
        return await self._db.fetchval("SELECT yoke_load_state($1, $2)", tenant, instance_id)  # type: ignore[return-value]

    async def save_state(self, tenant: str, instance_id: str, data: bytes, now: int) -> None:
        await self._db.execute(SAVE_STATE, tenant, instance_id, data, now)

    # --- schedules -----------------------------------------------------------

    async def upsert_schedule(self, s: Schedule, effect: Effect | None = None) -> int:
        async with self._tx(s.tenant) as conn:
            recorded = await _recorded(conn, s.tenant, effect)
            if recorded is not None:
                return recorded
            await self._upsert_schedule(conn, s)
            await _record(conn, s.tenant, effect, s.due_at)
        return s.due_at

    @staticmethod
    async def _upsert_schedule(conn: asyncpg.Connection, s: Schedule) -> None:
        await conn.execute(
            "INSERT INTO actor_schedules VALUES ($1,$2,$3,$4,$5,$6::json,$7,$8)"
            " ON CONFLICT (tenant_id, instance_id, name) DO UPDATE SET due_at=EXCLUDED.due_at,"
            " cron=EXCLUDED.cron, event=EXCLUDED.event, stream=EXCLUDED.stream",
            s.tenant, s.instance_id, s.name, s.due_at, s.cron,
            orjson.dumps(s.event).decode(), s.stream, s.created_at,
        )

    async def cancel_schedule(
        self, tenant: str, instance_id: str, name: str, effect: Effect | None = None
    ) -> bool:
        async with self._tx(tenant) as conn:
            recorded = await _recorded(conn, tenant, effect)
            if recorded is not None:
                return recorded
            found = await conn.execute(
                "DELETE FROM actor_schedules WHERE tenant_id=$1 AND instance_id=$2 AND name=$3",
                tenant, instance_id, name,
            ) != "DELETE 0"
            await _record(conn, tenant, effect, found)
        return found

    async def schedules(self, tenant: str, instance_id: str) -> list[Schedule]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {SCHEDULE_COLUMNS} FROM actor_schedules WHERE tenant_id=$1"
                " AND instance_id=$2 ORDER BY name",
                tenant, instance_id,
            )
        return [schedule_from_row(r) for r in rows]

    async def due_schedules(self, tenant: str, now: int, limit: int) -> list[Schedule]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {SCHEDULE_COLUMNS} FROM actor_schedules WHERE tenant_id=$1 AND due_at <= $2"
                " ORDER BY due_at LIMIT $3",
                tenant, now, limit,
            )
        return [schedule_from_row(r) for r in rows]

    async def fire_schedule(
        self, s: Schedule, next_due: int | None, item: QueueItem | None, now: int
    ) -> bool:
        async with self._tx(s.tenant) as conn:
            found = await conn.fetchval(
                "SELECT 1 FROM actor_schedules WHERE tenant_id=$1 AND instance_id=$2 AND name=$3"
                " AND due_at=$4 FOR UPDATE SKIP LOCKED",
                s.tenant, s.instance_id, s.name, s.due_at,
            )
            if found is None:
                return False
            if item is not None:
                await self._enqueue(conn, s.tenant, [item], now)
            if next_due is None:
                await conn.execute(
                    "DELETE FROM actor_schedules WHERE tenant_id=$1 AND instance_id=$2 AND name=$3",
                    s.tenant, s.instance_id, s.name,
                )
            else:
                await conn.execute(
                    "UPDATE actor_schedules SET due_at=$4 WHERE tenant_id=$1 AND instance_id=$2"
                    " AND name=$3",
                    s.tenant, s.instance_id, s.name, next_due,
                )
        return True

    # --- conversations -------------------------------------------------------

    async def post_message(
        self, tenant: str, path: str, message: Message, event: PreparedEvent, now: int,
        new_stream_id: str, effect: Effect | None = None,
    ) -> tuple[Message | None, Outcome]:
        async with self._tx(tenant) as conn:
            recorded = await _recorded(conn, tenant, effect)
            if recorded is not None:
                return message_from_record(recorded)
            outcome = await self._appends.commit_in(conn, tenant, path, [event], now, new_stream_id)
            if outcome.status != "ok":
                return None, outcome  # refused: no message without its event
            posted = await self._insert_message(conn, tenant, message, now, outcome.offset)
            await _record(conn, tenant, effect, message_record(posted, outcome))
        return posted, outcome

    @staticmethod
    async def _insert_message(
        conn: asyncpg.Connection, tenant: str, m: Message, now: int, offset: int | None
    ) -> Message:
        return message_from_row(await conn.fetchrow(
            "INSERT INTO conversation_messages (tenant_id, conversation_id, message_id, role,"
            " content, metadata, at, event_seq) VALUES ($1,$2,$3,$4,$5::json,$6::json,$7,$8)"
            f" RETURNING {MESSAGE_COLUMNS}",
            tenant, m.conversation_id, m.message_id, m.role,
            orjson.dumps(m.content).decode(), orjson.dumps(m.metadata).decode(), now, offset,
        ))

    async def commit_run(self, tenant: str, run: RunCommit, now: int) -> tuple[str, str | None]:
        try:
            async with self._tx(tenant) as conn:
                await inputs.lock_instance(conn, tenant, run.instance_id)  # its input numbered under its lock
                gone = await conn.fetchrow(
                    "DELETE FROM actor_queue WHERE tenant_id=$1 AND qid=$2 AND attempts=$3"
                    " AND status='processing'" + inputs.RETURNING,
                    tenant, run.qid, run.attempts,
                )
                if gone is None:
                    raise RunUndone("lost")
                await inputs.record(conn, tenant, gone, run.completion(), now)
                for path, appends in run.by_stream():
                    result = await self._appends.commit_batch(
                        conn, tenant, path, [a.event for a in appends], now, run.stream_ids[path]
                    )
                    for a, outcome in zip(appends, result.outcomes):
                        if outcome.status not in ("ok", "duplicate"):
                            raise RunUndone(outcome.status, path)
                        if a.message is not None:
                            await self._insert_message(conn, tenant, a.message, now, outcome.offset)
                for op in run.schedules:
                    if isinstance(op, str):
                        await conn.execute(
                            "DELETE FROM actor_schedules WHERE tenant_id=$1 AND instance_id=$2 AND name=$3",
                            tenant, run.instance_id, op,
                        )
                    else:
                        await self._upsert_schedule(conn, op)
                for info in run.instances:
                    await self._insert_instance(conn, info)
                if run.state is not None:
                    await conn.execute(SAVE_STATE, tenant, run.instance_id, run.state, now)
        except RunUndone as undone:
            return undone.status, undone.path
        return "ok", None

    async def messages(
        self, tenant: str, conversation_id: str, after: int | None, limit: int
    ) -> list[Message]:
        async with self._tx(tenant) as conn:
            rows = await conn.fetch(
                f"SELECT {MESSAGE_COLUMNS} FROM conversation_messages WHERE tenant_id=$1"
                " AND conversation_id=$2 AND seq > $3 ORDER BY seq LIMIT $4",
                tenant, conversation_id, after or 0, limit,
            )
        return [message_from_row(r) for r in rows]
