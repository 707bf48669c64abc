"""The protocol routes in the OpenAPI document.

``routes.DurableStreams`` answers ``/v1/stream/...`` before FastAPI sees
it; these FastAPI routes exist only so that the document (and /docs)
describes them: headers, bodies, answers. They are never reached."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path
from starlette.responses import Response

from ..responses import ERROR_RESPONSES
from .offsets import token

router = APIRouter(prefix="/v1/stream", tags=["durable streams"], responses=ERROR_RESPONSES)

NAME = Path(description="The stream name: Yoke stream /{name} of the caller's tenant",
            openapi_examples={"orders": {"value": "orders"}})
OFFSET = token(2)
ANY_JSON: dict[str, Any] = {"description": "any JSON value"}
BYTES = {"type": "string", "format": "binary"}


def header(name: str, description: str, example: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "description": description,
            "schema": {"type": "string"}, "example": example}


def query(name: str, description: str, example: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description,
            "schema": {"type": "string"}, "example": example}


BODY = {
    "required": False,
    "content": {
        "application/json": {
            "schema": ANY_JSON,
            "examples": {"one message": {"value": {"event": "created"}},
                         "a batch (one array level is flattened)": {"value": [{"event": "a"}, {"event": "b"}]}},
        },
        "application/octet-stream": {"schema": BYTES, "example": "raw bytes"},
        "text/plain": {"schema": {"type": "string"}, "example": "a line of text\n"},
    },
}
READ_ANSWER = {
    "description": "The messages after the offset: a JSON array (JSON streams) or the bytes; with live=sse,"
                   " Server-Sent Events (`data` and `control` events). Stream-Next-Offset is where to read on.",
    "content": {
        "application/json": {"schema": {"type": "array", "items": ANY_JSON}, "example": [{"event": "created"}]},
        "application/octet-stream": {"schema": BYTES, "example": "raw bytes"},
        "text/plain": {"schema": {"type": "string"}, "example": "a line of text\n"},
        "text/event-stream": {
            "schema": {"type": "string"},
            "example": f'event: data\ndata:[{{"event":"created"}}]\n\nevent: control\n'
                       f'data:{{"streamNextOffset":"{OFFSET}","streamCursor":"1","upToDate":true}}\n\n',
        },
    },
}
CREATE_HEADERS = [
    header("Stream-TTL", "Seconds the stream lives after its last read or write", "3600"),
    header("Stream-Expires-At", "When the stream expires (RFC 3339)", "2030-01-01T00:00:00Z"),
    header("Stream-Closed", "true: create it closed", "true"),
    header("Stream-Forked-From", "Create a fork of this stream (its URL path)", "/v1/stream/orders"),
    header("Stream-Fork-Offset", "The fork inherits the source up to this offset", OFFSET),
    header("Stream-Fork-Sub-Offset", "Messages (JSON) or bytes past the fork offset", "1"),
]
APPEND_HEADERS = [
    header("Stream-Closed", "true: close the stream after this append (an empty body only closes)", "true"),
    header("Stream-Seq", "Must be greater (bytewise) than the last one given", "000042"),
    header("Producer-Id", "Idempotent producer id (with Producer-Epoch and Producer-Seq)", "checkout-1"),
    header("Producer-Epoch", "The producer's epoch", "0"),
    header("Producer-Seq", "The request's sequence number in the epoch", "0"),
]
READ_PARAMS = [
    query("offset", "Read after this offset; -1: the beginning; now: the tail", "-1"),
    query("live", "long-poll or sse", "long-poll"),
    query("cursor", "The last Stream-Cursor (long-poll)", "1"),
]


EMPTY = {
    "description": "No body; the headers say it all (Content-Type is the stream's)",
    "content": {kind: {"schema": {"type": "string", "maxLength": 0}, "example": ""}
                for kind in ("application/json", "application/octet-stream", "text/plain")},
}


def _never(*_: Any) -> Response:  # routes.DurableStreams answers first
    raise AssertionError("answered by the protocol layer")


@router.put(
    "/{name:path}", summary="Create a stream (or a fork)", status_code=201, response_class=Response,
    openapi_extra={"parameters": CREATE_HEADERS, "requestBody": BODY},
    responses={201: {**EMPTY, "description": "Created; Stream-Next-Offset is its tail"},
               200: {**EMPTY, "description": "It exists with this configuration"}},
)
async def create(name: str = NAME) -> Response:
    return _never()


@router.post(
    "/{name:path}", summary="Append (or close)", status_code=204, response_class=Response,
    openapi_extra={"parameters": APPEND_HEADERS, "requestBody": BODY},
    responses={204: {"description": "Appended; Stream-Next-Offset is the new tail"},
               200: {**EMPTY, "description": "Appended by an idempotent producer"}},
)
async def append(name: str = NAME) -> Response:
    return _never()


@router.get(
    "/{name:path}", summary="Read: catch-up, long-poll or SSE", response_class=Response,
    openapi_extra={"parameters": READ_PARAMS}, responses={200: READ_ANSWER},
)
async def read(name: str = NAME) -> Response:
    return _never()


@router.head("/{name:path}", summary="The stream's tail, content type, TTL and closed state",
             response_class=Response, responses={200: {**EMPTY, "description": "Stream-Next-Offset, Content-Type,"
                                                       " Stream-TTL, Stream-Expires-At, Stream-Closed"}})
async def head(name: str = NAME) -> Response:
    return _never()


@router.delete(
    "/{name:path}", summary="Delete a stream (marked deleted while forks of it live: 410)", status_code=204,
    response_class=Response, responses={204: {"description": "Deleted"}},
)
async def delete(name: str = NAME) -> Response:
    return _never()
