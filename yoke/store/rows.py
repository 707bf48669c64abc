"""Row shapes shared by both backends: one SELECT list, one decoder."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..events import Event
from .contract import Retention, StreamInfo

# Column order of every event SELECT in both backends.
EVENT_COLUMNS = (
    "seq, id, at, type, payload, metadata, source, correlation, priority, group_id, idempotency_key"
)
STREAM_COLUMNS = (
    "stream_id, tenant_id, path, created_at, head, pruned_through, closed, legal_hold,"
    " max_age_s, max_events"
)


def _json(value: Any) -> Any:
    if value is None:
        return None
    return orjson.loads(value)


def event_from_row(tenant: str, path: str, row: Sequence[Any]) -> Event:
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
    )


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
    )


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching strings that start with ``prefix`` (escape '\\')."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"
