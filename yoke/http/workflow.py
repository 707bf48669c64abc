"""The workflow streams surface, ``/api/workflow-streams``: workflow data streams.

A definition may also pin data handling (``streams/data_handling.py``): the routes
open the run's stream for a workflow caller (the token's scopes and id, the
``Client-Region`` it declares), so every operation is checked against the
stream's pins by the stream itself (``streams/rules.py``), and reads come
masked where the token lifts no redaction.

``/runs/{runID}/streams/{streamID}`` is the stream ``/runs/{runID}/{streamID}``
of the token's tenant. A definition pins its retention, limits and metadata
at creation; creating it again with the same definition is a no-op (200),
with a different one a ``stream_exists`` conflict (409): the same rule as
``PUT /v1/streams/{path}`` (``streams.ensure_definition``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Header, Path, Query, Request
from starlette.responses import Response

from .. import errors
from ..events import MAX_OFFSET, PATH_SEGMENT_RE, prepare
from ..store.contract import StreamInfo
from ..streams.stream import Stream
from ..streams.data_handling import FIELDS as PIN_FIELDS, DataHandling
from ..streams.receipts import receipt
from ..streams import rules
from ..streams.rules import Caller
from .auth import ADMIN, APPEND, READ, Principal, runtime_of
from .objects import commit_body, object_dict, prepare_body, read_body
from .responses import ERROR_RESPONSES, json_body, json_body_bytes, json_response
from .sse import resolve_cursor, tail_response
from .objects import COMMIT_BODY, COMMITTED, OBJECT, PREPARE_BODY, PREPARED
from .schemas import (
    OBJECT_BYTES, SSE_ANSWER, EventPage, GapList, LegalHold, Receipt, ReceiptedAnswer, WorkflowAck, WorkflowDefinition, WorkflowStream, answer,
    request_body,
)
from .streams import (
    ACKED, APPEND_BODY, PAGE_LIMIT, STREAM_INFO, ack_body, ensure_definition, gap_dict, info_dict,
    object_body, read_page,
)

router = APIRouter(
    prefix="/api/workflow-streams", tags=["workflow streams"], responses=ERROR_RESPONSES
)

RUN = Path(alias="runID", description="The workflow run", openapi_examples={"run-1": {"value": "run-1"}})
STREAM = Path(
    alias="streamID", description="The stream within the run", openapi_examples={"output": {"value": "output"}}
)


# This surface's words: records are read after a *cursor* (every read returns
# sequence > cursor) and acknowledged by *sequence*. Yoke's own words are
# after and offset; this surface takes both. Anything else in the query is
# refused rather than ignored, naming the parameter meant where one is.
MEANT = {"sequence": "cursor", "offset": "cursor", "from": "cursor", "since": "cursor", "start": "cursor"}
COMMON_QUERY = {"tenant"}
CURSOR = Query(
    None, ge=0, le=MAX_OFFSET,
    description="This surface's word for `after`: records with sequence > cursor. Give one of the two.",
)


def check_query(request: Request, allowed: set[str]) -> None:
    for name in request.query_params:
        if name in allowed or name in COMMON_QUERY:
            continue
        meant = MEANT.get(name)
        hint = f"; use {meant!r} (records with sequence > cursor)" if meant in allowed else ""
        raise errors.InvalidInput(
            f"unknown query parameter {name!r}{hint}; this route takes {', '.join(sorted(allowed))}",
            field=name, **({"hint": meant} if hint else {}),
        )


def cursor_of(after: int | None, cursor: int | None) -> int | None:
    """``after`` or its synonym ``cursor`` (both: they must agree)."""
    if after is not None and cursor is not None and after != cursor:
        raise errors.InvalidInput(
            f"after={after} and cursor={cursor} disagree: cursor is this surface's word for after; give one",
            field="cursor",
        )
    return cursor if cursor is not None else after


def segment(value: str, name: str) -> str:
    if not PATH_SEGMENT_RE.fullmatch(value) or value in (".", "..", "-"):
        raise errors.InvalidPath(f"invalid {name} {value[:80]!r}", path=value[:80])
    return value


REGION_HEADER = "Client-Region"


def run_stream(request: Request, principal: Principal, run_id: str, stream_id: str) -> Stream:
    """The run's stream, as this token and the region the request declares may use it."""
    path = f"/runs/{segment(run_id, 'runID')}/{segment(stream_id, 'streamID')}"
    caller = Caller.workflow(principal.scopes, principal.token_id, request.headers.get(REGION_HEADER))
    return runtime_of(request).stream(path, tenant=principal.tenant, caller=caller)


def definition_response(run_id: str, stream_id: str, info: StreamInfo) -> dict[str, Any]:
    """The stream's info, named by run and stream id; its random lifetime id
    moves to ``lifetime_id``; the data handling it pins, if any."""
    info_json = info_dict(info)
    return {
        **info_json, "run_id": run_id, "stream_id": stream_id, "lifetime_id": info_json["stream_id"],
        "data_handling": info.data_handling,
    }


DEFINITION = {200: answer(WorkflowStream, "The stream definition")}


@router.post(
    "/runs/{runID}/streams", status_code=201, openapi_extra=request_body(WorkflowDefinition),
    responses={
        200: answer(WorkflowStream, "It exists with the same definition; nothing changed"),
        201: answer(WorkflowStream, "Created, pinned for life"),
    },
    summary="Create a stream definition",
)
async def create_definition(request: Request, run_id: str = RUN, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"stream_id", "retention", "limits", "metadata", *PIN_FIELDS})
    stream_id = body.get("stream_id")
    if not isinstance(stream_id, str):
        raise errors.InvalidInput("stream_id is required", field="stream_id")
    stream = run_stream(request, principal, run_id, stream_id)
    pins = DataHandling.from_body(body)
    if pins is not None:
        pins.check_egress(request.headers.get(REGION_HEADER))
    info, created = await ensure_definition(stream, body, pinned=True, data_handling=pins)
    if not created:  # an existing definition's own pins decide who sees it
        await stream.admission(rules.READ)
    result = definition_response(run_id, stream_id, info)
    return json_response(result, status_code=201 if created else 200)


@router.get("/runs/{runID}/streams/{streamID}", responses=DEFINITION, summary="Read a stream definition")
async def read_definition(
    request: Request, run_id: str = RUN, stream_id: str = STREAM, principal: Principal = READ
) -> Response:
    info = await run_stream(request, principal, run_id, stream_id).info()
    return json_response(definition_response(run_id, stream_id, info))


@router.post("/runs/{runID}/streams/{streamID}/records", status_code=201, openapi_extra=APPEND_BODY,
             responses={201: answer(ReceiptedAnswer, "Appended (committed), each record with its receipt")},
             summary="Append records")
async def append_records(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    idempotency_key: str | None = Header(None, alias="Idempotency-Key"),
    principal: Principal = APPEND,
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return await append_with_receipts(stream, await json_body(request), idempotency_key)


async def append_with_receipts(stream: Stream, body: Any, idempotency_key: str | None) -> Response:
    """``append_body`` (one record or a batch, the Idempotency-Key rule), each
    record answered with its receipt (``streams/receipts.py``). The stream
    checks the records' content classes, and appends an input stream's
    records with their delivery outbox (``streams/inputs.py``)."""
    batch = isinstance(body, list)
    if batch:
        if not body:
            raise errors.InvalidInput("a batch holds at least one event", field="body")
        if idempotency_key is not None:
            raise errors.InvalidInput(
                "Idempotency-Key applies to single events; give each batch event its idempotency_key",
                field="Idempotency-Key",
            )
        records = body
    else:
        if isinstance(body, dict) and idempotency_key is not None:
            if body.get("idempotency_key", idempotency_key) != idempotency_key:
                raise errors.InvalidInput(
                    "the Idempotency-Key header and the body's idempotency_key differ", field="Idempotency-Key"
                )
            body = {**body, "idempotency_key": idempotency_key}
        records = [body]
    results = await stream.append_many(records)
    limit = stream.kernel.max_event_bytes
    answers = []
    if stream.kernel.appends.tracing.on:
        # Stored with the trace context in their metadata (tracing.py): the
        # receipts are of the records as stored, read back.
        for raw, result in zip(records, results):
            stored = None if raw.get("ephemeral") else await stream.appended_receipt(result.offset)
            answers.append({"offset": result.offset, "id": result.id, "receipt": stored})
        return json_response({"results": answers} if batch else answers[0], status_code=201)
    for raw, result in zip(records, results):
        prepared = prepare(raw, max_event_bytes=limit)  # valid: it was just appended
        event = replace(prepared.to_event(stream.tenant, stream.path, result.offset, result.at or 0), id=result.id)
        answers.append({
            "offset": result.offset, "id": result.id, "receipt": None if event.ephemeral else receipt(event),
        })
    return json_response({"results": answers} if batch else answers[0], status_code=201)


@router.get(
    "/runs/{runID}/streams/{streamID}/receipts/{sequence}", responses={200: answer(Receipt, "The record's receipt")},
    summary="Fetch an append receipt",
)
async def read_receipt(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    sequence: int = Path(ge=1, le=MAX_OFFSET),
    principal: Principal = READ,
) -> Response:
    return json_response(await run_stream(request, principal, run_id, stream_id).receipt(sequence))


@router.get(
    "/runs/{runID}/streams/{streamID}/records", responses={200: answer(EventPage, "A page of records")},
    summary="Read records after a cursor",
)
async def read_records(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    after: int | None = Query(
        None, ge=0, le=MAX_OFFSET, description="Records with sequence (offset) > after; default 0"
    ),
    cursor: int | None = CURSOR,
    limit: int = Query(1000, ge=1, le=10000, description=PAGE_LIMIT),
    principal: Principal = READ,
) -> Response:
    check_query(request, {"after", "cursor", "limit"})
    after = cursor_of(after, cursor) or 0
    return await read_page(run_stream(request, principal, run_id, stream_id), after, limit, False)


@router.get("/runs/{runID}/streams/{streamID}/subscribe", summary="Subscribe (Server-Sent Events)",
            response_class=Response, responses={200: SSE_ANSWER})
async def subscribe(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    after: int | None = Query(None, ge=0, le=MAX_OFFSET),
    cursor: int | None = CURSOR,
    last_event_id: str | None = Header(None, alias="Last-Event-ID"),
    principal: Principal = READ,
) -> Response:
    check_query(request, {"after", "cursor"})
    stream = run_stream(request, principal, run_id, stream_id)
    cursor = await resolve_cursor(stream, cursor_of(after, cursor), last_event_id)
    state = request.app.state
    return tail_response(
        stream, cursor, include_ephemeral=True, heartbeat_s=state.heartbeat_s, shutdown=state.shutdown,
    )


@router.get(
    "/runs/{runID}/streams/{streamID}/gaps", responses={200: answer(GapList, "Repaired live gaps, newest first")},
    summary="Gap evidence (operators)",
)
async def gaps(
    request: Request, run_id: str = RUN, stream_id: str = STREAM,
    limit: int = Query(100, ge=1, le=100), principal: Principal = ADMIN,
) -> Response:
    check_query(request, {"limit"})
    stream = run_stream(request, principal, run_id, stream_id)
    return json_response({"gaps": [gap_dict(g) for g in await stream.gaps(limit)]})


@router.post(
    "/runs/{runID}/streams/{streamID}/consumers/{consumerID}/ack", openapi_extra=request_body(WorkflowAck),
    responses=ACKED,
    summary="Acknowledge",
)
async def acknowledge(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    consumer_id: str = Path(alias="consumerID"),
    principal: Principal = READ,
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return await ack_body(stream, consumer_id, sequence_as_offset(await json_body(request)))


def sequence_as_offset(body: Any) -> Any:
    """An acknowledgement by ``sequence`` (this surface's word) or ``offset``."""
    if not isinstance(body, dict) or "sequence" not in body:
        return body
    body = dict(body)
    sequence = body.pop("sequence")
    if "offset" in body and body["offset"] != sequence:
        raise errors.InvalidInput("sequence and offset disagree: they are one thing; give one", field="sequence")
    body["offset"] = sequence
    return body


@router.post("/runs/{runID}/streams/{streamID}/close", responses=STREAM_INFO, summary="Close")
async def close(request: Request, run_id: str = RUN, stream_id: str = STREAM, principal: Principal = ADMIN) -> Response:
    return json_response(info_dict(await run_stream(request, principal, run_id, stream_id).close()))


@router.put(
    "/runs/{runID}/streams/{streamID}/legal-hold", openapi_extra=request_body(LegalHold), responses=STREAM_INFO,
    summary="Legal hold on or off",
)
async def legal_hold(
    request: Request, run_id: str = RUN, stream_id: str = STREAM, principal: Principal = ADMIN
) -> Response:
    body = object_body(await json_body(request), {"on"})
    if "on" not in body:
        raise errors.InvalidInput("give {\"on\": true|false}", field="on")
    info = await run_stream(request, principal, run_id, stream_id).set_legal_hold(body["on"])
    return json_response(info_dict(info))


@router.post(
    "/runs/{runID}/streams/{streamID}/objects", status_code=201, openapi_extra=PREPARE_BODY, responses=PREPARED,
    summary="Prepare an object",
)
async def prepare_object(
    request: Request, run_id: str = RUN, stream_id: str = STREAM, principal: Principal = APPEND
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return await prepare_body(stream, await json_body(request), principal)


@router.put(
    "/runs/{runID}/streams/{streamID}/objects/{objectID}", openapi_extra=OBJECT_BYTES, responses=OBJECT,
    summary="Upload an object's bytes",
)
async def upload_object(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    object_id: str = Path(alias="objectID"),
    principal: Principal = APPEND,
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return json_response(object_dict(await stream.objects.upload(object_id, await read_body(request))))


@router.post("/runs/{runID}/streams/{streamID}/objects/{objectID}/commit", status_code=201,
             openapi_extra=COMMIT_BODY, responses=COMMITTED, summary="Commit an object")
async def commit_object(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    object_id: str = Path(alias="objectID"),
    principal: Principal = APPEND,
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return await commit_body(stream, object_id, await json_body_bytes(request))


@router.post("/runs/{runID}/streams/{streamID}/objects/{objectID}/abort", responses=OBJECT, summary="Abort an object")
async def abort_object(
    request: Request,
    run_id: str = RUN,
    stream_id: str = STREAM,
    object_id: str = Path(alias="objectID"),
    principal: Principal = APPEND,
) -> Response:
    stream = run_stream(request, principal, run_id, stream_id)
    return json_response(object_dict(await stream.objects.abort(object_id)))
