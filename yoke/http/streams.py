"""``/v1/streams``: append, read, tail, settings.

A stream path is part of the URL and may contain ``/``; a segment that is
exactly ``-`` separates it from an action (stream paths cannot contain such
a segment), so ``/v1/streams/orders/eu/-/events`` is always "the events of
stream /orders/eu", never a stream called ``/orders/eu/-/events``. The root
stream ``/`` is ``/v1/streams/`` and ``/v1/streams/-/events``.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import Response

from .. import errors
from ..events import check_text
from ..routing.filters import Filter
from ..runtime import Runtime
from ..store.contract import Limits, StreamInfo
from ..streams.handle import Stream
from ..streams.tail import PAGE_BYTES
from .auth import ADMIN, APPEND, READ, Principal, runtime_of
from .responses import ERROR_RESPONSES, ErrorBody, json_body, json_body_bytes, json_response, parse_json
from .sse import resolve_cursor, tail_response

router = APIRouter(prefix="/v1/streams", tags=["streams"], responses=ERROR_RESPONSES)

PATH_PARAM = Path(description="The stream path, e.g. /orders/eu ('' for the root stream '/')")

EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type"],
    "additionalProperties": False,
    "properties": {
        "type": {"type": "string", "pattern": "^[A-Za-z0-9._:/@+\\-]{1,256}$"},
        "payload": {},
        "metadata": {"type": "object"},
        "source": {"type": "object"},
        "correlation": {"type": "string"},
        "priority": {"type": "integer"},
        "group_id": {"type": "string"},
        "idempotency_key": {"type": "string"},
        "ephemeral": {"type": "boolean"},
    },
}
APPEND_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "oneOf": [
                        EVENT_SCHEMA,
                        {"type": "array", "items": EVENT_SCHEMA, "minItems": 1, "maxItems": 10000},
                    ]
                }
            }
        },
    }
}


def stream_of(request: Request, principal: Principal, path: str) -> Stream:
    return stream_of_principal(runtime_of(request), principal, path)


def stream_of_principal(runtime: Runtime, principal: Principal, path: str) -> Stream:
    return runtime.stream(path or "/", tenant=principal.tenant)


def info_dict(info: StreamInfo) -> dict[str, Any]:
    return {
        "stream_id": info.stream_id,
        "tenant": info.tenant,
        "path": info.path,
        "created_at": info.created_at,
        "head": info.head,
        "earliest": info.earliest,
        "closed": info.closed,
        "legal_hold": info.legal_hold,
        "pinned": info.pinned,
        "metadata": info.metadata,
        "retention": {"max_age_s": info.retention.max_age_s, "max_events": info.retention.max_events},
        "limits": limits_dict(info.limits),
        "usage": {
            "durable_events": info.usage.durable_events,
            "durable_bytes": info.usage.durable_bytes,
            "unread_events": info.usage.unread_events,
            "unread_bytes": info.usage.unread_bytes,
            "min_ack": info.usage.min_ack,
        },
    }


def limits_dict(limits: Limits) -> dict[str, Any]:
    return {
        "max_unread_events": limits.max_unread_events,
        "max_unread_bytes": limits.max_unread_bytes,
        "max_total_events": limits.max_total_events,
        "max_total_bytes": limits.max_total_bytes,
        "overflow": limits.overflow,
        "block_timeout_s": limits.block_timeout_s,
    }


def limits_from(body: Any) -> Limits:
    if body is None:
        return Limits()
    if not isinstance(body, dict):
        raise errors.InvalidInput("limits must be an object", field="limits")
    known = set(limits_dict(Limits()))
    unknown = set(body) - known
    if unknown:
        raise errors.InvalidInput(f"unknown limit(s): {', '.join(sorted(unknown))}", field="limits")
    return Limits(**body)


def object_body(body: Any, allowed: set[str], what: str = "body") -> dict[str, Any]:
    if not isinstance(body, dict):
        raise errors.InvalidInput(f"the {what} must be a JSON object", field=what)
    unknown = set(body) - allowed
    if unknown:
        raise errors.InvalidInput(f"unknown field(s): {', '.join(sorted(unknown))}", field=what)
    return body


# --- append and read -----------------------------------------------------------


async def append_body(stream: Stream, body: Any, idempotency_key: str | None) -> Response:
    """A single event object or a list of them; 201 with offsets and ids."""
    if isinstance(body, list):
        if not body:
            raise errors.InvalidInput("a batch holds at least one event", field="body")
        if idempotency_key is not None:
            raise errors.InvalidInput(
                "Idempotency-Key applies to single events; give each batch event its idempotency_key",
                field="Idempotency-Key",
            )
        results = await stream.append_many(body)
        return json_response(
            {"results": [{"offset": r.offset, "id": r.id} for r in results]}, status_code=201
        )
    if isinstance(body, dict) and idempotency_key is not None:
        if body.get("idempotency_key", idempotency_key) != idempotency_key:
            raise errors.InvalidInput(
                "the Idempotency-Key header and the body's idempotency_key differ", field="Idempotency-Key"
            )
        body = {**body, "idempotency_key": idempotency_key}
    result = await stream.append(body)
    return json_response({"offset": result.offset, "id": result.id}, status_code=201)


PAGE_LIMIT = (
    "At most this many events; a page also stops at 1 MiB of them (the first event whatever its size):"
    " read on from next_after until events is empty"
)


async def read_page(stream: Stream, after: int, limit: int, include_ephemeral: bool) -> Response:
    """A page of events; 404 ``stream_not_found`` for a stream never created
    (as its info), where Python's ``Stream.read`` returns ``[]``. At most
    ``limit`` events and ``PAGE_BYTES`` of them (the first whatever its
    size): a shorter page is not the end, an empty one is; ``next_after`` is
    the cursor of the next page either way."""
    page = await stream.read_page(
        after=after, limit=limit, include_ephemeral=include_ephemeral, max_bytes=PAGE_BYTES
    )
    if not page.exists:
        raise errors.StreamNotFound(f"stream {stream.path} does not exist", path=stream.path)
    events = page.events
    return json_response(
        {
            "events": [e.to_dict() for e in events],
            "next_after": events[-1].offset if events else after,
        }
    )


@router.post("{path:path}/-/events", status_code=201, openapi_extra=APPEND_BODY, summary="Append one event or a batch")
async def append(
    request: Request,
    path: str = PATH_PARAM,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key"),
    principal: Principal = APPEND,
) -> Response:
    stream = stream_of(request, principal, path)
    return await append_body(stream, await json_body(request), idempotency_key)


@router.get("{path:path}/-/events", summary="Read events after a cursor")
async def read(
    request: Request,
    path: str = PATH_PARAM,
    after: int = Query(0, ge=0, description="Return events with offset > after"),
    limit: int = Query(1000, ge=1, le=10000, description=PAGE_LIMIT),
    include_ephemeral: bool = Query(False),
    principal: Principal = READ,
) -> Response:
    return await read_page(stream_of(request, principal, path), after, limit, include_ephemeral)


@router.get("{path:path}/-/events/{offset}", summary="Read one event by offset")
async def read_one(
    request: Request,
    path: str = PATH_PARAM,
    offset: int = Path(ge=1),
    principal: Principal = READ,
) -> Response:
    event = await stream_of(request, principal, path).get(offset)
    return json_response(event.to_dict())


@router.get(
    "{path:path}/-/tail",
    summary="Live tail (Server-Sent Events)",
    response_class=Response,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def tail(
    request: Request,
    path: str = PATH_PARAM,
    after: int | None = Query(None, ge=0),
    include_ephemeral: bool = Query(True),
    types: str | None = Query(
        None, description="Only these event types, comma-separated: exact names, prefix.* or *"
    ),
    where: str | None = Query(None, description="Only events for which this JSONata is exactly true"),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    principal: Principal = READ,
) -> Response:
    stream = stream_of(request, principal, path)
    event_filter = None
    if types is not None or where is not None:
        if where is not None:
            check_text(where, "where", errors.InvalidFilter)
        kinds = ["*"] if types is None else [t.strip() for t in types.split(",")]
        event_filter = Filter(types=kinds, where=where)
    cursor = await resolve_cursor(stream, after, last_event_id)
    state = request.app.state
    return tail_response(
        stream, cursor, include_ephemeral=include_ephemeral, heartbeat_s=state.heartbeat_s,
        shutdown=state.shutdown, event_filter=event_filter,
    )


# --- settings --------------------------------------------------------------------


@router.post("{path:path}/-/close", summary="Close a stream to appends")
async def close(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    return json_response(info_dict(await stream_of(request, principal, path).close()))


@router.put("{path:path}/-/retention", summary="Set retention")
async def set_retention(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"max_age_s", "max_events"})
    info = await stream_of(request, principal, path).set_retention(**body)
    return json_response(info_dict(info))


@router.put("{path:path}/-/limits", summary="Set producer credit limits")
async def set_limits(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    limits = limits_from(await json_body(request))
    return json_response(info_dict(await stream_of(request, principal, path).set_limits(limits)))


@router.put("{path:path}/-/legal-hold", summary="Turn the legal hold on or off")
async def set_legal_hold(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"on"})
    if "on" not in body:
        raise errors.InvalidInput("give {\"on\": true|false}", field="on")
    return json_response(info_dict(await stream_of(request, principal, path).set_legal_hold(body["on"])))


# --- consumers -------------------------------------------------------------------


@router.get("{path:path}/-/consumers", summary="List consumers")
async def consumers(request: Request, path: str = PATH_PARAM, principal: Principal = READ) -> Response:
    listed = await stream_of(request, principal, path).consumers()
    return json_response(
        {"consumers": [{"consumer": c.consumer_id, "acked": c.acked, "updated_at": c.updated_at} for c in listed]}
    )


async def ack_body(stream: Stream, consumer: str, body: Any) -> Response:
    body = object_body(body, {"offset"})
    if "offset" not in body:
        raise errors.InvalidInput("give {\"offset\": N}", field="offset")
    info = await stream.ack(consumer, body["offset"])
    return json_response({"consumer": info.consumer_id, "acked": info.acked})


@router.post("{path:path}/-/consumers/{consumer}/ack", summary="Acknowledge through an offset")
async def ack(
    request: Request, path: str = PATH_PARAM, consumer: str = Path(), principal: Principal = READ
) -> Response:
    return await ack_body(stream_of(request, principal, path), consumer, await json_body(request))


@router.delete("{path:path}/-/consumers/{consumer}", summary="Remove a consumer")
async def remove_consumer(
    request: Request, path: str = PATH_PARAM, consumer: str = Path(), principal: Principal = ADMIN
) -> Response:
    removed = await stream_of(request, principal, path).remove_consumer(consumer)
    if not removed:
        raise errors.ConsumerNotFound(f"no consumer {consumer}", consumer=consumer)
    return Response(status_code=204)


# --- the stream itself (registered last: its pattern would match the others) --


@router.get("", summary="List streams")
async def list_streams(
    request: Request,
    prefix: str = Query("/"),
    limit: int = Query(1000, ge=1, le=10000),
    after: str | None = Query(None, description="Continue after this path"),
    principal: Principal = READ,
) -> Response:
    listed = await runtime_of(request).streams(principal.tenant, prefix, limit=limit, after=after)
    return json_response({"streams": [info_dict(i) for i in listed]})


@router.put(
    "{path:path}", summary="Create a stream with a definition (201; 200 if it exists with the same one)",
    responses={409: {"model": ErrorBody, "description": "It exists with another definition (stream_exists)"}},
)
async def create(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    raw = await json_body_bytes(request)
    body = object_body(parse_json(raw) if raw else {}, {"retention", "limits", "metadata"})
    info, created = await ensure_definition(stream_of(request, principal, path), body, pinned=False)
    return json_response(info_dict(info), status_code=201 if created else 200)


# --- definitions: one rule for PUT /v1/streams/{path} and the seed-004 surface ----


async def ensure_definition(stream: Stream, body: dict[str, Any], *, pinned: bool) -> tuple[StreamInfo, bool]:
    """Create ``stream`` with the definition in ``body`` (retention, limits,
    metadata; omitted parts take their defaults): (info, True). If it already
    exists with the same definition: (info, False), nothing changes; with
    another one (or, for a pinned definition, a stream that is not pinned):
    409 ``stream_exists``, nothing changes (settings change through their
    own routes)."""
    retention = object_body(body.get("retention") or {}, {"max_age_s", "max_events"}, "retention")
    limits = limits_from(body.get("limits"))
    metadata = body.get("metadata")
    info, created = await stream.create_if_missing(**retention, limits=limits, metadata=metadata, pinned=pinned)
    if not created:
        existing = definition_of(info)
        wanted = {
            "retention": {
                "max_age_s": _number(retention.get("max_age_s")), "max_events": retention.get("max_events"),
            },
            "limits": limits_dict(limits),
            "metadata": metadata or {},
        }
        same = (
            existing["retention"] == wanted["retention"]
            and existing["limits"] == wanted["limits"]
            and _canonical(existing["metadata"]) == _canonical(wanted["metadata"])
            and (info.pinned or not pinned)
        )
        if not same:
            raise errors.StreamExists(
                f"stream {info.path} already exists with another definition", path=info.path,
                existing={**existing, "pinned": info.pinned},
            )
    return info, created


def definition_of(info: StreamInfo) -> dict[str, Any]:
    """What a create request defines: retention, limits, metadata."""
    return {
        "retention": {"max_age_s": info.retention.max_age_s, "max_events": info.retention.max_events},
        "limits": limits_dict(info.limits),
        "metadata": info.metadata,
    }


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _canonical(value: Any) -> bytes:
    """JSON compared as JSON (true is not 1), key order aside."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


@router.get("{path:path}", summary="Stream info")
async def info(request: Request, path: str = PATH_PARAM, principal: Principal = READ) -> Response:
    return json_response(info_dict(await stream_of(request, principal, path).info()))
