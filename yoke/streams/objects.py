"""Large objects: prepare -> upload -> commit (one record that references the
object) or abort; expired uncommitted objects are removed by a cleanup pass.
docs/advanced/objects.md is the guide.

The record and the object's committed state are written in one transaction
(the store binds the object while appending the record), so a record is
visible only once the object and its metadata agree, and the bytes are
served only from then on. Committing a committed object returns the
original offset: the answer comes from the object's own row, never from a
record that merely holds the object's key (the store counts such a
duplicate only when that record committed the object).

Expiry is terminal: a prepared or uploaded object past ``expires_at`` is
reported ``expired`` (derived at read time, never stored) and can be neither
uploaded nor committed; a legal hold only keeps cleanup from deleting it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from .. import errors
from ..events import AppendResult, Event, check_text, prepare
from ..store.contract import ObjectInfo, Store
from .append import new_stream_id
from .rules import APPEND, READ, Admission

if TYPE_CHECKING:
    from .kernel import StreamKernel


class ObjectsStream(Protocol):
    """What the object flow asks of its stream's handle (``handle.Stream``)."""

    kernel: StreamKernel
    tenant: str
    path: str

    async def admission(self, action: str) -> Admission: ...

    async def _get(self, offset: int) -> Event: ...

MAX_OBJECT_BYTES = 32 * 1024 * 1024
MAX_EXPIRY_S = 7 * 24 * 3600
MIN_EXPIRY_S = 1  # an object is never born expired
SHA256_RE = re.compile(r"[0-9a-f]{64}")
OBJECT_ID_RE = re.compile(r"obj_[0-9a-f]{24}")
CONTENT_TYPE_RE = re.compile(r"[\x20-\x7e]{1,255}")  # it is sent back as a header
SCHEMA_RE = re.compile(r"[\x20-\x7e]{1,512}")
DEFAULT_RECORD_TYPE = "object.committed"


def object_reference(info: ObjectInfo) -> dict[str, Any]:
    return {
        "object_id": info.object_id,
        "sha256": info.sha256,
        "size": info.size,
        "content_type": info.content_type,
    }


def as_of(info: ObjectInfo, now: int) -> ObjectInfo:
    """The object's state at ``now``: an unfinished object past its expiry is expired."""
    if info.state in ("prepared", "uploaded") and info.expires_at < now:
        return replace(info, state="expired")
    return info


def _check_object_id(object_id: Any) -> None:
    if not isinstance(object_id, str) or not OBJECT_ID_RE.fullmatch(object_id):
        raise errors.ObjectNotFound(f"no object {str(object_id)[:80]!r}", object_id=str(object_id)[:80])


class StreamObjects:
    """``stream.objects``: the large-object flow for one stream."""

    def __init__(self, stream: ObjectsStream) -> None:
        self.stream = stream

    @property
    def store(self) -> Store:
        return self.stream.kernel.store()

    async def prepare(
        self,
        *,
        idempotency_key: str,
        sha256: str,
        size: int,
        content_type: str = "application/octet-stream",
        expires_in_s: float = 3600,
        schema: str | None = None,
        authorized_by: Mapping[str, Any] | None = None,
    ) -> ObjectInfo:
        """Pin an upload: the same idempotency key returns the same object.

        Prepare pins the scope, idempotency key, digest, size, schema,
        authorization receipt, expiry and a server-owned key.
        ``schema`` names what the bytes follow (a URI or id, up to 512
        characters); ``authorized_by`` (``{"subject", "scopes"}``: the HTTP
        surfaces pass the token) becomes the object's authorization receipt,
        ``{subject, scopes, tenant, at, intent}``, ``intent`` the sha256 of
        everything pinned. A repeat gets the original object and receipt."""
        if not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 256:
            raise errors.InvalidIdempotencyKey()
        check_text(idempotency_key, "idempotency_key", errors.InvalidIdempotencyKey)
        if not isinstance(sha256, str) or not SHA256_RE.fullmatch(sha256):
            raise errors.InvalidInput("sha256 must be 64 lowercase hex digits", field="sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise errors.InvalidInput("size must be a non-negative integer", field="size")
        if size > MAX_OBJECT_BYTES:
            raise errors.ObjectTooLarge(
                f"objects are at most {MAX_OBJECT_BYTES} bytes", size=size, limit=MAX_OBJECT_BYTES
            )
        if not isinstance(content_type, str) or not CONTENT_TYPE_RE.fullmatch(content_type):
            raise errors.InvalidInput(
                "content_type must be 1-255 printable ASCII characters", field="content_type"
            )
        if (
            isinstance(expires_in_s, bool)
            or not isinstance(expires_in_s, (int, float))
            or not MIN_EXPIRY_S <= expires_in_s <= MAX_EXPIRY_S
        ):
            raise errors.InvalidInput(
                f"expires_in_s must be in [{MIN_EXPIRY_S}, {MAX_EXPIRY_S}]", field="expires_in_s"
            )
        if schema is not None and (not isinstance(schema, str) or not SCHEMA_RE.fullmatch(schema)):
            raise errors.InvalidInput("schema must be 1-512 printable ASCII characters", field="schema")
        await self.stream.admission(APPEND)
        now = self.stream.kernel.now_ms()
        expires_at = now + int(expires_in_s * 1000)
        receipt = None
        if authorized_by is not None:
            intent = orjson.dumps(
                {"tenant": self.stream.tenant, "path": self.stream.path, "idempotency_key": idempotency_key,
                 "sha256": sha256, "size": size, "content_type": content_type, "schema": schema},
                option=orjson.OPT_SORT_KEYS,
            )
            receipt = {
                "subject": authorized_by.get("subject"), "scopes": list(authorized_by.get("scopes") or ()),
                "tenant": self.stream.tenant, "at": now, "intent": "sha256:" + hashlib.sha256(intent).hexdigest(),
            }
        info = await self.store.prepare_object(
            self.stream.tenant, self.stream.path, "obj_" + secrets.token_hex(12), idempotency_key,
            sha256, size, content_type, now, expires_at, new_stream_id(), schema, receipt,
        )
        if (info.sha256, info.size, info.content_type, info.schema) != (sha256, size, content_type, schema):
            raise errors.IdempotencyConflict(
                "idempotency key already used for a different object", keys=[idempotency_key]
            )
        return as_of(info, self.stream.kernel.now_ms())

    async def upload(self, object_id: str, data: bytes) -> ObjectInfo:
        """Store the bytes (retrying an upload is harmless); refused once expired."""
        _check_object_id(object_id)
        if len(data) > MAX_OBJECT_BYTES:
            raise errors.ObjectTooLarge(
                f"objects are at most {MAX_OBJECT_BYTES} bytes", size=len(data), limit=MAX_OBJECT_BYTES
            )
        await self.stream.admission(APPEND)
        info = await self._info(object_id)
        if info.state == "expired":
            raise errors.ObjectStateConflict(f"object {object_id} expired", state="expired")
        info = await self.store.upload_object(self.stream.tenant, self.stream.path, object_id, data)
        return as_of(info, self.stream.kernel.now_ms())

    async def commit(
        self,
        object_id: str,
        *,
        type: str = DEFAULT_RECORD_TYPE,  # noqa: A002 - the event field's name
        payload: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> AppendResult:
        """Append the record that references the object, binding the object
        in the same transaction. Idempotent: once the object is committed,
        any valid commit of it returns the original ``{offset, id}`` and
        appends nothing, whatever its type, payload and metadata."""
        _check_object_id(object_id)
        if payload is not None and not isinstance(payload, Mapping):
            raise errors.InvalidInput("an object record's payload must be an object", field="payload")
        (await self.stream.admission(APPEND)).check_records([{"metadata": metadata}])
        info = await self._info(object_id)
        if info.state not in ("uploaded", "committed"):
            raise errors.ObjectStateConflict(f"object {object_id} is {info.state}", state=info.state)
        record = {
            "type": type,
            "payload": {**(payload or {}), "object": object_reference(info)},
            "metadata": dict(metadata or {}),
            "idempotency_key": f"object:{object_id}",
        }
        event = prepare(
            record, kernel_key=True, max_event_bytes=self.stream.kernel.max_event_bytes
        )
        event.object_id = object_id
        if info.state == "committed":
            return await self._original(info)
        try:
            (result,) = await self.stream.kernel.appends.append(
                self.stream.tenant, self.stream.path, [event]
            )
        except (errors.IdempotencyConflict, errors.ObjectStateConflict) as exc:
            # A concurrent commit of the object won (with another body), or
            # the object changed meanwhile (aborted, expired), or its key is
            # held by a record that did not commit it: the object's row decides.
            info = await self._info(object_id)
            if info.state == "committed":
                return await self._original(info)
            if isinstance(exc, errors.IdempotencyConflict):
                raise
            raise errors.ObjectStateConflict(
                f"object {object_id} is {info.state} and was not committed", state=info.state
            ) from None
        return result

    async def _original(self, info: ObjectInfo) -> AppendResult:
        """The committed object's record (``CursorGone`` once retention removed it)."""
        assert info.committed_offset is not None
        record = await self.stream._get(info.committed_offset)
        return AppendResult(record.offset, record.id, record.at)

    async def abort(self, object_id: str) -> ObjectInfo:
        _check_object_id(object_id)
        await self.stream.admission(APPEND)
        info = await self.store.abort_object(self.stream.tenant, self.stream.path, object_id)
        if info is None:
            raise errors.ObjectNotFound(f"no object {object_id}", object_id=object_id)
        return info

    async def info(self, object_id: str) -> ObjectInfo:
        await self.stream.admission(READ)
        return await self._info(object_id)

    async def _info(self, object_id: str) -> ObjectInfo:
        _check_object_id(object_id)
        info = await self.store.object_info(self.stream.tenant, self.stream.path, object_id)
        if info is None:
            raise errors.ObjectNotFound(f"no object {object_id}", object_id=object_id)
        return as_of(info, self.stream.kernel.now_ms())

    async def data(self, object_id: str) -> bytes:
        """The bytes of a committed object (``ObjectNotCommitted`` before)."""
        _check_object_id(object_id)
        await self.stream.admission(READ)
        data = await self.store.object_data(self.stream.tenant, self.stream.path, object_id)
        if data is None:
            info = await self._info(object_id)
            raise errors.ObjectNotCommitted(
                f"object {object_id} is {info.state}: its bytes are served once it is committed",
                state=info.state,
            )
        return data
