"""SQLite implementation of the actor storage contract (``store.actors``).

Writes run on the store's single writer thread (so a claim cannot race
another claim: the single writer is the lock); reads on its reader threads.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import orjson

from ...events import PreparedEvent
from ...lifecycle import INSTANCE_ADOPTED, INSTANCE_CREATED, INSTANCE_REMOVED, instance_fact
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

if TYPE_CHECKING:
    from .appends import SqliteAppends
    from .connection import SqliteDb

# The claim of PostgreSQL's yoke_claim_in_turns, step by step on the writer thread
# (in-process queries cost no round trip; the single writer is the lock).
# The first queued (instance, group) at or after the given one ('' is no
# group: the lowest), skipping through the claim index, with its instance's
# actor if this worker may claim its rows now and the group's live leases:
# one statement a group (each statement on the writer thread hands the GIL
# back and waits to take it again). A pass costs a probe per queued group,
# not one per instance the worker owns (most of which, with thousands of
# keyed instances, have nothing queued).
GROUP_FROM = (
    "SELECT g.instance_id, g.group_key,"
    " (SELECT i.actor FROM actor_instances i WHERE i.tenant_id = ?1 AND i.instance_id = g.instance_id"
    "  AND i.worker_id = ?4"
    "  AND i.claimable_after <= ?5),"  # just changed hands: wait for the previous owner's leases
    " (SELECT count(*) FROM actor_queue b WHERE b.tenant_id = ?1 AND b.instance_id = g.instance_id"
    "  AND b.group_key = g.group_key AND b.status = 'processing' AND b.lease_until > ?5)"
    " FROM (SELECT instance_id, group_key FROM actor_queue WHERE tenant_id = ?1 AND status <> 'dead'"
    "  AND (instance_id, group_key) >= (?2, ?3) ORDER BY instance_id, group_key LIMIT 1) g"
)
CLAIMABLE = (
    "SELECT qid, priority FROM actor_queue WHERE tenant_id=? AND instance_id=? AND group_key=?"
    " AND status <> 'dead' AND ((status='pending' AND available_at <= ?)"
    " OR (status='processing' AND lease_until <= ?)) ORDER BY priority DESC, qid LIMIT ?"
)

ENQUEUE = (
    "INSERT INTO actor_queue (tenant_id, instance_id, group_key, priority, path, seq, event,"
    " available_at, enqueued_at) VALUES (?,?,?,?,?,?,?,?,?)"
)


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _recorded(conn: sqlite3.Connection, tenant: str, effect: Effect | None) -> Any:
    """The journaled result of ``effect`` (None: not performed yet)."""
    if effect is None:
        return None
    row = conn.execute(
        "SELECT result FROM actor_effects WHERE tenant_id=? AND qid=? AND digest=? AND occurrence=?",
        (tenant, effect.qid, effect.digest, effect.occurrence),
    ).fetchone()
    return None if row is None else orjson.loads(row[0])


def _record(conn: sqlite3.Connection, tenant: str, effect: Effect | None, result: Any) -> None:
    if effect is not None:
        conn.execute(
            "INSERT INTO actor_effects VALUES (?,?,?,?,?)",
            (tenant, effect.qid, effect.digest, effect.occurrence, _dumps(result)),
        )


# Append one failed attempt ({number, at, error}: the parameter) to an
# attempt_errors array, up to MAX_ATTEMPT_ERRORS (docs/advanced/failures.md).
APPEND_ATTEMPT = (
    "CASE WHEN json_array_length(coalesce(attempt_errors, '[]')) < " + str(MAX_ATTEMPT_ERRORS) +
    " THEN json_insert(coalesce(attempt_errors, '[]'), '$[#]', json(?)) ELSE attempt_errors END"
)


class SqliteActorStore:
    def __init__(self, db: SqliteDb, appends: SqliteAppends) -> None:
        self._db = db
        self._appends = appends
        # Where each (tenant, worker, shard)'s next claim pass begins (_pick).
        self._claim_from: dict[tuple[str, str, tuple[int, int]], tuple[str, str]] = {}

    async def _write(self, fn, *args):  # noqa: ANN001, ANN202
        return await self._db.write(fn, *args)

    async def _read(self, sql: str, params: Sequence[Any]) -> list[sqlite3.Row]:
        return await self._db.read(lambda: self._db.reader().execute(sql, params).fetchall())

    def _tx(self):  # noqa: ANN202
        return self._db.transaction()

    # --- instances -----------------------------------------------------------

    async def create_instance(
        self, instance: InstanceInfo, effect: Effect | None = None
    ) -> tuple[InstanceInfo, bool]:
        def run() -> tuple[InstanceInfo, bool]:
            with self._tx() as conn:
                recorded = _recorded(conn, instance.tenant, effect)
                if recorded is not None:
                    return InstanceInfo(**recorded), False
                created = self._insert_instance(conn, instance)
                info = instance_from_row(conn.execute(
                    f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                    " WHERE tenant_id=? AND actor=? AND key=?",
                    (instance.tenant, instance.actor, instance.key),
                ).fetchone())
                _record(conn, instance.tenant, effect, dataclasses.asdict(info))
            return info, created

        return await self._write(run)

    async def remove_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        def run() -> InstanceInfo | None:
            with self._tx() as conn:
                row = conn.execute(
                    f"DELETE FROM actor_instances WHERE tenant_id=? AND instance_id=? RETURNING {INSTANCE_COLUMNS}",
                    (tenant, instance_id),
                ).fetchone()
                if row is None:
                    return None
                info = instance_from_row(row)
                for table in ("actor_queue", "actor_schedules", "actor_sqlite", "actor_inputs"):
                    conn.execute(f"DELETE FROM {table} WHERE tenant_id=? AND instance_id=?", (tenant, instance_id))
                forget_instance(conn, tenant, info.actor, instance_id)
                if info.filter is not None:
                    conn.execute(
                        "INSERT INTO routing_versions VALUES (?, 1) ON CONFLICT (tenant_id)"
                        " DO UPDATE SET version = version + 1",
                        (tenant,),
                    )
                self._appends.fact(conn, tenant, instance_fact(INSTANCE_REMOVED, info), self._db.now_ms())
            return info

        return await self._write(run)

    def _insert_instance(self, conn: sqlite3.Connection, i: InstanceInfo) -> bool:
        cur = conn.execute(
            "INSERT INTO actor_instances (tenant_id, instance_id, actor, key, config, filter,"
            " parent_id, worker_id, created_at) VALUES (?,?,?,?,?,?,?,?,?)"
            " ON CONFLICT (tenant_id, actor, key) DO NOTHING",
            (
                i.tenant, i.instance_id, i.actor, i.key, _dumps(i.config),
                None if i.filter is None else _dumps(i.filter), i.parent_id, i.worker_id,
                i.created_at,
            ),
        )
        created = cur.rowcount == 1
        if created:
            self._appends.fact(conn, i.tenant, instance_fact(INSTANCE_CREATED, i), i.created_at)
        if created and i.filter is not None:
            conn.execute(
                "INSERT INTO routing_versions VALUES (?, 1) ON CONFLICT (tenant_id)"
                " DO UPDATE SET version = version + 1",
                (i.tenant,),
            )
        return created

    async def get_instance(self, tenant: str, instance_id: str) -> InstanceInfo | None:
        rows = await self._read(
            f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=? AND instance_id=?",
            (tenant, instance_id),
        )
        return instance_from_row(rows[0]) if rows else None

    async def get_instances(self, tenant: str, instance_ids: Sequence[str]) -> list[InstanceInfo]:
        ids = list(instance_ids)
        found: list[InstanceInfo] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            rows = await self._read(
                f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=?"
                f" AND instance_id IN ({','.join('?' * len(chunk))})",
                (tenant, *chunk),
            )
            found.extend(instance_from_row(r) for r in rows)
        return found

    async def find_instance(self, tenant: str, actor: str, key: str) -> InstanceInfo | None:
        rows = await self._read(
            f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=? AND actor=? AND key=?",
            (tenant, actor, key),
        )
        return instance_from_row(rows[0]) if rows else None

    async def list_instances(
        self, tenant: str, actor: str | None, limit: int, after: str | None
    ) -> list[InstanceInfo]:
        rows = await self._read(
            f"SELECT {INSTANCE_COLUMNS} FROM actor_instances WHERE tenant_id=?"
            " AND (? IS NULL OR actor=?) AND instance_id > ? ORDER BY instance_id LIMIT ?",
            (tenant, actor, actor, after or "", limit),
        )
        return [instance_from_row(r) for r in rows]

    async def routing(self, tenant: str) -> tuple[int, list[InstanceInfo]]:
        def run() -> tuple[int, list[InstanceInfo]]:
            conn = self._db.reader()
            conn.execute("BEGIN")  # one snapshot for the version and the rows
            try:
                version = conn.execute(
                    "SELECT version FROM routing_versions WHERE tenant_id=?", (tenant,)
                ).fetchone()
                rows = conn.execute(
                    f"SELECT {INSTANCE_COLUMNS} FROM actor_instances"
                    " WHERE tenant_id=? AND filter IS NOT NULL",
                    (tenant,),
                ).fetchall()
            finally:
                conn.execute("COMMIT")
            return (version[0] if version else 0), [instance_from_row(r) for r in rows]

        return await self._db.read(run)

    async def tenants(self) -> list[str]:
        rows = await self._read(
            "SELECT tenant_id FROM streams UNION SELECT tenant_id FROM actor_instances", ()
        )
        return [r[0] for r in rows]

    # --- fan-out -------------------------------------------------------------

    async def fanout_lag(self, tenant: str) -> list[FanoutLag]:
        rows = await self._read(
            "SELECT s.path, s.head, coalesce(c.through, 0) FROM streams s"
            " LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
            " WHERE s.tenant_id=? AND s.head > coalesce(c.through, 0)",
            (tenant,),
        )
        return [FanoutLag(r[0], r[1], r[2]) for r in rows]

    async def fanout_cursor(self, tenant: str, path: str) -> int | None:
        rows = await self._read(
            "SELECT coalesce(c.through, 0) FROM streams s LEFT JOIN fanout_cursors c"
            " ON c.tenant_id = s.tenant_id AND c.sid = s.sid WHERE s.tenant_id=? AND s.path=?",
            (tenant, path),
        )
        return rows[0][0] if rows else None

    async def fanout_commit(
        self, tenant: str, path: str, expected: int, through: int, routing_version: int,
        items: Sequence[QueueItem], worker_id: str | None, now: int,
    ) -> Literal["ok", "moved", "stale"]:
        def run() -> Literal["ok", "moved", "stale"]:
            with self._tx() as conn:
                found = conn.execute(
                    "SELECT sid FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
                ).fetchone()
                if found is None:  # deleted since it was read
                    return "moved"
                sid = found[0]
                current = conn.execute(
                    "SELECT through FROM fanout_cursors WHERE tenant_id=? AND sid=?", (tenant, sid)
                ).fetchone()
                if (current[0] if current else 0) != expected:
                    return "moved"
                version = conn.execute(
                    "SELECT version FROM routing_versions WHERE tenant_id=?", (tenant,)
                ).fetchone()
                if (version[0] if version else 0) != routing_version:
                    return "stale"
                self._enqueue(conn, tenant, items, now, worker_id)
                conn.execute(
                    "INSERT INTO fanout_cursors VALUES (?,?,?) ON CONFLICT (tenant_id, sid)"
                    " DO UPDATE SET through=excluded.through",
                    (tenant, sid, through),
                )
            return "ok"

        return await self._write(run)

    def _enqueue(
        self, conn: sqlite3.Connection, tenant: str, items: Sequence[QueueItem], now: int,
        worker_id: str | None,
    ) -> None:
        keyed: dict[tuple[str, str], str] = {}
        rows = []
        for item in items:
            instance_id = item.instance_id
            if instance_id is None:
                assert item.actor is not None and item.key is not None
                pair = (item.actor, item.key)
                if pair not in keyed:
                    self._insert_instance(
                        conn,
                        InstanceInfo(new_instance_id(), tenant, pair[0], pair[1],
                                     worker_id=worker_id, created_at=now),
                    )
                    keyed[pair] = conn.execute(
                        "SELECT instance_id FROM actor_instances WHERE tenant_id=? AND actor=? AND key=?",
                        (tenant, *pair),
                    ).fetchone()[0]
                instance_id = keyed[pair]
            rows.append(
                (
                    tenant, instance_id, item.group_id or "", item.priority, item.path,
                    item.offset, item.event_json, max(item.available_at, now), now,
                )
            )
        conn.executemany(ENQUEUE, rows)

    # --- queue ---------------------------------------------------------------

    async def enqueue(self, tenant: str, items: Sequence[QueueItem], now: int) -> None:
        def run() -> None:
            with self._tx() as conn:
                self._enqueue(conn, tenant, items, now, None)

        await self._write(run)

    async def claim(
        self, tenant: str, worker_id: str, policies: Sequence[Policy], now: int, limit: int,
        done: Sequence[Completion | tuple[int, int]] = (),
        shard: tuple[int, int] = (0, 1),
    ) -> list[QueueRow]:
        by_actor = {p.actor: p for p in policies}

        def run() -> list[QueueRow]:
            with self._tx() as conn:
                self._complete(conn, tenant, done)
                if limit <= 0 or not by_actor:
                    return []
                picked = self._pick(conn, tenant, worker_id, by_actor, now, limit, shard)
                if not picked:
                    return []
                conn.executemany(
                    "UPDATE actor_queue SET status='processing', attempts=attempts+1,"
                    " lease_until=?, worker_id=?, started_at=? WHERE qid=?",
                    [(now + policy.lease_ms, worker_id, now, qid) for _, qid, policy in picked],
                )
                marks = ",".join("?" * len(picked))
                rows = conn.execute(
                    f"SELECT {', '.join('q.' + c.strip() for c in QUEUE_COLUMNS.split(','))},"
                    " i.actor FROM actor_queue q JOIN actor_instances i"
                    " ON i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id"
                    f" WHERE q.qid IN ({marks}) ORDER BY q.priority DESC, q.qid",
                    [qid for _, qid, _ in picked],
                ).fetchall()
            return [queue_row_from_row(r) for r in rows]

        return await self._write(run)

    def _pick(
        self, conn: sqlite3.Connection, tenant: str, worker_id: str, by_actor: dict[str, Policy],
        now: int, limit: int, shard: tuple[int, int],
    ) -> list[tuple[int, int, Policy]]:
        """(priority, qid, policy) of the rows to claim, best first.

        The queued groups are visited in key order from where the last pass
        of this (tenant, worker, shard) stopped, round the end and back, and
        the pass stops once it found ``limit`` rows: a pass costs what it
        claims, not a probe of every queued group (10,000 keyed instances
        with work queued made every pass visit them all), and the groups
        take turns. Order is promised within a group, not across instances
        (docs/basics/actors.md)."""
        found: list[tuple[int, int, Policy]] = []
        resume = (tenant, worker_id, shard)
        start = self._claim_from.get(resume, ("", ""))
        after, wrapped = start, False
        while True:
            found_row = conn.execute(GROUP_FROM, (tenant, *after, worker_id, now)).fetchone()
            row = None if found_row is None else (found_row[0], found_row[1])
            if row is not None and wrapped and row >= start:
                row = None  # round once: back where this pass began
            if row is None:
                if wrapped or start == ("", ""):  # the whole queue seen
                    break
                after, wrapped = ("", ""), True
                continue
            if len(found) >= limit:
                break  # the next pass begins at this group
            instance_id, group = row
            actor, busy = found_row[2], found_row[3]
            if shard[1] > 1 and zlib.crc32(instance_id.encode()) % shard[1] != shard[0]:
                actor = None
            policy = by_actor.get(actor) if actor is not None else None
            if policy is None:  # not this worker's (or shard's) to run: its other groups neither
                after = (instance_id + "\x00", "")  # the next key after this instance's
                continue
            after = (instance_id, group + "\x00")  # the next group of this instance
            free = policy.concurrency - busy
            if free > 0:
                found.extend(
                    (priority, qid, policy)
                    for qid, priority in conn.execute(CLAIMABLE, (tenant, instance_id, group, now, now, free))
                )
        self._claim_from[resume] = row if row is not None else ("", "")
        found.sort(key=lambda c: (-c[0], c[1]))
        return found[:limit]

    def _complete(self, conn: sqlite3.Connection, tenant: str, done: Sequence[Completion | tuple[int, int]]) -> None:
        if not done:
            return
        done = completions(done)
        inputs.record(conn, tenant, done, self._db.now_ms())  # kept as the instance's inputs first
        conn.executemany(
            "DELETE FROM actor_queue WHERE tenant_id=? AND qid=? AND attempts=?"
            " AND status='processing'",
            [(tenant, c.qid, c.attempts) for c in done],
        )

    async def complete(self, tenant: str, done: Sequence[Completion | tuple[int, int]]) -> None:
        await self.claim(tenant, "", (), 0, 0, done)

    async def fail(
        self, tenant: str, qid: int, attempts: int, *, retry_at: int | None, error: str,
        traceback: str, kept: Completion | None = None,
    ) -> None:
        def run() -> None:
            with self._tx() as conn:
                if retry_at is None:  # buried: kept as the instance's input
                    inputs.record(conn, tenant, [kept or Completion(qid, attempts)], self._db.now_ms(),
                                  "dead", error)
                conn.execute(
                    "UPDATE actor_queue SET status=?, available_at=coalesce(?, available_at),"
                    " lease_until=NULL, worker_id=NULL, last_error=?, last_traceback=?,"
                    f" attempt_errors={APPEND_ATTEMPT}"
                    " WHERE tenant_id=? AND qid=? AND attempts=? AND status='processing'",
                    ("dead" if retry_at is None else "pending", retry_at, error, traceback,
                     attempt_error(attempts, self._db.now_ms(), error), tenant, qid, attempts),
                )

        await self._write(run)

    async def queue_rows(
        self, tenant: str, instance_id: str, status: str | None, limit: int
    ) -> list[QueueRow]:
        rows = await self._read(
            f"SELECT {QUEUE_COLUMNS}, (SELECT i.actor FROM actor_instances i"
            "  WHERE i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id)"
            " FROM actor_queue q WHERE tenant_id=? AND instance_id=?"
            " AND (? IS NULL OR status=?) ORDER BY qid LIMIT ?",
            (tenant, instance_id, status, status, limit),
        )
        return [queue_row_from_row(r) for r in rows]

    async def dead_by_instance(self, tenant: str, limit: int) -> list[tuple[str, int]]:
        rows = await self._read(
            "SELECT instance_id, count(*) AS n FROM actor_queue WHERE tenant_id=? AND status='dead'"
            " GROUP BY instance_id ORDER BY n DESC, instance_id LIMIT ?",
            (tenant, limit),
        )
        return [(r[0], r[1]) for r in rows]

    async def queue_depth(self, tenant: str, instance_id: str | None) -> QueueDepth:
        rows = await self._read(
            "SELECT status, count(*) FROM actor_queue WHERE tenant_id=?"
            " AND (? IS NULL OR instance_id=?) GROUP BY status",
            (tenant, instance_id, instance_id),
        )
        return QueueDepth(**{r[0]: r[1] for r in rows})

    def _where_qids(self, qids: Sequence[int] | None) -> tuple[str, list[int]]:
        if qids is None:
            return "", []
        return f" AND qid IN ({','.join('?' * len(qids))})", list(qids)

    async def redrive(
        self, tenant: str, instance_id: str, qids: Sequence[int] | None, now: int, replayed_in: str | None = None
    ) -> int:
        extra, params = self._where_qids(qids)

        def run() -> int:
            with self._tx() as conn:
                return conn.execute(
                    "UPDATE actor_queue SET status='pending', attempts=0, attempt_errors=NULL, available_at=?,"
                    " lease_until=NULL, worker_id=NULL,"
                    " event=CASE WHEN ? IS NULL THEN event ELSE json_set(event, '$.replayed_in', ?) END"
                    " WHERE tenant_id=? AND instance_id=? AND status='dead'" + extra,
                    (now, replayed_in, replayed_in, tenant, instance_id, *params),
                ).rowcount

        return await self._write(run)

    async def drop_dead(self, tenant: str, instance_id: str, qids: Sequence[int] | None) -> int:
        extra, params = self._where_qids(qids)

        def run() -> int:
            with self._tx() as conn:
                return conn.execute(
                    "DELETE FROM actor_queue WHERE tenant_id=? AND instance_id=? AND status='dead'"
                    + extra,
                    (tenant, instance_id, *params),
                ).rowcount

        return await self._write(run)

    async def dead_letters(
        self, tenant: str, *, qid: int | None = None, instance_id: str | None = None,
        actor: str | None = None, path: str | None = None, since: int | None = None,
        until: int | None = None, limit: int = 100,
    ) -> list[QueueRow]:
        rows = await self._read(
            f"SELECT {QUEUE_COLUMNS}, (SELECT i.actor FROM actor_instances i"
            "  WHERE i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id)"
            ", attempt_errors FROM actor_queue q WHERE tenant_id=? AND status='dead'"
            " AND (? IS NULL OR qid=?) AND (? IS NULL OR instance_id=?) AND (? IS NULL OR path=?)"
            " AND (? IS NULL OR instance_id IN"
            "  (SELECT instance_id FROM actor_instances WHERE tenant_id=? AND actor=?))"
            " AND (? IS NULL OR coalesce(started_at, enqueued_at) >= ?)"
            " AND (? IS NULL OR coalesce(started_at, enqueued_at) < ?)"
            " ORDER BY coalesce(started_at, enqueued_at), qid LIMIT ?",
            (tenant, qid, qid, instance_id, instance_id, path, path, actor, tenant, actor,
             since, since, until, until, limit),
        )
        return [queue_row_from_row(r) for r in rows]

    async def dead_letter_times(self, tenant: str, limit: int) -> list[int]:
        rows = await self._read(
            "SELECT coalesce(started_at, enqueued_at) AS at FROM actor_queue WHERE tenant_id=? AND status='dead'"
            " ORDER BY at LIMIT ?",
            (tenant, limit),
        )
        return [r[0] for r in rows]

    async def resolve_dead(
        self, tenant: str, qid: int, *, drop: bool, event_json: str | None, audit: PreparedEvent, path: str,
        now: int, new_stream_id: str,
    ) -> Outcome | None:
        def run() -> Outcome | None:
            with self._tx() as conn:
                if drop:
                    changed = conn.execute(
                        "DELETE FROM actor_queue WHERE tenant_id=? AND qid=? AND status='dead'", (tenant, qid)
                    ).rowcount
                else:
                    changed = conn.execute(
                        "UPDATE actor_queue SET status='pending', attempts=0, attempt_errors=NULL, available_at=?,"
                        " lease_until=NULL, worker_id=NULL, event=coalesce(?, event)"
                        " WHERE tenant_id=? AND qid=? AND status='dead'",
                        (now, event_json, tenant, qid),
                    ).rowcount
                if changed != 1:
                    return None
                committed = self._appends.commit_in(conn, tenant, path, [audit], [0], now, new_stream_id, kernel=True)
                return committed.outcomes[0]

        return await self._write(run)

    async def unfinished(self, actors: Sequence[str]) -> int:
        marks = ",".join("?" * len(actors)) or "NULL"
        rows = await self._read(
            "SELECT (SELECT count(*) FROM actor_queue q JOIN actor_instances i"
            "    ON i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id"
            f"    WHERE q.status <> 'dead' AND i.actor IN ({marks}))"
            " + (SELECT coalesce(sum(s.head - coalesce(c.through, 0)), 0) FROM streams s"
            "    LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
            "    WHERE s.head > coalesce(c.through, 0))",
            list(actors),
        )
        return int(rows[0][0])

    async def agenda(self, tenant: str, now: int) -> Agenda:
        [(runnable, next_due)] = await self._read(
            "SELECT (SELECT count(*) FROM actor_queue WHERE tenant_id = ?1"
            "        AND (status = 'processing' OR (status = 'pending' AND available_at <= ?2)))"
            " + (SELECT coalesce(sum(s.head - coalesce(c.through, 0)), 0) FROM streams s"
            "    LEFT JOIN fanout_cursors c ON c.tenant_id = s.tenant_id AND c.sid = s.sid"
            "    WHERE s.tenant_id = ?1 AND s.head > coalesce(c.through, 0))"
            " + (SELECT count(*) FROM actor_schedules WHERE tenant_id = ?1 AND due_at <= ?2),"
            " (SELECT min(due) FROM (SELECT min(available_at) AS due FROM actor_queue"  # min(a, b) is NULL if either is
            "    WHERE tenant_id = ?1 AND status = 'pending' AND available_at > ?2"
            "  UNION ALL SELECT min(due_at) FROM actor_schedules WHERE tenant_id = ?1 AND due_at > ?2))",
            (tenant, now),
        )
        return Agenda(int(runnable), None if next_due is None else int(next_due))

    async def unfinished_rows(self, tenant: str, actors: Sequence[str], limit: int) -> list[QueueRow]:
        marks = ",".join("?" * len(actors)) or "NULL"
        rows = await self._read(
            f"SELECT {', '.join('q.' + c.strip() for c in QUEUE_COLUMNS.split(','))}, i.actor"
            " FROM actor_queue q JOIN actor_instances i ON i.tenant_id = q.tenant_id AND i.instance_id = q.instance_id"
            f" WHERE q.tenant_id=? AND q.status <> 'dead' AND i.actor IN ({marks})"
            " ORDER BY q.attempts DESC, q.qid LIMIT ?",
            [tenant, *actors, limit],
        )
        return [queue_row_from_row(r) for r in rows]

    # --- workers -------------------------------------------------------------

    async def _exec(self, sql: str, params: Sequence[Any]) -> int:
        def run() -> int:
            with self._tx() as conn:
                return conn.execute(sql, params).rowcount

        return await self._write(run)

    # One machine, one clock: heartbeats take the time here.

    async def register_worker(self, worker_id: str, info: dict[str, Any]) -> None:
        now = self._db.now_ms()
        await self._exec(
            "INSERT INTO runtime_workers VALUES (?, ?, ?, ?)"
            " ON CONFLICT (worker_id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at",
            (worker_id, now, now, _dumps(info)),
        )

    async def heartbeat(self, worker_id: str) -> bool:
        return await self._exec(
            "UPDATE runtime_workers SET heartbeat_at=? WHERE worker_id=?", (self._db.now_ms(), worker_id)
        ) == 1

    async def unregister_worker(self, worker_id: str) -> None:
        def run() -> None:
            with self._tx() as conn:
                conn.execute("DELETE FROM runtime_workers WHERE worker_id=?", (worker_id,))
                conn.execute(
                    "UPDATE actor_instances SET worker_id=NULL WHERE worker_id=?", (worker_id,)
                )

        await self._write(run)

    async def reap_workers(self, by: str, stale_ms: int) -> list[Reaped]:
        def run() -> list[Reaped]:
            now = self._db.now_ms()
            with self._tx() as conn:
                rows = conn.execute(
                    "DELETE FROM runtime_workers WHERE worker_id <> ? AND heartbeat_at < ?"
                    " RETURNING worker_id, heartbeat_at, info",
                    (by, now - stale_ms),
                ).fetchall()
            return [Reaped(r[0], now - r[1], orjson.loads(r[2])) for r in rows]

        return await self._write(run)

    async def live_workers(self) -> list[str]:
        return [r[0] for r in await self._read("SELECT worker_id FROM runtime_workers", ())]

    async def release_instances(self, tenant: str, worker_ids: Sequence[str]) -> int:
        marks = ",".join("?" * len(worker_ids))
        return await self._exec(
            f"UPDATE actor_instances SET worker_id=NULL WHERE tenant_id=? AND worker_id IN ({marks})",
            (tenant, *worker_ids),
        )

    async def release_excess(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> list[str]:
        only = "" if actors is None else f" AND actor IN ({','.join('?' * len(actors)) or 'NULL'})"
        names = [] if actors is None else list(actors)
        idle = (" AND NOT EXISTS (SELECT 1 FROM actor_queue q WHERE q.tenant_id=actor_instances.tenant_id"
                "  AND q.instance_id=actor_instances.instance_id AND q.status='processing')")

        def run() -> list[str]:
            # One writer: no claim of this worker runs meanwhile.
            with self._tx() as conn:
                total, mine = conn.execute(
                    "SELECT count(*), sum(worker_id IS ?) FROM actor_instances WHERE tenant_id=?" + only,
                    (worker_id, tenant, *names),
                ).fetchone()
                excess = (mine or 0) - -(-total // max(workers, 1))
                if excess <= 0:  # at its share (workers left meanwhile): nothing drains
                    conn.execute(
                        "UPDATE actor_instances SET claimable_after=0 WHERE tenant_id=? AND worker_id=?"
                        " AND claimable_after=?", (tenant, worker_id, DRAINING),
                    )
                    return []
                mine_sql = "SELECT instance_id FROM actor_instances WHERE tenant_id=? AND worker_id=?" + only
                released = [r[0] for r in conn.execute(
                    "UPDATE actor_instances SET worker_id=NULL, claimable_after=0 WHERE tenant_id=? AND instance_id IN ("
                    + mine_sql + idle + " ORDER BY claimable_after = ? DESC, instance_id DESC LIMIT ?)"
                    " RETURNING instance_id",
                    (tenant, tenant, worker_id, *names, DRAINING, excess),
                ).fetchall()]
                draining = conn.execute(
                    "SELECT count(*) FROM actor_instances WHERE tenant_id=? AND worker_id=? AND claimable_after=?",
                    (tenant, worker_id, DRAINING),
                ).fetchone()[0]
                conn.execute(
                    "UPDATE actor_instances SET claimable_after=? WHERE tenant_id=? AND instance_id IN ("
                    + mine_sql + " AND claimable_after <> ? ORDER BY instance_id DESC LIMIT ?)",
                    (DRAINING, tenant, tenant, worker_id, *names, DRAINING,
                     max(excess - len(released) - draining, 0)),
                )
                return released

        return await self._write(run)

    async def adopt_instances(
        self, tenant: str, worker_id: str, workers: int, actors: Sequence[str] | None = None
    ) -> int:
        only = "" if actors is None else f" AND actor IN ({','.join('?' * len(actors)) or 'NULL'})"
        names = [] if actors is None else list(actors)

        def run() -> int:
            with self._tx() as conn:
                conn.execute(
                    "UPDATE actor_instances SET worker_id=NULL WHERE tenant_id=?"
                    " AND worker_id IS NOT NULL"
                    " AND worker_id NOT IN (SELECT worker_id FROM runtime_workers)",
                    (tenant,),
                )
                total, mine = conn.execute(
                    "SELECT count(*), sum(worker_id IS ?) FROM actor_instances WHERE tenant_id=?" + only,
                    (worker_id, tenant, *names),
                ).fetchone()
                share = -(-total // max(workers, 1)) - (mine or 0)
                if share <= 0:
                    return 0
                # Rows still processing belong to the previous owners: claim
                # nothing of the instance before their leases end.
                adopted = conn.execute(
                    "UPDATE actor_instances SET worker_id=?, claimable_after=coalesce(("
                    " SELECT max(q.lease_until) FROM actor_queue q WHERE q.tenant_id=actor_instances.tenant_id"
                    " AND q.instance_id=actor_instances.instance_id AND q.status='processing'), 0)"
                    " WHERE tenant_id=? AND instance_id IN ("
                    " SELECT instance_id FROM actor_instances WHERE tenant_id=? AND worker_id IS NULL"
                    + only + f" ORDER BY instance_id LIMIT ?) RETURNING {INSTANCE_COLUMNS}",
                    (worker_id, tenant, tenant, *names, share),
                ).fetchall()
                now = self._db.now_ms()
                for row in sorted(adopted, key=lambda r: r[0]):
                    self._appends.fact(conn, tenant, instance_fact(INSTANCE_ADOPTED, instance_from_row(row)), now)
                return len(adopted)

        return await self._write(run)

    # --- where the per-instance databases live -----------------------------------

    async def record_state_home(self, home: StateHome) -> StateHome:
        await self._exec(
            "INSERT INTO actor_state_home VALUES (1, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (home.storage, home.location, home.label, self._db.now_ms()),
        )
        recorded = await self.state_home()
        assert recorded is not None
        return recorded

    async def state_home(self) -> StateHome | None:
        rows = await self._read("SELECT storage, location, label, recorded_at FROM actor_state_home", ())
        return StateHome(*rows[0]) if rows else None

    # --- per-instance SQLite databases ---------------------------------------

    async def load_state(self, tenant: str, instance_id: str) -> bytes | None:
        rows = await self._read(
            "SELECT data FROM actor_sqlite WHERE tenant_id=? AND instance_id=?", (tenant, instance_id)
        )
        return bytes(rows[0][0]) if rows else None

    async def save_state(self, tenant: str, instance_id: str, data: bytes, now: int) -> None:
        def run() -> None:
            with self._tx() as conn:
                self._save_state(conn, tenant, instance_id, data, now)

        await self._write(run)

    @staticmethod
    def _save_state(conn: sqlite3.Connection, tenant: str, instance_id: str, data: bytes, now: int) -> None:
        conn.execute(
            "INSERT INTO actor_sqlite VALUES (?,?,?,?) ON CONFLICT (tenant_id, instance_id)"
            " DO UPDATE SET data=excluded.data, updated_at=excluded.updated_at",
            (tenant, instance_id, data, now),
        )

    # --- schedules -----------------------------------------------------------

    async def upsert_schedule(self, s: Schedule, effect: Effect | None = None) -> int:
        def run() -> int:
            with self._tx() as conn:
                recorded = _recorded(conn, s.tenant, effect)
                if recorded is not None:
                    return recorded
                self._upsert_schedule(conn, s)
                _record(conn, s.tenant, effect, s.due_at)
            return s.due_at

        return await self._write(run)

    @staticmethod
    def _upsert_schedule(conn: sqlite3.Connection, s: Schedule) -> None:
        conn.execute(
            "INSERT INTO actor_schedules VALUES (?,?,?,?,?,?,?,?)"
            " ON CONFLICT (tenant_id, instance_id, name) DO UPDATE SET due_at=excluded.due_at,"
            " cron=excluded.cron, event=excluded.event, stream=excluded.stream",
            (s.tenant, s.instance_id, s.name, s.due_at, s.cron, _dumps(s.event), s.stream, s.created_at),
        )

    async def cancel_schedule(
        self, tenant: str, instance_id: str, name: str, effect: Effect | None = None
    ) -> bool:
        def run() -> bool:
            with self._tx() as conn:
                recorded = _recorded(conn, tenant, effect)
                if recorded is not None:
                    return recorded
                found = conn.execute(
                    "DELETE FROM actor_schedules WHERE tenant_id=? AND instance_id=? AND name=?",
                    (tenant, instance_id, name),
                ).rowcount == 1
                _record(conn, tenant, effect, found)
            return found

        return await self._write(run)

    async def schedules(self, tenant: str, instance_id: str) -> list[Schedule]:
        rows = await self._read(
            f"SELECT {SCHEDULE_COLUMNS} FROM actor_schedules WHERE tenant_id=? AND instance_id=?"
            " ORDER BY name",
            (tenant, instance_id),
        )
        return [schedule_from_row(r) for r in rows]

    async def due_schedules(self, tenant: str, now: int, limit: int) -> list[Schedule]:
        rows = await self._read(
            f"SELECT {SCHEDULE_COLUMNS} FROM actor_schedules WHERE tenant_id=? AND due_at <= ?"
            " ORDER BY due_at LIMIT ?",
            (tenant, now, limit),
        )
        return [schedule_from_row(r) for r in rows]

    async def fire_schedule(
        self, s: Schedule, next_due: int | None, item: QueueItem | None, now: int
    ) -> bool:
        key = (s.tenant, s.instance_id, s.name)

        def run() -> bool:
            with self._tx() as conn:
                found = conn.execute(
                    "SELECT 1 FROM actor_schedules WHERE tenant_id=? AND instance_id=? AND name=?"
                    " AND due_at=?",
                    (*key, s.due_at),
                ).fetchone()
                if found is None:
                    return False
                if item is not None:
                    self._enqueue(conn, s.tenant, [item], now, None)
                if next_due is None:
                    conn.execute(
                        "DELETE FROM actor_schedules WHERE tenant_id=? AND instance_id=? AND name=?",
                        key,
                    )
                else:
                    conn.execute(
                        "UPDATE actor_schedules SET due_at=? WHERE tenant_id=? AND instance_id=?"
                        " AND name=?",
                        (next_due, *key),
                    )
            return True

        return await self._write(run)

    # --- conversations -------------------------------------------------------

    async def post_message(
        self, tenant: str, path: str, message: Message, event: PreparedEvent, now: int,
        new_stream_id: str, effect: Effect | None = None,
    ) -> tuple[Message | None, Outcome]:
        def run() -> tuple[Message | None, Outcome]:
            with self._tx() as conn:
                recorded = _recorded(conn, tenant, effect)
                if recorded is not None:
                    return message_from_record(recorded)
                outcome = self._appends.commit_in(
                    conn, tenant, path, [event], [0], now, new_stream_id
                ).outcomes[0]
                if outcome.status != "ok":
                    return None, outcome  # refused: no message without its event
                posted = self._insert_message(conn, tenant, message, now, outcome.offset)
                _record(conn, tenant, effect, message_record(posted, outcome))
            return posted, outcome

        return await self._write(run)

    async def commit_run(self, tenant: str, run: RunCommit, now: int) -> tuple[str, str | None]:
        def apply(conn: sqlite3.Connection) -> tuple[str, str | None]:
            inputs.record(conn, tenant, [run.completion()], now)
            if conn.execute(
                "DELETE FROM actor_queue WHERE tenant_id=? AND qid=? AND attempts=? AND status='processing'",
                (tenant, run.qid, run.attempts),
            ).rowcount != 1:
                raise RunUndone("lost")
            for path, appends in run.by_stream():
                events = [a.event for a in appends]
                result = self._appends.commit_in(
                    conn, tenant, path, events, [0] * len(events), now, run.stream_ids[path]
                )
                for a, outcome in zip(appends, result.outcomes):
                    if outcome.status not in ("ok", "duplicate"):
                        raise RunUndone(outcome.status, path)
                    if a.message is not None:
                        self._insert_message(conn, tenant, a.message, now, outcome.offset)
            for op in run.schedules:
                if isinstance(op, str):
                    conn.execute(
                        "DELETE FROM actor_schedules WHERE tenant_id=? AND instance_id=? AND name=?",
                        (tenant, run.instance_id, op),
                    )
                else:
                    self._upsert_schedule(conn, op)
            for info in run.instances:
                self._insert_instance(conn, info)
            if run.state is not None:
                self._save_state(conn, tenant, run.instance_id, run.state, now)
            return "ok", None

        # In the group commit with the appends waiting (one fsync for all);
        # its own savepoint: an undone run rolls back alone.
        try:
            return await self._db.grouped(apply)
        except RunUndone as undone:
            return undone.status, undone.path

    @staticmethod
    def _insert_message(conn: sqlite3.Connection, tenant: str, m: Message, now: int, offset: int | None) -> Message:
        return message_from_row(conn.execute(
            "INSERT INTO conversation_messages (tenant_id, conversation_id, message_id,"
            " role, content, metadata, at, event_seq) VALUES (?,?,?,?,?,?,?,?)"
            f" RETURNING {MESSAGE_COLUMNS}",
            (tenant, m.conversation_id, m.message_id, m.role, _dumps(m.content), _dumps(m.metadata), now, offset),
        ).fetchone())

    async def messages(
        self, tenant: str, conversation_id: str, after: int | None, limit: int
    ) -> list[Message]:
        rows = await self._read(
            f"SELECT {MESSAGE_COLUMNS} FROM conversation_messages WHERE tenant_id=?"
            " AND conversation_id=? AND seq > ? ORDER BY seq LIMIT ?",
            (tenant, conversation_id, after or 0, limit),
        )
        return [message_from_row(r) for r in rows]
