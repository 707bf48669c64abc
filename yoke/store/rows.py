"""Row shapes shared by both backends: one SELECT list, one decoder."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from .. import errors
from ..events import Event
from .actors import InstanceInfo, Message, QueueRow, Schedule
from .results import ConsumerInfo, Limits, ObjectInfo, Retention, StoredEvent, StreamInfo, TokenInfo, Usage
from .durable_streams import NATIVE_CONTENT_TYPE, ProtocolStream
from .subscriptions import Checkpoint, InboundRecord, SubscriptionRow

# A page of events read as one value (a JSON array: SQLite's long pages,
# PostgreSQL's read_stored) only under a byte cap this small, far below
# either database's string limit (SQLite 1e9, PostgreSQL 1 GiB; JSON
# quoting can double a text).
ONE_ROW_MAX_BYTES = 64 * 1024 * 1024

# Column order of every event SELECT in both backends.
EVENT_COLUMNS = (
    "seq, id, at, type, payload, metadata, source, correlation, priority, group_id, idempotency_key"
)
STREAM_COLUMNS = (
    "stream_id, tenant_id, path, created_at, head, pruned_through, closed, legal_hold,"
    " max_age_s, max_events, max_unread_events, max_unread_bytes, max_total_events,"
    " max_total_bytes, overflow, block_timeout_s, durable_events, durable_bytes,"
    " unread_events, unread_bytes, min_ack, pinned, metadata, data_handling"
)
OBJECT_COLUMNS = (
    "object_id, tenant_id, idempotency_key, sha256, size, content_type, state, created_at,"
    " expires_at, committed_seq, schema_ref, auth_receipt"
)
TOKEN_COLUMNS = "token_id, tenant_id, name, scopes, secret_hash, created_at, revoked_at, expires_at"


def _json(value: Any) -> Any:
    if value is None:
        return None
    return orjson.loads(value)


def event_from_row(tenant: str, path: str, row: Sequence[Any], data: bytes | None = None) -> Event:
    return Event(
        offset=row[0],
        id=row[1],
        at=row[2],
        type=row[3],
        payload=_json(row[4]),
        metadata=_json(row[5]),
        source=_json(row[6]),
        correlation=row[7],
        priority=row[8],
        group_id=row[9],
        idempotency_key=row[10],
        tenant=tenant,
        path=path,
        data=None if data is None else bytes(data),
    )


def stored_event_from_row(tenant: str, path: str, row: Sequence[Any], data: bytes | None = None) -> StoredEvent:
    """The same row as ``event_from_row``, nothing decoded (``read_stored``)."""
    return StoredEvent(row[0], row[3], row[4], None if data is None else bytes(data))


def stream_from_row(row: Sequence[Any]) -> StreamInfo:
    return StreamInfo(
        stream_id=row[0],
        tenant=row[1],
        path=row[2],
        created_at=row[3],
        head=row[4],
        earliest=row[5] + 1,
        closed=bool(row[6]),
        legal_hold=bool(row[7]),
        retention=Retention(max_age_s=row[8], max_events=row[9]),
        limits=Limits(
            max_unread_events=row[10],
            max_unread_bytes=row[11],
            max_total_events=row[12],
            max_total_bytes=row[13],
            overflow=row[14],
            block_timeout_s=row[15],
        ),
        usage=Usage(
            durable_events=row[16],
            durable_bytes=row[17],
            unread_events=row[18],
            unread_bytes=row[19],
            min_ack=row[20],
        ),
        pinned=bool(row[21]),
        metadata=_json(row[22]) or {},
        data_handling=_json(row[23]),
    )


def object_from_row(path: str, row: Sequence[Any]) -> ObjectInfo:
    return ObjectInfo(
        object_id=row[0],
        tenant=row[1],
        path=path,
        idempotency_key=row[2],
        sha256=row[3],
        size=row[4],
        content_type=row[5],
        state=row[6],
        created_at=row[7],
        expires_at=row[8],
        committed_offset=row[9],
        schema=row[10],
        authorization=_json(row[11]),
    )


def token_from_row(row: Sequence[Any]) -> TokenInfo:
    scopes = row[3]
    if isinstance(scopes, str):  # SQLite keeps them comma-separated
        scopes = [s for s in scopes.split(",") if s]
    return TokenInfo(
        token_id=row[0],
        tenant=row[1],
        name=row[2],
        scopes=tuple(scopes),
        secret_hash=row[4],
        created_at=row[5],
        revoked_at=row[6],
        expires_at=row[7],
    )


def consumer_from_row(row: Sequence[Any]) -> ConsumerInfo:
    return ConsumerInfo(consumer_id=row[0], acked=row[1], created_at=row[2], updated_at=row[3])


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with ``prefix`` (escape '\\')."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def check_object_bytes(info: ObjectInfo, data: bytes) -> None:
    """Uploaded bytes must match the size and sha256 digest pinned at prepare."""
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != info.size or digest != info.sha256:
        raise errors.ObjectMismatch(
            "uploaded bytes do not match the prepared size and sha256",
            expected_size=info.size,
            size=len(data),
            expected_sha256=info.sha256,
            sha256=digest,
        )


def credit_lacking(stream: Mapping[str, Any], events: int, size: int) -> str | None:
    """Would adding ``events`` durable events of ``size`` bytes exceed a
    ceiling? 'quota' (total) or 'unread_full' (unread), else None."""

    def over(used: int, limit: int | None, extra: int) -> bool:
        return limit is not None and used + extra > limit

    if over(stream["durable_events"], stream["max_total_events"], events) or over(
        stream["durable_bytes"], stream["max_total_bytes"], size
    ):
        return "quota"
    if stream["min_ack"] is not None and (
        over(stream["unread_events"], stream["max_unread_events"], events)
        or over(stream["unread_bytes"], stream["max_unread_bytes"], size)
    ):
        return "unread_full"
    return None


def setting_changes(
    closed: bool | None,
    legal_hold: bool | None,
    retention: Retention | None,
    limits: Limits | None,
) -> tuple[list[str], list[Any]]:
    """The stream columns (and values) an update_stream call changes."""
    columns: list[str] = []
    values: list[Any] = []
    if closed is not None:
        columns.append("closed")
        values.append(closed)
    if legal_hold is not None:
        columns.append("legal_hold")
        values.append(legal_hold)
    if retention is not None:
        columns += ["max_age_s", "max_events"]
        values += [retention.max_age_s, retention.max_events]
    if limits is not None:
        columns += [
            "max_unread_events", "max_unread_bytes", "max_total_events", "max_total_bytes",
            "overflow", "block_timeout_s",
        ]
        values += [
            limits.max_unread_events, limits.max_unread_bytes, limits.max_total_events,
            limits.max_total_bytes, limits.overflow, limits.block_timeout_s,
        ]
    return columns, values


# --- actors -------------------------------------------------------------------

INSTANCE_COLUMNS = "instance_id, tenant_id, actor, key, config, filter, parent_id, worker_id, created_at"
QUEUE_COLUMNS = (
    "qid, tenant_id, instance_id, group_key, priority, path, seq, event, status, attempts,"
    " available_at, lease_until, worker_id, enqueued_at, started_at, last_error, last_traceback"
)
SCHEDULE_COLUMNS = "tenant_id, instance_id, name, due_at, event, cron, stream, created_at"
MESSAGE_COLUMNS = "conversation_id, message_id, seq, role, content, metadata, at, event_seq"


def instance_from_row(row: Sequence[Any]) -> InstanceInfo:
    return InstanceInfo(
        instance_id=row[0],
        tenant=row[1],
        actor=row[2],
        key=row[3],
        config=_json(row[4]),
        filter=_json(row[5]),
        parent_id=row[6],
        worker_id=row[7],
        created_at=row[8],
    )


def queue_row_from_row(row: Sequence[Any]) -> QueueRow:
    """``row`` is QUEUE_COLUMNS followed by the instance's actor name."""
    return QueueRow(
        qid=row[0],
        tenant=row[1],
        instance_id=row[2],
        group_id=row[3] or None,
        priority=row[4],
        path=row[5],
        offset=row[6],
        event=_json(row[7]),
        status=row[8],
        attempts=row[9],
        available_at=row[10],
        lease_until=row[11],
        worker_id=row[12],
        enqueued_at=row[13],
        started_at=row[14],
        last_error=row[15],
        last_traceback=row[16],
        actor=row[17] or "",
        attempt_errors=_json(row[18]) if len(row) > 18 else None,
    )


def schedule_from_row(row: Sequence[Any]) -> Schedule:
    return Schedule(
        tenant=row[0],
        instance_id=row[1],
        name=row[2],
        due_at=row[3],
        event=_json(row[4]),
        cron=row[5],
        stream=row[6],
        created_at=row[7],
    )


def message_from_row(row: Sequence[Any]) -> Message:
    return Message(
        conversation_id=row[0],
        message_id=row[1],
        seq=row[2],
        role=row[3],
        content=_json(row[4]),
        metadata=_json(row[5]),
        at=row[6],
        offset=row[7],
    )


# --- subscriptions -----------------------------------------------------------

SUBSCRIPTION_COLUMNS = (
    "tenant_id, path, name, config, configured_at, configured_id, configured_ms, generation,"
    " source_stream_id, processed_through_offset, halted, attempts, skips, last_error,"
    " next_retry_at, delivered, failures, secret, lease_owner, lease_until, gave_up, attempt_errors,"
    " last_error_at"
)
# Written by ``control`` and ``write_catalogue`` (every column but the lease).
SUBSCRIPTION_WRITE_COLUMNS = (
    "tenant_id", "path", "name", "config", "configured_at", "configured_id", "configured_ms",
    "generation", "source_stream_id", "processed_through_offset", "halted", "gave_up",
    "attempts", "skips", "last_error", "next_retry_at", "secret", "delivered", "failures", "attempt_errors",
    "last_error_at",
)
# The subscription columns with the source's head, for status and lag; the
# lease runs until its holder's last heartbeat plus its lease (a holder gone
# from delivery_owners holds nothing).
SUBSCRIPTION_WITH_HEAD = (
    "SELECT " + ", ".join(
        "coalesce(o.heartbeat_at + o.lease_ms, 0)" if c.strip() == "lease_until" else "s." + c.strip()
        for c in SUBSCRIPTION_COLUMNS.split(",")
    )
    + ", coalesce(t.head, 0) FROM subscriptions s"
    " LEFT JOIN streams t ON t.tenant_id = s.tenant_id AND t.path = s.path"
    " LEFT JOIN delivery_owners o ON o.owner = s.lease_owner"
)
INBOUND_COLUMNS = (
    "path, source_path, name, source_stream_id, source_created_at, generation, received,"
    " last_received_at"
)
CHECKPOINT_COLUMNS = "tenant_id, path, name, version, stream_id, generation, through, state, complete"


def subscription_from_row(row: Sequence[Any], head: int = 0) -> SubscriptionRow:
    return SubscriptionRow(
        tenant=row[0], path=row[1], name=row[2], config=_json(row[3]), configured_at=row[4],
        configured_id=row[5], configured_ms=row[6], generation=row[7], source_stream_id=row[8],
        cursor=row[9], halted=_json(row[10]), attempts=row[11], skips=row[12],
        last_error=row[13], next_retry_at=row[14], delivered=row[15], failures=row[16],
        secret=row[17], lease_owner=row[18], lease_until=row[19],
        gave_up=tuple(v for v in (row[20] or "").split("|") if v), head=head,
        attempt_errors=tuple(_json(row[21]) or ()), last_error_at=row[22],
    )


def gave_up_text(versions: Sequence[str]) -> str | None:
    """'|v1|v2|': the claim tests membership with one substring search."""
    return "|" + "|".join(versions) + "|" if versions else None


def subscription_values(r: SubscriptionRow) -> tuple[Any, ...]:
    """``r`` in the order of SUBSCRIPTION_WRITE_COLUMNS."""
    return (
        r.tenant, r.path, r.name, orjson.dumps(r.config).decode(), r.configured_at,
        r.configured_id, r.configured_ms, r.generation, r.source_stream_id, r.cursor,
        None if r.halted is None else orjson.dumps(r.halted).decode(),
        gave_up_text(r.gave_up),
        r.attempts, r.skips, r.last_error, r.next_retry_at, r.secret, r.delivered, r.failures,
        orjson.dumps(list(r.attempt_errors)).decode() if r.attempt_errors else None,
        r.last_error_at,
    )


def inbound_from_row(row: Sequence[Any]) -> InboundRecord:
    return InboundRecord(*row)


def checkpoint_from_row(row: Sequence[Any]) -> Checkpoint:
    return Checkpoint(
        tenant=row[0], path=row[1], name=row[2], version=row[3], stream_id=row[4],
        generation=row[5], through=row[6], state=_json(row[7]), complete=bool(row[8]),
    )


# --- the Durable Streams protocol (store/durable_streams.py) -------------------------

PROTOCOL_STREAM_SELECT = (
    "SELECT s.sid, s.stream_id, s.path, s.created_at, s.head, s.pruned_through, s.closed,"
    " p.content_type, p.ttl_s, p.expires_at, p.expires_ms, p.touched_ms, p.fork_of,"
    " p.fork_offset, p.fork_sub, p.stream_seq, p.closed_by, p.deleted"
    " FROM streams s LEFT JOIN protocol_streams p ON p.tenant_id = s.tenant_id AND p.sid = s.sid"
)
# Copies a fork source's events through an offset into the fork, at the same offsets.
PROTOCOL_FORK_COPY = (
    "INSERT INTO events (tenant_id, sid, seq, id, at, type, payload, metadata, source,"
    " correlation, priority, group_id, idempotency_key, fingerprint, size, data)"
    " SELECT tenant_id, {new}, seq, id, at, type, payload, metadata, source, correlation,"
    " priority, group_id, NULL, NULL, size, data FROM events"
    " WHERE tenant_id = {tenant} AND sid = {source} AND seq <= {through}"
)


def protocol_stream_from_row(row: Sequence[Any]) -> ProtocolStream:
    native = row[7] is None
    return ProtocolStream(
        sid=row[0], stream_id=row[1], path=row[2], created_at=row[3], head=row[4],
        pruned_through=row[5], closed=bool(row[6]),
        content_type=NATIVE_CONTENT_TYPE if native else row[7],
        ttl_s=row[8], expires_at=row[9], expires_ms=row[10], touched_ms=row[11] or 0,
        fork_of=row[12], fork_offset=row[13], fork_sub=row[14] or 0, stream_seq=row[15],
        closed_by=row[16], deleted=bool(row[17]), native=native,
    )
