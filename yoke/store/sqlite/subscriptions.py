"""SQLite implementation of the subscription storage contract
(``store.subscriptions``). Writes run on the store's single writer thread,
which is also the lock ``control`` and the passive fence rely on."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson

from ...events import Event, PreparedEvent
from ..actors import attempt_error
from ..results import CommitResult, Outcome
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
from . import event_blocks
from .actors import APPEND_ATTEMPT

if TYPE_CHECKING:
    from .appends import SqliteAppends
    from .connection import SqliteDb

# An acknowledgement or failure of one source lifetime never lands on the
# subscription of the same name in a later one (the stream deleted, created
# again and subscribed anew: its generation may well be the same offset).
SAME_LIFETIME = "(? IS NULL OR source_stream_id = ?)"
KEY = "tenant_id=? AND path=? AND name=?"
# A control change keeps the catalogue record's row count (when it has one).
CATALOGUE_COUNT = (
    "UPDATE subscription_catalogues SET subscriptions ="
    " (SELECT count(*) FROM subscriptions WHERE tenant_id=? AND path=?) WHERE tenant_id=? AND path=?"
)
STALE_CATALOGUES = """
SELECT s.path FROM streams s
LEFT JOIN subscription_catalogues c ON c.tenant_id = s.tenant_id AND c.path = s.path
WHERE s.tenant_id = ?2 AND (
    (c.path IS NULL AND EXISTS (SELECT 1 FROM subscriptions x WHERE x.tenant_id = s.tenant_id AND x.path = s.path))
    OR (c.path IS NOT NULL AND (
        c.reducer <> ?1 OR c.stream_id <> s.stream_id OR c.stage IS NOT NULL
        OR c.subscriptions <> (SELECT count(*) FROM subscriptions x
                               WHERE x.tenant_id = s.tenant_id AND x.path = s.path))))
ORDER BY s.path
"""
UPSERT = (
    f"INSERT INTO subscriptions ({', '.join(SUBSCRIPTION_WRITE_COLUMNS)})"
    f" VALUES ({', '.join('?' * len(SUBSCRIPTION_WRITE_COLUMNS))})"
    " ON CONFLICT (tenant_id, path, name) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in SUBSCRIPTION_WRITE_COLUMNS[3:])
)


class _Refused(Exception):
    def __init__(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes = outcomes


class SqliteSubscriptionStore:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends

    async def _read(self, sql: str, params: Sequence[Any] | Mapping[str, Any]) -> list[sqlite3.Row]:
        return await self._db.read(lambda: self._db.reader().execute(sql, params).fetchall())

    async def control(
        self, tenant: str, path: str, name: str, decide: Decide, now: int, new_stream_id: str,
        *, copies_into: str | None = None, probe: Probe | None = None,
    ) -> tuple[Change, Sequence[Outcome]]:

        def run() -> tuple[Change, Sequence[Outcome]]:
            try:
                with self._db.transaction() as conn:
                    s, _ = self._appends.ensure_stream(conn, tenant, path, new_stream_id, now)
                    copies = 0
                    if copies_into is not None:  # the writer thread is the lock
                        copies = conn.execute(
                            "SELECT count(*) FROM subscriptions WHERE tenant_id=?"
                            " AND json_extract(config, '$.target')=? AND NOT (path=? AND name=?)",
                            (tenant, copies_into, path, name),
                        ).fetchone()[0]
                    probed = probe is not None and conn.execute(
                        "SELECT EXISTS (" + event_blocks.span(
                            "1", where=f"type IN ({', '.join(f':type{i}' for i in range(len(probe.types)))})"
                            " AND json_extract(payload, :field) = :value",
                        ) + ")",
                        {"t": tenant, "s": s["sid"], "after": probe.after, "field": f"$.{probe.field}",
                         "value": probe.value, **{f"type{i}": t for i, t in enumerate(probe.types)}},
                    ).fetchone()[0]
                    source = SourceState(s["stream_id"], s["created_at"], s["head"], copies, bool(probed), now)
                    found = conn.execute(
                        f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE {KEY}",
                        (tenant, path, name),
                    ).fetchone()
                    current = None if found is None else subscription_from_row(found, s["head"])
                    change = decide(current, source)
                    outcomes: Sequence[Outcome] = []
                    if change.events:
                        result = self._appends.commit_in(
                            conn, tenant, path, change.events, [0] * len(change.events), now,
                            new_stream_id, kernel=change.bookkeeping,
                        )
                        outcomes = result.outcomes
                        if not all_accepted(result.outcomes):
                            raise _Refused(outcomes)
                    if change.delete:
                        conn.execute(f"DELETE FROM subscriptions WHERE {KEY}", (tenant, path, name))
                    elif change.row is not None:
                        conn.execute(UPSERT, subscription_values(change.row))
                    if change.drop_checkpoint:
                        key = (tenant, path, change.row.name if change.row else name)
                        conn.execute(f"DELETE FROM processor_checkpoints WHERE {KEY}", key)
                    if change.delete or change.row is not None:
                        conn.execute(CATALOGUE_COUNT, (tenant, path, tenant, path))
                    return change, outcomes
            except _Refused as refused:
                return Change(), refused.outcomes

        return await self._db.write(run)

    async def get(self, tenant: str, path: str, name: str) -> SubscriptionRow | None:
        rows = await self._read(
            f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=? AND s.path=? AND s.name=?",
            (tenant, path, name),
        )
        return subscription_from_row(rows[0][:-1], rows[0][-1]) if rows else None

    async def totals(self, tenant: str, limit: int) -> tuple[SubscriptionTotals, list[SubscriptionRow]]:
        counted = await self._read(
            "SELECT count(*), coalesce(sum(CASE WHEN s.halted IS NULL THEN 0 ELSE 1 END), 0),"
            " coalesce(sum(CASE WHEN coalesce(t.head, 0) > s.processed_through_offset"
            " THEN coalesce(t.head, 0) - s.processed_through_offset ELSE 0 END), 0)"
            " FROM subscriptions s LEFT JOIN streams t ON t.tenant_id = s.tenant_id AND t.path = s.path"
            " WHERE s.tenant_id=?",
            (tenant,),
        )
        rows = await self._read(
            f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=?"
            " ORDER BY s.halted IS NULL, coalesce(t.head, 0) - s.processed_through_offset DESC, s.path, s.name"
            " LIMIT ?",
            (tenant, limit),
        )
        return SubscriptionTotals(*counted[0]), [subscription_from_row(r[:-1], r[-1]) for r in rows]

    async def list(self, tenant: str, path: str) -> list[SubscriptionRow]:
        rows = await self._read(
            f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=? AND s.path=? ORDER BY s.name",
            (tenant, path),
        )
        return [subscription_from_row(r[:-1], r[-1]) for r in rows]

    # --- leases (one machine, one clock: times taken here) ----------------------------

    async def _owners_write(self, sql: str, params: Sequence[Any]) -> list[Any]:
        def run() -> list[Any]:
            with self._db.transaction() as conn:
                return conn.execute(sql, params).fetchall()

        # Kept off the writer's stream row copies (only these rows change).
        return await self._db.write(run, streams_unchanged=True)

    async def register_owner(self, owner: DeliveryOwner, lease_ms: int) -> None:
        now = self._db.now_ms()
        await self._owners_write(
            "INSERT INTO delivery_owners VALUES (?, ?, ?, ?, ?) ON CONFLICT (owner) DO UPDATE SET"
            " heartbeat_at = excluded.heartbeat_at, lease_ms = excluded.lease_ms, info = excluded.info",
            (owner.owner, now, now, lease_ms, orjson.dumps(owner.info()).decode()),
        )

    async def beat_owner(self, owner: str) -> bool:
        found = await self._owners_write(
            "UPDATE delivery_owners SET heartbeat_at = ? WHERE owner = ? RETURNING owner", (self._db.now_ms(), owner)
        )
        return bool(found)

    async def reap_owners(self, by: str) -> list[DeliveryOwner]:
        rows = await self._owners_write(
            "DELETE FROM delivery_owners WHERE owner <> ? AND heartbeat_at + lease_ms < ? RETURNING owner, info",
            (by, self._db.now_ms()),
        )
        return [DeliveryOwner.of(r[0], orjson.loads(r[1])) for r in rows]

    async def owners(self) -> list[DeliveryOwner]:
        rows = await self._read("SELECT owner, info FROM delivery_owners ORDER BY owner", ())
        return [DeliveryOwner.of(r[0], orjson.loads(r[1])) for r in rows]

    async def drop_owner(self, owner: str) -> None:
        await self._owners_write("DELETE FROM delivery_owners WHERE owner = ?", (owner,))

    async def tenants(self) -> list[str]:
        return [r[0] for r in await self._read("SELECT DISTINCT tenant_id FROM subscriptions", ())]

    async def leases(self, tenant: str, paths: Sequence[str] | None = None) -> list[SubscriptionRow]:
        if paths is None:
            rows = await self._read(f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=?", (tenant,))
        else:
            rows = await self._read(
                f"{SUBSCRIPTION_WITH_HEAD} WHERE s.tenant_id=? AND s.path IN (SELECT value FROM json_each(?))",
                (tenant, orjson.dumps(list(paths)).decode()),
            )
        return [subscription_from_row(r[:-1], r[-1]) for r in rows]

    async def take(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> list[SubscriptionRow]:
        def run() -> list[SubscriptionRow]:
            taken = []
            with self._db.transaction() as conn:
                for path, name in keys:
                    row = conn.execute(
                        f"UPDATE subscriptions SET lease_owner=? WHERE {KEY} AND (lease_owner IS NULL"
                        " OR lease_owner=? OR lease_owner NOT IN (SELECT owner FROM delivery_owners))"
                        f" RETURNING {SUBSCRIPTION_COLUMNS}",
                        (owner, tenant, path, name, owner),
                    ).fetchone()
                    if row is not None:
                        taken.append(subscription_from_row(row))
            return taken

        return await self._db.write(run, streams_unchanged=True)

    async def give(self, tenant: str, owner: str, keys: Sequence[tuple[str, str]]) -> None:
        def run() -> None:
            with self._db.transaction() as conn:
                conn.executemany(
                    f"UPDATE subscriptions SET lease_owner=NULL WHERE {KEY} AND lease_owner=?",
                    [(tenant, path, name, owner) for path, name in keys],
                )

        await self._db.write(run, streams_unchanged=True)

    async def ack(
        self, tenant: str, path: str, name: str, generation: int, through: int, delivered: int,
        now: int, checkpoint: Checkpoint | None = None, *, keep_attempts: bool = False,
        stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        def run() -> SubscriptionRow | None:
            with self._db.transaction() as conn:
                row = conn.execute(
                    "UPDATE subscriptions SET processed_through_offset ="
                    " max(processed_through_offset, ?), attempts=CASE WHEN ? THEN attempts ELSE 0 END,"
                    " skips=CASE WHEN ? THEN skips ELSE 0 END, next_retry_at=0,"
                    " attempt_errors=CASE WHEN ? THEN attempt_errors END,"
                    " gave_up=CASE WHEN ? > 0 AND NOT ? THEN NULL ELSE gave_up END,"
                    f" delivered=delivered+? WHERE {KEY} AND generation=? AND {SAME_LIFETIME}"
                    f" RETURNING {SUBSCRIPTION_COLUMNS}",
                    (through, keep_attempts, keep_attempts, keep_attempts, delivered, keep_attempts, delivered,
                     tenant, path, name, generation, stream_id, stream_id),
                ).fetchone()
                if row is not None and checkpoint is not None:
                    self._save_checkpoint(conn, checkpoint, now)
            return None if row is None else subscription_from_row(row)

        return await self._db.write(run)

    async def fail(
        self, tenant: str, path: str, name: str, generation: int, attempts: int, error: str,
        next_retry_at: int, *, stream_id: str | None = None,
    ) -> SubscriptionRow | None:
        def run() -> SubscriptionRow | None:
            now = self._db.now_ms()
            with self._db.transaction() as conn:
                row = conn.execute(
                    "UPDATE subscriptions SET attempts=?, last_error=?, last_error_at=?, next_retry_at=?,"
                    f" failures=failures+1, attempt_errors={APPEND_ATTEMPT}"
                    f" WHERE {KEY} AND generation=? AND {SAME_LIFETIME}"
                    f" RETURNING {SUBSCRIPTION_COLUMNS}",
                    (attempts, error, now, next_retry_at, attempt_error(attempts, now, error),
                     tenant, path, name, generation, stream_id, stream_id),
                ).fetchone()
            return None if row is None else subscription_from_row(row)

        return await self._db.write(run)

    async def events_of_types(
        self, tenant: str, path: str, types: Sequence[str], after: int, limit: int
    ) -> list[Event]:
        rows = await self._read(
            event_blocks.span(
                EVENT_COLUMNS, sid="(SELECT sid FROM streams WHERE tenant_id = :t AND path = :path)",
                where=f"type IN ({', '.join(f':type{i}' for i in range(len(types)))})",
            ) + " LIMIT :n",
            {"t": tenant, "path": path, "after": after, "n": limit, **{f"type{i}": t for i, t in enumerate(types)}},
        )
        return [event_from_row(tenant, path, r) for r in rows]

    async def append_copies(
        self, tenant: str, path: str, events: Sequence[PreparedEvent], stamp: Stamp, now: int,
        new_stream_id: str,
    ) -> CommitResult | None:

        def run() -> CommitResult | None:
            with self._db.transaction() as conn:
                record = conn.execute(
                    "SELECT source_stream_id, source_created_at, generation FROM subscription_inbound"
                    " WHERE tenant_id=? AND path=? AND source_path=? AND name=?",
                    (tenant, path, stamp.source_path, stamp.name),
                ).fetchone()
                if record is not None and fence_refuses(tuple(record), stamp):
                    return None
                result = self._appends.commit_in(
                    conn, tenant, path, events, [0] * len(events), now, new_stream_id
                )
                if not all_accepted(result.outcomes):
                    return result  # the single batch was refused: nothing was written
                fresh = sum(1 for o in result.outcomes if o.status == "ok")
                conn.execute(
                    "INSERT INTO subscription_inbound (tenant_id, path, source_path, name,"
                    " source_stream_id, source_created_at, generation, received, last_received_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (tenant_id, path, source_path, name)"
                    " DO UPDATE SET source_stream_id=excluded.source_stream_id,"
                    " source_created_at=excluded.source_created_at, generation=excluded.generation,"
                    " received=received+excluded.received, last_received_at=excluded.last_received_at",
                    (tenant, path, stamp.source_path, stamp.name, stamp.source_stream_id,
                     stamp.source_created_at, stamp.generation, fresh, now),
                )
                return result

        return await self._db.write(run)

    async def inbound(self, tenant: str, path: str) -> list[InboundRecord]:
        rows = await self._read(
            f"SELECT {INBOUND_COLUMNS} FROM subscription_inbound WHERE tenant_id=? AND path=?"
            " ORDER BY source_path, name",
            (tenant, path),
        )
        return [inbound_from_row(r) for r in rows]

    async def checkpoint(self, tenant: str, path: str, name: str) -> Checkpoint | None:
        rows = await self._read(
            f"SELECT {CHECKPOINT_COLUMNS} FROM processor_checkpoints WHERE {KEY}",
            (tenant, path, name),
        )
        return checkpoint_from_row(rows[0]) if rows else None

    async def save_checkpoint(self, checkpoint: Checkpoint, now: int) -> bool:
        c = checkpoint

        def run() -> bool:
            with self._db.transaction() as conn:
                current = conn.execute(
                    f"SELECT 1 FROM subscriptions WHERE {KEY} AND generation=?",
                    (c.tenant, c.path, c.name, c.generation),
                ).fetchone()
                if current is None:
                    return False
                self._save_checkpoint(conn, c, now)
                return True

        return await self._db.write(run)

    @staticmethod
    def _save_checkpoint(conn: sqlite3.Connection, c: Checkpoint, now: int) -> None:
        conn.execute(
            "INSERT INTO processor_checkpoints (tenant_id, path, name, version, stream_id,"
            " generation, through, state, complete, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (tenant_id, path, name) DO UPDATE SET version=excluded.version,"
            " stream_id=excluded.stream_id, generation=excluded.generation,"
            " through=excluded.through, state=excluded.state, complete=excluded.complete,"
            " updated_at=excluded.updated_at",
            (c.tenant, c.path, c.name, c.version, c.stream_id, c.generation, c.through,
             orjson.dumps(c.state).decode(), int(c.complete), now),
        )

    async def write_catalogue(
        self, tenant: str, path: str, head: int,
        merge: Callable[[list[SubscriptionRow]], list[SubscriptionRow]],
        *, reducer: str = "", stream_id: str = "", now: int = 0,
    ) -> bool:

        def run() -> bool:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None or s["head"] != head or (stream_id and s["stream_id"] != stream_id):
                    return False
                current = [
                    subscription_from_row(r, head) for r in conn.execute(
                        f"SELECT {SUBSCRIPTION_COLUMNS} FROM subscriptions WHERE tenant_id=? AND path=?",
                        (tenant, path),
                    )
                ]
                rows = merge(current)
                keep = [r.name for r in rows]
                marks = ",".join("?" * len(keep))
                conn.execute(
                    "DELETE FROM subscriptions WHERE tenant_id=? AND path=?"
                    + (f" AND name NOT IN ({marks})" if keep else ""),
                    (tenant, path, *keep),
                )
                conn.executemany(UPSERT, [subscription_values(r) for r in rows])
                if reducer:
                    conn.execute(
                        "INSERT INTO subscription_catalogues (tenant_id, path, stream_id, reducer,"
                        " subscriptions, stage, updated_at) VALUES (?,?,?,?,?,NULL,?)"
                        " ON CONFLICT (tenant_id, path) DO UPDATE SET stream_id=excluded.stream_id,"
                        " reducer=excluded.reducer, subscriptions=excluded.subscriptions, stage=NULL,"
                        " updated_at=excluded.updated_at",
                        (tenant, path, s["stream_id"], reducer, len(rows), now),
                    )
                return True

        return await self._db.write(run)

    async def stale_catalogues(self, tenant: str, reducer: str) -> list[str]:
        rows = await self._read(STALE_CATALOGUES, (reducer, tenant))
        return [r[0] for r in rows]

    async def catalogue(self, tenant: str, path: str) -> CatalogueRecord | None:
        rows = await self._read(
            "SELECT path, stream_id, reducer, subscriptions, stage FROM subscription_catalogues"
            " WHERE tenant_id=? AND path=?",
            (tenant, path),
        )
        if not rows:
            return None
        r = rows[0]
        return CatalogueRecord(r[0], r[1], r[2], r[3], orjson.loads(r[4]) if r[4] is not None else None)

    async def save_catalogue_stage(
        self, tenant: str, path: str, stream_id: str, reducer: str, stage: dict[str, Any], now: int
    ) -> bool:

        def run() -> bool:
            with self._db.transaction() as conn:
                s = self._appends.stream_row(conn, tenant, path)
                if s is None or s["stream_id"] != stream_id:
                    return False
                conn.execute(
                    "INSERT INTO subscription_catalogues (tenant_id, path, stream_id, reducer, subscriptions,"
                    " stage, updated_at) VALUES (?,?,?,?,-1,?,?) ON CONFLICT (tenant_id, path) DO UPDATE"
                    " SET stream_id=excluded.stream_id, reducer=excluded.reducer, stage=excluded.stage,"
                    " updated_at=excluded.updated_at",
                    (tenant, path, stream_id, reducer, orjson.dumps(stage).decode(), now),
                )
                return True

        return await self._db.write(run)
