"""The parts of the storage contract every driver hands to one of its
modules unchanged: streams, reads, consumers, objects, tokens.

A driver's store sets ``_streams``, ``_reads``, ``_consumers``, ``_objects``
and ``_tokens`` (its own modules for those concerns) and inherits these
methods; what a driver decides itself (start, commit, the sub-stores) stays
in its ``store.py``.
"""

from __future__ import annotations

from typing import Any

from ..events import PreparedEvent
from .results import (
    ConsumerInfo,
    GapEvidence,
    ObjectInfo,
    Outcome,
    PayloadPage,
    ReadPage,
    Retention,
    StreamInfo,
    StreamSettings,
    StreamTotals,
    TokenInfo,
)


class ConcernParts:
    _streams: Any
    _reads: Any
    _consumers: Any
    _objects: Any
    _tokens: Any

    async def create_stream(
        self, tenant: str, path: str, stream_id: str, now: int, settings: StreamSettings
    ) -> tuple[StreamInfo, bool]:
        return await self._streams.create_stream(tenant, path, stream_id, now, settings)

    async def update_stream(
        self,
        tenant: str,
        path: str,
        *,
        closed: bool | None = None,
        legal_hold: bool | None = None,
        retention: Retention | None = None,
        limits: Limits | None = None,
    ) -> StreamInfo | None:
        return await self._streams.update_stream(
            tenant, path, closed=closed, legal_hold=legal_hold, retention=retention, limits=limits
        )

    async def delete_stream(self, tenant: str, path: str) -> StreamInfo | None:
        return await self._streams.delete_stream(tenant, path)

    async def append_fact(self, tenant: str, event: PreparedEvent, now: int, new_stream_id: str) -> Outcome:
        return await self._streams.append_fact(tenant, event, now, new_stream_id)

    async def prune(self, now: int) -> int:
        return await self._streams.prune(now)

    async def info(self, tenant: str, path: str) -> StreamInfo | None:
        return await self._streams.info(tenant, path)

    async def list_streams(
        self, tenant: str, prefix: str, limit: int, after_path: str | None
    ) -> list[StreamInfo]:
        return await self._streams.list_streams(tenant, prefix, limit, after_path)

    async def stream_totals(self, tenant: str) -> StreamTotals:
        return await self._streams.stream_totals(tenant)

    async def record_gap(
        self, tenant: str, path: str, first: int, last: int, cause: str, at: int, process: str
    ) -> None:
        return await self._streams.record_gap(tenant, path, first, last, cause, at, process)

    async def gaps(self, tenant: str, path: str, limit: int) -> list[GapEvidence]:
        return await self._streams.gaps(tenant, path, limit)

    async def read(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._reads.read(tenant, path, after, limit, max_bytes)

    async def read_stored(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int | None = None
    ) -> ReadPage:
        return await self._reads.read_stored(tenant, path, after, limit, max_bytes)

    async def read_payloads(
        self, tenant: str, path: str, after: int, limit: int, max_bytes: int, type: str
    ) -> PayloadPage | None:
        return await self._reads.read_payloads(tenant, path, after, limit, max_bytes, type)

    async def read_one(self, tenant: str, path: str, offset: int) -> ReadPage:
        return await self._reads.read_one(tenant, path, offset)

    async def ack(
        self, tenant: str, path: str, consumer_id: str, offset: int, now: int
    ) -> ConsumerInfo:
        return await self._consumers.ack(tenant, path, consumer_id, offset, now)

    async def consumers(self, tenant: str, path: str) -> list[ConsumerInfo]:
        return await self._consumers.consumers(tenant, path)

    async def delete_consumer(self, tenant: str, path: str, consumer_id: str) -> bool:
        return await self._consumers.delete_consumer(tenant, path, consumer_id)

    async def prepare_object(
        self, tenant: str, path: str, object_id: str, key: str, sha256: str, size: int,
        content_type: str, now: int, expires_at: int, new_stream_id: str,
        schema: str | None = None, authorization: dict[str, Any] | None = None,
    ) -> ObjectInfo:
        return await self._objects.prepare_object(tenant, path, object_id, key, sha256, size, content_type, now, expires_at, new_stream_id, schema, authorization)

    async def upload_object(self, tenant: str, path: str, object_id: str, data: bytes) -> ObjectInfo:
        return await self._objects.upload_object(tenant, path, object_id, data)

    async def object_info(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        return await self._objects.object_info(tenant, path, object_id)

    async def object_data(self, tenant: str, path: str, object_id: str) -> bytes | None:
        return await self._objects.object_data(tenant, path, object_id)

    async def abort_object(self, tenant: str, path: str, object_id: str) -> ObjectInfo | None:
        return await self._objects.abort_object(tenant, path, object_id)

    async def cleanup_objects(self, now: int) -> int:
        return await self._objects.cleanup_objects(now)

    async def pending_deletions(self) -> int:
        return await self._objects.pending_deletions()

    async def create_token(self, token: TokenInfo) -> None:
        return await self._tokens.create_token(token)

    async def find_token(self, token_id: str) -> TokenInfo | None:
        # The one read across tenants (PostgreSQL: a SECURITY DEFINER function
        # returning this id's row; the table's policy is tenant-bound).
        return await self._tokens.find_token(token_id)

    async def list_tokens(self, tenant: str) -> list[TokenInfo]:
        return await self._tokens.list_tokens(tenant)

    async def revoke_token(self, tenant: str, token_id: str, now: int) -> bool:
        return await self._tokens.revoke_token(tenant, token_id, now)
