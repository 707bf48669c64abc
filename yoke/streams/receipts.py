"""Append receipts: what proves a record was
appended, and what it held.

A receipt is ``{record_id, sequence, digest, at}``: the record's id, its
sequence (offset), when it was committed, and ``sha256:<hex>`` over the
canonical JSON of everything the appender gave it (type, payload,
metadata, source, correlation, priority, group id, idempotency key) and
its id. It is computed from the record itself, at append time and
whenever it is fetched again, so it cannot disagree with the log; it can
be fetched as long as the record is retained (retention, or a legal hold
that stops it).
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from ..events import Event


def digest(event: Event) -> str:
    body = orjson.dumps(
        {
            "id": event.id, "type": event.type, "payload": event.payload, "metadata": event.metadata,
            "source": event.source, "correlation": event.correlation, "priority": event.priority,
            "group_id": event.group_id, "idempotency_key": event.idempotency_key,
        },
        option=orjson.OPT_SORT_KEYS,
    )
    return "sha256:" + hashlib.sha256(body).hexdigest()


def receipt(event: Event) -> dict[str, Any]:
    return {"record_id": event.id, "sequence": event.offset, "digest": digest(event), "at": event.at}
