"""``/v1/streams``: append, read, tail, settings.

A stream path is part of the URL and may contain ``/``; a segment that is
exactly ``-`` separates it from an action (stream paths cannot contain such
a segment), so ``/v1/streams/orders/eu/-/events`` is always "the events of
stream /orders/eu", never a stream called ``/orders/eu/-/events``. The root
stream ``/`` is ``/v1/streams/`` and ``/v1/streams/-/events``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import Response

from .. import errors
from ..events import MAX_OFFSET, check_text
from ..routing.filters import Filter
from ..runtime import Runtime
from ..store.contract import GapEvidence, Limits, StreamInfo
from ..streams.data_handling import DataHandling
from ..streams.rules import Caller
from ..streams.stream import Stream
from ..streams.tail import PAGE_BYTES
from .auth import ADMIN, APPEND, READ, Principal, runtime_of
from .hints import hint_sentence, missing_separator
from .responses import ERROR_RESPONSES, ErrorBody, json_body, json_body_bytes, json_response, parse_json
from .schemas import (
    CONNECTION_ANSWER, SSE_ANSWER, Ack, Acked, AppendAnswer, AppendBody, ConsumerList, EventOutput, EventPage, GapList,
    LegalHold, Retention,
    StreamDefinition, StreamList, answer, request_body,
)
from .schemas import Limits as LimitsBody, StreamInfo as StreamInfoAnswer
from .sse import connection_response, resolve_cursor, tail_response

router = APIRouter(
    prefix="/v1/streams", tags=["streams"], responses=ERROR_RESPONSES
)

PATH_PARAM = Path(
    description="The stream path, e.g. /orders/eu ('' for the root stream '/')",
    openapi_examples={"/orders": {"value": "/orders"}},
)

def stream_of(request: Request, principal: Principal, path: str) -> Stream:
    return stream_of_principal(runtime_of(request), principal, path)


def stream_of_principal(runtime: Runtime, principal: Principal, path: str) -> Stream:
    """The stream as this token may use it through a surface that cannot carry
    pins (``/v1/streams``, the console, the CLI): ``rules.Caller.generic``."""
    return runtime.stream(
        path or "/", tenant=principal.tenant, caller=Caller.generic(principal.scopes, principal.token_id)
    )


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


def gap_dict(gap: GapEvidence) -> dict[str, Any]:
    return {"first": gap.first, "last": gap.last, "cause": gap.cause, "detected_at": gap.detected_at,
            "process": gap.process}


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
            "events": [e.to_dict() for e in events],  # masked by the stream for its caller
            "next_after": events[-1].offset if events else after,
        }
    )


APPEND_BODY = request_body(AppendBody)
APPENDED = {201: answer(AppendAnswer, "Appended (committed): {offset, id}, or {results} for a batch")}
STREAM_INFO = {200: answer(StreamInfoAnswer, "The stream's info")}


@router.post(
    "{path:path}/-/events", status_code=201, openapi_extra=APPEND_BODY, responses=APPENDED,
    summary="Append one event or a batch",
)
async def append(
    request: Request,
    path: str = PATH_PARAM,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key"),
    principal: Principal = APPEND,
) -> Response:
    stream = stream_of(request, principal, path)
    return await append_body(stream, await json_body(request), idempotency_key)


@router.get(
    "{path:path}/-/events", responses={200: answer(EventPage, "A page of events")}, summary="Read events after a cursor"
)
async def read(
    request: Request,
    path: str = PATH_PARAM,
    after: int = Query(0, ge=0, le=MAX_OFFSET, description="Return events with offset > after"),
    limit: int = Query(1000, ge=1, le=10000, description=PAGE_LIMIT),
    include_ephemeral: bool = Query(False),
    principal: Principal = READ,
) -> Response:
    return await read_page(stream_of(request, principal, path), after, limit, include_ephemeral)


@router.get(
    "{path:path}/-/events/{offset}", responses={200: answer(EventOutput, "The event")}, summary="Read one event by offset"
)
async def read_one(
    request: Request,
    path: str = PATH_PARAM,
    offset: int = Path(ge=1, le=MAX_OFFSET),
    principal: Principal = READ,
) -> Response:
    event = await stream_of(request, principal, path).get(offset)
    return json_response(event.to_dict())


@router.get(
    "{path:path}/-/tail",
    summary="Live tail (Server-Sent Events)",
    response_class=Response,
    responses={200: SSE_ANSWER},
)
async def tail(
    request: Request,
    path: str = PATH_PARAM,
    after: int | None = Query(None, ge=0, le=MAX_OFFSET),
    include_ephemeral: bool = Query(True),
    types: str | None = Query(
        None, description="Only these event types, comma-separated: exact names, prefix.* or *"
    ),
    where: str | None = Query(None, description="Only events for which this JSONata is exactly true"),
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    principal: Principal = READ,
) -> Response:
    stream = stream_of(request, principal, path)
    event_filter = filter_of(types, where)
    state = request.app.state
    # Refused before anything is read: a refusal costs the server no query.
    free = state.expensive_tails.claim(principal, event_filter, state.runtime.settings)
    try:
        cursor = await resolve_cursor(stream, after, last_event_id)
    except BaseException:
        if free is not None:
            free()
        raise
    return tail_response(
        stream, cursor, include_ephemeral=include_ephemeral, heartbeat_s=state.heartbeat_s,
        shutdown=state.shutdown, event_filter=event_filter, free=free,
    )


@router.get(
    "{path:path}/-/connection",
    summary="Session connection: replay, then live events or state updates (Server-Sent Events)",
    response_class=Response,
    responses={200: CONNECTION_ANSWER},
)
async def connection(
    request: Request,
    path: str = PATH_PARAM,
    key: str = Query(
        min_length=1, max_length=200,
        description="The connection key: a second connection with the same key on this stream replaces this one",
    ),
    after: int | None = Query(
        None, ge=0, le=MAX_OFFSET, description="Replay the events after this offset (omitted: only new ones)"
    ),
    events: bool = Query(True, description="false: send the stream's state updates instead of its events"),
    include_ephemeral: bool = Query(True),
    types: str | None = Query(
        None, description="Only these event types, comma-separated: exact names, prefix.* or *"
    ),
    where: str | None = Query(None, description="Only events for which this JSONata is exactly true"),
    principal: Principal = READ,
) -> Response:
    stream = stream_of(request, principal, path)
    state = request.app.state
    event_filter = filter_of(types, where)
    return await connection_response(
        stream, key, after, events=events, include_ephemeral=include_ephemeral, heartbeat_s=state.heartbeat_s,
        shutdown=state.shutdown, event_filter=event_filter,
        free=state.expensive_tails.claim(principal, event_filter, state.runtime.settings),
    )


def filter_of(types: str | None, where: str | None) -> Filter | None:
    """``?types=`` and ``?where=`` as a filter (None: everything)."""
    if types is None and where is None:
        return None
    if where is not None:
        check_text(where, "where", errors.InvalidFilter)
    kinds = ["*"] if types is None else [t.strip() for t in types.split(",")]
    return Filter(types=kinds, where=where)


# --- settings --------------------------------------------------------------------


@router.post("{path:path}/-/close", responses=STREAM_INFO, summary="Close a stream to appends")
async def close(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    return json_response(info_dict(await stream_of(request, principal, path).close()))


@router.put(
    "{path:path}/-/retention", openapi_extra=request_body(Retention), responses=STREAM_INFO, summary="Set retention"
)
async def set_retention(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"max_age_s", "max_events"})
    info = await stream_of(request, principal, path).set_retention(**body)
    return json_response(info_dict(info))


@router.put(
    "{path:path}/-/limits", openapi_extra=request_body(LimitsBody), responses=STREAM_INFO,
    summary="Set producer credit limits",
)
async def set_limits(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    limits = limits_from(await json_body(request))
    return json_response(info_dict(await stream_of(request, principal, path).set_limits(limits)))


@router.put(
    "{path:path}/-/legal-hold", openapi_extra=request_body(LegalHold), responses=STREAM_INFO,
    summary="Turn the legal hold on or off",
)
async def set_legal_hold(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"on"})
    if "on" not in body:
        raise errors.InvalidInput("give {\"on\": true|false}", field="on")
    return json_response(info_dict(await stream_of(request, principal, path).set_legal_hold(body["on"])))


@router.get(
    "{path:path}/-/gaps", responses={200: answer(GapList, "Repaired live gaps, newest first")},
    summary="Gap evidence (operators)",
)
async def gaps(
    request: Request, path: str = PATH_PARAM, limit: int = Query(100, ge=1, le=100), principal: Principal = ADMIN
) -> Response:
    listed = await stream_of(request, principal, path).gaps(limit)
    return json_response({"gaps": [gap_dict(g) for g in listed]})


# --- consumers -------------------------------------------------------------------


@router.get("{path:path}/-/consumers", responses={200: answer(ConsumerList, "The consumers")}, summary="List consumers")
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


ACK_BODY = request_body(Ack)
ACKED = {200: answer(Acked, "The consumer's acknowledged offset")}


@router.post(
    "{path:path}/-/consumers/{consumer}/ack", openapi_extra=ACK_BODY, responses=ACKED,
    summary="Acknowledge through an offset (creates the consumer)",
)
async def ack(
    request: Request, path: str = PATH_PARAM, consumer: str = Path(), principal: Principal = READ
) -> Response:
    return await ack_body(stream_of(request, principal, path), consumer, await json_body(request))


@router.delete(
    "{path:path}/-/consumers/{consumer}", status_code=204, response_class=Response, summary="Remove a consumer"
)
async def remove_consumer(
    request: Request, path: str = PATH_PARAM, consumer: str = Path(), principal: Principal = ADMIN
) -> Response:
    removed = await stream_of(request, principal, path).remove_consumer(consumer)
    if not removed:
        raise errors.ConsumerNotFound(f"no consumer {consumer}", consumer=consumer)
    return Response(status_code=204)


# --- the stream itself (registered last: its pattern would match the others) --


@router.get("", responses={200: answer(StreamList, "Streams by path")}, summary="List streams")
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
    openapi_extra=request_body(StreamDefinition, required=False, description="No body: the default definition"),
    responses={
        200: answer(StreamInfoAnswer, "It exists with the same definition; nothing changed"),
        201: answer(StreamInfoAnswer, "Created"),
        409: {"model": ErrorBody, "description": "It exists with another definition (stream_exists)"},
    },
)
async def create(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    raw = await json_body_bytes(request)
    body = object_body(parse_json(raw) if raw else {}, {"retention", "limits", "metadata"})
    info, created = await ensure_definition(stream_of(request, principal, path), body, pinned=False)
    return json_response(info_dict(info), status_code=201 if created else 200)


# --- definitions: one rule for PUT /v1/streams/{path} and the workflow streams surface ----


async def ensure_definition(
    stream: Stream, body: dict[str, Any], *, pinned: bool, data_handling: DataHandling | None = None
) -> tuple[StreamInfo, bool]:
    """Create ``stream`` with the definition in ``body`` (retention, limits,
    metadata): ``Stream.create_if_missing``'s one rule, 201 / 200 / 409
    ``stream_exists`` (settings change through their own routes)."""
    retention = object_body(body.get("retention") or {}, {"max_age_s", "max_events"}, "retention")
    limits = limits_from(body.get("limits"))
    return await stream.create_if_missing(
        **retention, limits=limits, metadata=body.get("metadata"), pinned=pinned, data_handling=data_handling
    )


@router.delete(
    "{path:path}",
    summary="Delete a stream: its events, consumers, objects and subscriptions (the path can be created again)",
    responses={
        200: answer(StreamInfoAnswer, "Deleted: the stream as it was"),
        400: {"model": ErrorBody, "description": "The tenant's global stream / is kept (global_stream)"},
        409: {"model": ErrorBody, "description": "The stream is under legal hold (legal_hold)"},
    },
)
async def delete(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    try:
        return json_response(info_dict(await stream_of(request, principal, path).delete()))
    except errors.StreamNotFound as exc:
        hinted(request, exc, "DELETE")  # DELETE /v1/streams/a/consumers/c1: the '-' forgotten?
        raise


@router.get("{path:path}", responses=STREAM_INFO, summary="Stream info")
async def info(request: Request, path: str = PATH_PARAM, principal: Principal = READ) -> Response:
    try:
        return json_response(info_dict(await stream_of(request, principal, path).info()))
    except errors.StreamNotFound as exc:
        # GET /v1/streams/a/events: the info of a stream /a/events, or the
        # events of /a with the '-' forgotten?
        hinted(request, exc, "GET")
        raise


def hinted(request: Request, exc: errors.StreamNotFound, method: str) -> None:
    """A stream named like an action was not found: name the route probably meant."""
    details = missing_separator(request.app.state.routes, method, request.url.path)
    if details:
        exc.message += "; " + hint_sentence(details["hint"])
        exc.details.update(details)
