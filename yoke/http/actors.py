"""``/v1/instances``: actor instances of the token's tenant, their queues and
dead letters.

Reads need ``read``; creating an instance and redriving or dropping dead
rows change what runs, so they need ``admin`` (like stream settings).
The routes call the same ``runtime.instances(tenant)`` methods as Python.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from .. import errors
from ..actors.instances import Instances
from ..actors.ops import instance_dict
from ..actors.state import QueryResult
from ..events import check_text, json_text
from ..store.actors import InstanceInfo, QueueRow, Schedule
from .auth import ADMIN, READ, Principal, runtime_of
from .pinned_listings import PinnedPaths
from .responses import ERROR_RESPONSES, json_body, json_body_bytes, json_response, parse_json
from .schemas import (
    DeadRows, Dropped, InputList, Instance, InstanceCreated, InstanceDetail, InstanceList, InstanceRequest, QueueRows,
    Redriven,
    ScheduleList, SqlQuery, SqlResult, answer, request_body,
)
from .streams import object_body

router = APIRouter(prefix="/v1/instances", tags=["actors"], responses=ERROR_RESPONSES)

INSTANCE_ID = Path(description="The instance id (inst_...)")
MAX_NAME_CHARS = 200  # actor names, instance ids, list cursors

DEAD_ROWS_BODY = request_body(DeadRows, required=False, description="No body: all the dead rows")
ROWS = {200: answer(QueueRows, "Queue rows, oldest first")}


def instances_of(request: Request, principal: Principal) -> Instances:
    return runtime_of(request).instances(principal.tenant)


def instance_id_of(value: str) -> str:
    """An id no instance can have is simply not found (after the text check)."""
    check_text(value, "instance_id", errors.InvalidInput)
    if not 1 <= len(value) <= MAX_NAME_CHARS:
        raise errors.InstanceNotFound(instance_id=value[:80])
    return value


def instance_json(info: InstanceInfo) -> dict[str, Any]:
    return {**instance_dict(info), "worker_id": info.worker_id}


def queue_row_json(row: QueueRow) -> dict[str, Any]:
    return {
        "qid": row.qid,
        "status": row.status,
        "attempts": row.attempts,
        "group_id": row.group_id,
        "priority": row.priority,
        "path": row.path,
        "offset": row.offset,
        "event": row.event,
        "available_at": row.available_at,
        "last_error": row.last_error,
        "last_traceback": row.last_traceback,
        "enqueued_at": row.enqueued_at,
        "started_at": row.started_at,
    }


async def queue_rows_json(request: Request, principal: Principal, rows: list[QueueRow]) -> list[dict[str, Any]]:
    """Queue rows as JSON; a row from a stream that pins its data handling
    without its event and error texts (as /v1/failures shows it)."""
    pins = PinnedPaths(runtime_of(request), principal.tenant)
    out = []
    for row in rows:
        d = queue_row_json(row)
        if await pins.pinned(row.path):
            d["event"] = d["last_error"] = d["last_traceback"] = None
        out.append(d)
    return out


def schedule_json(schedule: Schedule) -> dict[str, Any]:
    return {
        "name": schedule.name, "due_at": schedule.due_at, "cron": schedule.cron, "event": schedule.event,
        "stream": schedule.stream, "created_at": schedule.created_at,
    }


def default(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


def qids_of(body: Any) -> list[int] | None:
    """``{"qids": [...]}`` (some dead rows), or no body / ``{}`` (all of them);
    ``Instances`` checks the ids."""
    return object_body(body, {"qids"}).get("qids")


async def optional_json_body(request: Request) -> Any:
    """The JSON body, or ``{}`` when there is none."""
    raw = await json_body_bytes(request)
    return parse_json(raw) if raw else {}


# --- instances ---------------------------------------------------------------


@router.get("", responses={200: answer(InstanceList, "Instances by id")}, summary="List actor instances")
async def list_instances(
    request: Request,
    actor: str | None = Query(None, description="Only instances of this actor"),
    key: str | None = Query(None, description="With actor: only the instance with this key (0 or 1)"),
    limit: int = Query(100, ge=1, le=1000),
    after: str | None = Query(None, description="Continue after this instance id"),
    principal: Principal = READ,
) -> Response:
    instances = instances_of(request, principal)
    if key is not None:
        if actor is None:
            raise errors.InvalidInput("key needs actor: ?actor=A&key=K", field="key")
        found = await instances.find(actor, key)
        return json_response({"instances": [instance_json(found)] if found is not None else []})
    listed = await instances.list(actor, limit=limit, after=after)
    return json_response({"instances": [instance_json(i) for i in listed]})


@router.post(
    "", status_code=201, openapi_extra=request_body(InstanceRequest),
    responses={
        200: answer(InstanceCreated, "It exists (created: false)"),
        201: answer(InstanceCreated, "Created"),
    },
    summary="Create an instance (200 if it exists)",
)
async def create_instance(request: Request, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"actor", "key", "config", "filter"})
    filter_ = body.get("filter")
    if filter_ is not None:
        json_text(filter_, "filter")  # storable (no NUL); Instances.create parses it
    # Instances checks the actor, key and config.
    info, created = await instances_of(request, principal).create_or_get(
        body.get("actor"), body.get("key"), body.get("config"), filter=filter_
    )
    return json_response({**instance_json(info), "created": created}, status_code=201 if created else 200)


@router.get(
    "/{instance_id}", responses={200: answer(InstanceDetail, "The instance, its state and queue depth")},
    summary="An instance, its state and its queue depth",
)
async def show_instance(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = READ) -> Response:
    runtime = runtime_of(request)
    instances = runtime.instances(principal.tenant)
    info = await instances.get(instance_id_of(instance_id))
    value, version = await instances.state(info.instance_id)
    depth = await instances.depth(info.instance_id)
    return json_response(
        {
            **instance_json(info),
            "state": {"value": value, "version": version},
            "queue": {"pending": depth.pending, "processing": depth.processing, "dead": depth.dead},
        }
    )


@router.delete(
    "/{instance_id}", responses={200: answer(Instance, "The removed instance")},
    summary="Remove an instance with its queue, schedules and state (yoke.instance.removed on /)",
)
async def remove_instance(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = ADMIN) -> Response:
    info = await instances_of(request, principal).remove(instance_id_of(instance_id))
    return json_response(instance_json(info))


@router.get("/{instance_id}/queue", responses=ROWS, summary="Queue rows of an instance")
async def queue(
    request: Request,
    instance_id: str = INSTANCE_ID,
    status: str | None = Query(None, description="pending, processing or dead (default: all)"),
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    rows = await instances_of(request, principal).queue(instance_id_of(instance_id), status=status, limit=limit)
    return json_response({"rows": await queue_rows_json(request, principal, rows)})


@router.get(
    "/{instance_id}/schedules", responses={200: answer(ScheduleList, "Its schedules by name")},
    summary="Schedules (timers and cron) of an instance",
)
async def schedules(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = READ) -> Response:
    listed = await instances_of(request, principal).schedules(instance_id_of(instance_id))
    return json_response({"schedules": [schedule_json(s) for s in listed]})


@router.get(
    "/{instance_id}/inputs", responses={200: answer(InputList, "Its kept inputs, oldest first")},
    summary="The inputs an instance processed, in order (docs/advanced/forks.md)",
)
async def inputs(
    request: Request,
    instance_id: str = INSTANCE_ID,
    after: int = Query(0, ge=0, le=2**63 - 1, description="Inputs after this number"),
    upto: int | None = Query(None, ge=0, le=2**63 - 1, description="Up to this number"),
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    page = await instances_of(request, principal).inputs(
        instance_id_of(instance_id), after=after, upto=upto, limit=limit
    )
    pins = PinnedPaths(runtime_of(request), principal.tenant)
    listed = []
    for record in page.inputs:
        d = record.as_dict()
        if await pins.pinned(record.path):  # as its queue row shows: without its texts
            d["event"] = d["error"] = None
            d["ops"] = []
        listed.append(d)
    return json_response({"inputs": listed, "next_after": page.next_after})


@router.post(
    "/{instance_id}/sql", openapi_extra=request_body(SqlQuery),
    responses={200: answer(SqlResult, "Columns and rows (at most max_rows)")},
    summary="A read-only SQL query on the instance's SQLite database",
)
async def sql(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = READ) -> Response:
    return await read_only_query(request, functools.partial(instances_of(request, principal).query,
                                                            instance_id_of(instance_id)))


async def read_only_query(request: Request, query: Callable[..., Awaitable[QueryResult]]) -> Response:
    """``{"sql", "params", "max_rows", "timeout_s"}`` run by ``query`` (an
    instance's database, a fork's): its columns and rows."""
    body = object_body(await json_body(request), {"sql", "params", "max_rows", "timeout_s"})
    options = {k: body[k] for k in ("max_rows", "timeout_s") if body.get(k) is not None}
    result = await query(body.get("sql"), default(body.get("params"), []), **options)
    return json_response({"columns": result.columns, "rows": result.rows, "truncated": result.truncated})


# --- dead letters --------------------------------------------------------------


@router.get("/{instance_id}/dlq", responses=ROWS, summary="Dead-lettered rows of an instance")
async def dead_letters(
    request: Request,
    instance_id: str = INSTANCE_ID,
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    rows = await instances_of(request, principal).dead(instance_id_of(instance_id), limit=limit)
    return json_response({"rows": await queue_rows_json(request, principal, rows)})


@router.post(
    "/{instance_id}/dlq/redrive", openapi_extra=DEAD_ROWS_BODY, responses={200: answer(Redriven, "How many")},
    summary="Dead rows back to pending, attempts reset",
)
async def redrive(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = ADMIN) -> Response:
    qids = qids_of(await optional_json_body(request))
    count = await instances_of(request, principal).redrive(instance_id_of(instance_id), qids)
    return json_response({"redriven": count})


@router.post(
    "/{instance_id}/dlq/drop", openapi_extra=DEAD_ROWS_BODY, responses={200: answer(Dropped, "How many")},
    summary="Delete dead rows",
)
async def drop(request: Request, instance_id: str = INSTANCE_ID, principal: Principal = ADMIN) -> Response:
    qids = qids_of(await optional_json_body(request))
    count = await instances_of(request, principal).drop(instance_id_of(instance_id), qids)
    return json_response({"dropped": count})
