"""Fork rules shared by both backends (no SQL): which source and offset a
fork takes, what it inherits of the source's settings, and the partial
message a byte sub-offset cuts from the source."""

from __future__ import annotations

from typing import Any

from .. import errors
from ..events import PreparedEvent, new_event_id
from .durable_streams import CreateSpec, ProtocolStream

JSON = "application/json"
BYTES_TYPE = "ds.bytes"


def base_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def check_fork(
    source: ProtocolStream | None, spec: CreateSpec, now: int
) -> tuple[ProtocolStream, int, str, int | None, str | None, int | None]:
    """The source, the offset the fork inherits through, and the fork's
    content type, TTL and expiry (requested, else the source's)."""
    if source is None or source.expired(now):
        raise errors.StreamNotFound(f"fork source {spec.fork_of} does not exist", path=spec.fork_of)
    if source.deleted:
        raise errors.StreamExists(f"fork source {spec.fork_of} was deleted (forks of it live on)", path=spec.fork_of)
    if spec.content_type is not None and base_type(spec.content_type) != base_type(source.content_type):
        raise errors.StreamExists(
            "a fork's content type must be its source's", path=spec.fork_of, content_type=source.content_type
        )
    through = source.head if spec.fork_offset is None else spec.fork_offset
    if through > source.head:
        raise errors.InvalidInput(
            "fork offset is beyond the source's tail", field="Stream-Fork-Offset", latest=source.head
        )
    if through < source.pruned_through:
        raise errors.CursorGone("the source no longer holds the fork offset", requested=through)
    ttl_s, expires_at, expires_ms = spec.ttl_s, spec.expires_at, spec.expires_ms
    if ttl_s is None and expires_at is None:
        ttl_s, expires_at, expires_ms = source.ttl_s, source.expires_at, source.expires_ms
    return source, through, spec.content_type or source.content_type, ttl_s, expires_at, expires_ms


def sub_offset_prefix(
    source: ProtocolStream, through: int, sub: int, next_row: Any
) -> tuple[int, PreparedEvent | None]:
    """Resolve ``Stream-Fork-Sub-Offset``: on a JSON stream, ``sub`` more
    messages (events) are inherited; on a byte stream, the first ``sub``
    bytes of the next message, as the fork's first own message.
    ``next_row`` is (type, data) of the source's event after ``through``."""
    if base_type(source.content_type) == JSON:
        if through + sub > source.head:
            raise errors.InvalidInput("the fork sub-offset is past the source's tail", field="Stream-Fork-Sub-Offset")
        return through + sub, None
    data = None if next_row is None else next_row[1]
    if data is None or sub > len(data):
        raise errors.InvalidInput(
            "the fork sub-offset is past the next message", field="Stream-Fork-Sub-Offset"
        )
    return through, bytes_event(bytes(data[:sub]))


def bytes_event(data: bytes) -> PreparedEvent:
    """A byte stream's message as an event: type ``ds.bytes``, payload null,
    the bytes in ``data``; its size is the bytes' length."""
    return PreparedEvent(
        id=new_event_id(), type=BYTES_TYPE, payload_json="null", metadata_json="{}", source_json=None,
        correlation=None, priority=0, group_id=None, idempotency_key=None, ephemeral=False,
        fingerprint=None, size=len(data) + 16, data=data,
    )
