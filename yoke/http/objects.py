"""``/v1/streams/{path}/-/objects``: the large-object flow (prepare, upload, commit).

prepare (pins key, digest, size, type, expiry) -> upload (PUT the bytes) ->
commit (appends one record referencing the object; repeating it returns the
original offset) or abort.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from .. import errors
from ..store.contract import ObjectInfo
from ..streams.stream import Stream
from ..streams.objects import MAX_OBJECT_BYTES
from .auth import APPEND, READ, Principal
from .responses import ERROR_RESPONSES, json_body, json_body_bytes, json_response, limited_body, parse_json
from .schemas import OBJECT_BYTES, Appended, ObjectCommit, ObjectPrepare, answer, request_body, text_answer
from .schemas import ObjectInfo as ObjectAnswer
from .streams import PATH_PARAM, object_body, stream_of

router = APIRouter(
    prefix="/v1/streams", tags=["objects"], responses=ERROR_RESPONSES
)


def object_dict(info: ObjectInfo) -> dict[str, Any]:
    return {
        "object_id": info.object_id,
        "path": info.path,
        "idempotency_key": info.idempotency_key,
        "sha256": info.sha256,
        "size": info.size,
        "content_type": info.content_type,
        "state": info.state,
        "created_at": info.created_at,
        "expires_at": info.expires_at,
        "committed_offset": info.committed_offset,
        "schema": info.schema,
        "authorization": info.authorization,
    }


async def prepare_body(stream: Stream, body: Any, principal: Principal) -> Response:
    """Prepare with the body's pins; the token that asked is the object's
    authorization receipt (its id and scopes)."""
    body = object_body(body, {"idempotency_key", "sha256", "size", "content_type", "expires_in_s", "schema"})
    for field in ("idempotency_key", "sha256", "size"):
        if field not in body:
            raise errors.InvalidInput(f"{field} is required", field=field)
    authorized_by = {"subject": principal.token_id, "scopes": list(principal.scopes)}
    info = await stream.objects.prepare(**body, authorized_by=authorized_by)
    return json_response(object_dict(info), status_code=201)


async def read_body(request: Request) -> bytes:
    """An object's bytes, refusing to buffer more than an object may hold."""
    return await limited_body(request, MAX_OBJECT_BYTES, errors.ObjectTooLarge)


async def commit_body(stream: Stream, object_id: str, raw: bytes) -> Response:
    body = object_body(parse_json(raw) if raw else {}, {"type", "payload", "metadata"})
    result = await stream.objects.commit(object_id, **body)
    return json_response({"offset": result.offset, "id": result.id}, status_code=201)


PREPARE_BODY = request_body(ObjectPrepare)
COMMIT_BODY = request_body(ObjectCommit, required=False, description="No body: type object.committed, no payload")
OBJECT = {200: answer(ObjectAnswer, "The object")}
PREPARED = {201: answer(ObjectAnswer, "Prepared (the same key again: the same object)")}
COMMITTED = {201: answer(Appended, "The record's offset and id (the original ones when committed before)")}
DATA = {
    200: text_answer(
        "*/*", "The object's bytes, as its content_type", "hello", format="binary",
    )
}


@router.post(
    "{path:path}/-/objects", status_code=201, openapi_extra=PREPARE_BODY, responses=PREPARED,
    summary="Prepare an object upload",
)
async def prepare(request: Request, path: str = PATH_PARAM, principal: Principal = APPEND) -> Response:
    return await prepare_body(stream_of(request, principal, path), await json_body(request), principal)


@router.put(
    "{path:path}/-/objects/{object_id}", openapi_extra=OBJECT_BYTES, responses=OBJECT,
    summary="Upload the object's bytes",
)
async def upload(
    request: Request, path: str = PATH_PARAM, object_id: str = Path(), principal: Principal = APPEND
) -> Response:
    stream = stream_of(request, principal, path)
    info = await stream.objects.upload(object_id, await read_body(request))
    return json_response(object_dict(info))


@router.post(
    "{path:path}/-/objects/{object_id}/commit", status_code=201, openapi_extra=COMMIT_BODY, responses=COMMITTED,
    summary="Commit: append its record",
)
async def commit(
    request: Request, path: str = PATH_PARAM, object_id: str = Path(), principal: Principal = APPEND
) -> Response:
    return await commit_body(stream_of(request, principal, path), object_id, await json_body_bytes(request))


@router.post("{path:path}/-/objects/{object_id}/abort", responses=OBJECT, summary="Abort an upload")
async def abort(
    request: Request, path: str = PATH_PARAM, object_id: str = Path(), principal: Principal = APPEND
) -> Response:
    return json_response(object_dict(await stream_of(request, principal, path).objects.abort(object_id)))


@router.get(
    "{path:path}/-/objects/{object_id}/data", response_class=Response, responses=DATA,
    summary="Download the object's bytes",
)
async def data(
    request: Request, path: str = PATH_PARAM, object_id: str = Path(), principal: Principal = READ
) -> Response:
    stream = stream_of(request, principal, path)
    info = await stream.objects.info(object_id)
    return Response(await stream.objects.data(object_id), media_type=info.content_type)


@router.get("{path:path}/-/objects/{object_id}", responses=OBJECT, summary="Object status")
async def status(
    request: Request, path: str = PATH_PARAM, object_id: str = Path(), principal: Principal = READ
) -> Response:
    return json_response(object_dict(await stream_of(request, principal, path).objects.info(object_id)))
