"""The steps of an append on SQLite, inside the caller's write transaction
on the writer thread: the stream's row (created when missing), then
idempotency keys, object bindings, producer credit, offsets and rows, as
PostgreSQL's ``yoke_append`` takes them. ``Store.commit`` runs them in the
writer's group commit; the other parts of the store (facts, subscription
control events, copies, atomic runs, Durable Streams, the outbox) run them
in transactions of their own."""

from __future__ import annotations

import itertools
import operator
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ...events import PreparedEvent, any_ephemeral, any_object, idempotency_keys, size_of
from ...lifecycle import GLOBAL, STREAM_CREATED, new_stream_id, stream_fact
from ..results import Admitted, CommitResult, Outcome, StreamSettings
from ..rows import credit_lacking
from .connection import SqliteDb
from .group_writes import Block, GroupWrites


def _bind_object(conn: sqlite3.Connection, tenant: str, sid: int, object_id: str, seq: int) -> None:
    """The uploaded object is committed by the record at ``seq``."""
    conn.execute(
        "UPDATE objects SET state='committed', committed_seq=?"
        " WHERE tenant_id=? AND sid=? AND object_id=? AND state='uploaded'",
        (seq, tenant, sid, object_id),
    )


_batch_of_pair = operator.itemgetter(0)
_size_of_pair = operator.itemgetter(1)


def batch_counts(
    events: Sequence[PreparedEvent], batch_of: Sequence[int], prior: Mapping[str, Any]
) -> dict[int, list[int]]:
    """Per caller batch: [durable events, their bytes, events that take an
    offset] (an event whose idempotency key is stored takes none)."""
    per_batch: dict[int, list[int]] = {}
    if not prior and not any_ephemeral(events):
        # Most commits: every event new and durable, each batch's events
        # side by side: counted a batch at a time, the events at C speed.
        for b, members in itertools.groupby(zip(batch_of, map(size_of, events)), _batch_of_pair):
            pairs = list(members)
            counts = per_batch.setdefault(b, [0, 0, 0])
            counts[0] += len(pairs)
            counts[1] += sum(map(_size_of_pair, pairs))
            counts[2] += len(pairs)
        return per_batch
    for i, e in enumerate(events):
        counts = per_batch.setdefault(batch_of[i], [0, 0, 0])
        if e.idempotency_key not in prior:
            counts[2] += 1  # takes an offset
            if not e.ephemeral:
                counts[0] += 1
                counts[1] += e.size
    return per_batch


class SqliteAppends:
    def __init__(self, db: SqliteDb) -> None:
        self._db = db

    @staticmethod
    def stream_row(conn: sqlite3.Connection, tenant: str, path: str) -> sqlite3.Row | None:
        return conn.execute(
            "SELECT * FROM streams WHERE tenant_id=? AND path=?", (tenant, path)
        ).fetchone()

    def ensure_stream(
        self, conn: sqlite3.Connection, tenant: str, path: str, stream_id: str, now: int,
        settings: StreamSettings | None = None,
    ) -> tuple[sqlite3.Row, bool]:
        """The stream's row, the stream created when missing; (row, created)."""
        db = self._db
        cached = db.kept_row(tenant, path)
        if cached is not None:
            return cached, False  # type: ignore[return-value]  # read like a row
        db.write_held(conn)  # the row must show the advances held back
        row = self.stream_row(conn, tenant, path)
        if row is not None:
            db.keep_row(tenant, path, row)
            return row, False
        sid = conn.execute("SELECT coalesce(max(sid), 0) + 1 FROM streams").fetchone()[0]
        st = settings or StreamSettings()
        lim = st.limits
        conn.execute(
            "INSERT INTO streams (tenant_id, path, sid, stream_id, created_at, max_age_s,"
            " max_events, max_unread_events, max_unread_bytes, max_total_events,"
            " max_total_bytes, overflow, block_timeout_s, pinned, metadata, data_handling)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                tenant, path, sid, stream_id, now, st.retention.max_age_s,
                st.retention.max_events, lim.max_unread_events, lim.max_unread_bytes,
                lim.max_total_events, lim.max_total_bytes, lim.overflow, lim.block_timeout_s,
                int(st.pinned), orjson.dumps(st.metadata).decode(),
                None if st.data_handling is None else orjson.dumps(st.data_handling).decode(),
            ),
        )
        if path != GLOBAL:  # the global stream's own creation would take its offset 1
            self.fact(conn, tenant, stream_fact(STREAM_CREATED, path, stream_id, created_at=now), now)
        row = self.stream_row(conn, tenant, path)
        assert row is not None
        return row, True

    def fact(self, conn: sqlite3.Connection, tenant: str, event: PreparedEvent, now: int) -> Outcome:
        """A lifecycle fact on the tenant's global stream, in the caller's transaction."""
        return self.commit_in(conn, tenant, GLOBAL, [event], [0], now, new_stream_id(), kernel=True).outcomes[0]

    def commit_in(
        self,
        conn: sqlite3.Connection,
        tenant: str,
        path: str,
        events: Sequence[PreparedEvent],
        batch_of: Sequence[int],
        now: int,
        new_stream_id: str,
        *,
        kernel: bool = False,
        stream: sqlite3.Row | None = None,
    ) -> CommitResult:
        # The same steps as yoke_append in the PostgreSQL schema, inside the
        # caller's write transaction. ``kernel``: subscription bookkeeping
        # (control events, audit lines) that a closed or full stream still takes.
        # ``stream``: the stream's row, when the caller read it in this transaction.
        db = self._db
        s = stream if stream is not None else self.ensure_stream(conn, tenant, path, new_stream_id, now)[0]
        sid, head = s["sid"], s["head"]

        # 1. Idempotency keys, under the write lock.
        prior: dict[str, tuple[int, str, int, str]] = {}
        keys = idempotency_keys(events)
        if keys:
            db.write_held(conn)  # a key may be in a row this group holds back
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for key, seq, eid, at, fp in conn.execute(
                "SELECT idempotency_key, seq, id, at, fingerprint FROM event_rows"
                f" WHERE tenant_id=? AND sid=? AND idempotency_key IN ({marks})",
                (tenant, sid, *chunk),
            ):
                prior[key] = (seq, eid, at, fp)
        refused: dict[int, str] = {}
        for i, e in enumerate(events if prior else ()):
            key = e.idempotency_key
            if key in prior and prior[key][3] != e.fingerprint:
                refused[batch_of[i]] = "conflict"

        # 2. Object bindings: a new record may only reference an uploaded
        # object that has not expired; a duplicate counts only when its
        # object was committed by the record the key found.
        has_objects = any_object(events)
        for i, e in enumerate(events if has_objects else ()):
            if e.object_id is None:
                continue
            obj = conn.execute(
                "SELECT state, expires_at, committed_seq FROM objects"
                " WHERE tenant_id=? AND sid=? AND object_id=?",
                (tenant, sid, e.object_id),
            ).fetchone()
            if e.idempotency_key in prior:
                bound = obj is not None and obj[0] == "committed" and obj[2] == prior[e.idempotency_key][0]
            else:
                bound = obj is not None and obj[0] == "uploaded" and obj[1] >= now
            if not bound:
                refused.setdefault(batch_of[i], "object")

        # 3. Producer credit, batch by batch, from the durable counters.
        per_batch = batch_counts(events, batch_of, prior)
        added_events = added_bytes = 0
        lack: str | None = None
        for batch, (n_events, n_bytes, n_fresh) in sorted(per_batch.items()):
            if batch in refused:
                continue
            if s["closed"] and n_fresh and not kernel:
                # A closed stream takes nothing new; pure retries still
                # get their original offsets.
                refused[batch] = "closed"
                continue
            if lack is None and n_events and not kernel:
                lack = credit_lacking(s, added_events + n_events, added_bytes + n_bytes)
            if lack is not None:
                refused[batch] = lack
                continue
            added_events += n_events
            added_bytes += n_bytes

        # 4. Number the admitted new events, insert the durable ones, bind objects.
        outcomes: Sequence[Outcome]
        if not refused and not prior:  # the common case: every event taken, in one pass
            outcomes = Admitted(head + 1, events, now)
            seqs: Sequence[int] = range(head + 1, head + 1 + len(events))
            durable: Sequence[PreparedEvent] = events
            if any_ephemeral(events):  # they take offsets, not rows
                kept = [(seq, e) for seq, e in zip(seqs, events) if not e.ephemeral]
                seqs, durable = [seq for seq, _ in kept], [e for _, e in kept]
            for seq, e in enumerate(events if has_objects else (), head + 1):
                if e.object_id is not None:
                    _bind_object(conn, tenant, sid, e.object_id, seq)
            head += len(events)
        else:
            outcomes = []
            seqs, durable = [], []
            for i, e in enumerate(events):
                if batch_of[i] in refused:
                    outcomes.append(Outcome(refused[batch_of[i]], None, e.id, now))  # type: ignore[arg-type]
                elif e.idempotency_key in prior:
                    seq, eid, at, _ = prior[e.idempotency_key]
                    outcomes.append(Outcome("duplicate", seq, eid, at))
                else:
                    head += 1
                    outcomes.append(Outcome("ok", head, e.id, now))
                    if not e.ephemeral:
                        seqs.append(head)
                        durable.append(e)
                    if e.object_id is not None:
                        _bind_object(conn, tenant, sid, e.object_id, head)
        unread = 0 if s["min_ack"] is None else 1
        group = db.held
        held = group if group is not None else GroupWrites()
        if seqs:
            held.blocks.append(Block(tenant, sid, now, seqs, durable))
        held.advance(tenant, sid, head, added_events, added_bytes, bool(unread))
        if group is None:
            held.write(conn)  # in a savepoint or a transaction of its own: now
        cached = db.kept_row(tenant, path)
        if cached is not None:  # s is the row as it was before this commit
            cached.update(
                head=head, durable_events=s["durable_events"] + added_events,
                durable_bytes=s["durable_bytes"] + added_bytes,
                unread_events=s["unread_events"] + added_events * unread,
                unread_bytes=s["unread_bytes"] + added_bytes * unread,
            )
        return CommitResult(outcomes=outcomes, head=head)
