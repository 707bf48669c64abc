"""Forks of actor instances over HTTP (docs/advanced/forks.md).

``POST /v1/instances/{id}/forks`` makes one (``append`` scope; naming the
code to replay with, ``app``, imports it into the server, so that needs
``admin``); ``/v1/failures/{id}/fork`` forks a dead letter's instance
through its input, corrected as a replay would correct it; ``/v1/forks``
lists, shows, reads, diffs (``read``) and discards (``append``) them;
``/v1/deploy-checks`` runs the deploy check in the token's tenant (``admin``). The routes call ``runtime.forks(tenant)``, as
Python does.
"""

from __future__ import annotations

import functools

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from .. import errors
from ..actors.forks import Forks
from .actors import instance_id_of, optional_json_body, read_only_query
from .failures import refuse_corrections_of_pinned
from .pinned_listings import PinnedPaths
from .auth import ADMIN, APPEND, READ, Principal, runtime_of
from .responses import ERROR_RESPONSES, json_body, json_response
from .schemas import (
    DeployCheckRequest, DeployCheckResult, FailureForkRequest, ForkCreated, ForkDiff, ForkList, ForkRequest,
    ForkRuns, InstanceState, SqlQuery, SqlResult, answer, request_body,
)
from .streams import object_body

router = APIRouter(tags=["forks"], responses=ERROR_RESPONSES)

FORK_ID = Path(description="The fork id (fork_...)")
MAX_ID_CHARS = 200


def forks_of(request: Request, principal: Principal) -> Forks:
    return runtime_of(request).forks(principal.tenant)


def fork_id_of(value: str) -> str:
    if not 1 <= len(value) <= MAX_ID_CHARS:
        raise errors.ForkNotFound(fork_id=value[:80])
    return value


def check_app(app: object, principal: Principal) -> None:
    """Other code to replay with is imported into this server: admin only."""
    if app is None:
        return
    if not isinstance(app, str) or not 1 <= len(app) <= 500:
        raise errors.InvalidInput("app is module:attribute (or a JavaScript module's path)", field="app")
    if "admin" not in principal.scopes:
        raise errors.Forbidden("forking under other code (app) needs the 'admin' scope", scope="admin")


@router.post(
    "/v1/instances/{instance_id}/forks", status_code=201, openapi_extra=request_body(ForkRequest, required=False),
    responses={201: answer(ForkCreated, "The fork, made and kept")},
    summary="Fork an instance: replay its inputs in a sandbox",
)
async def create(request: Request, instance_id: str = Path(description="The instance id"),
                 principal: Principal = APPEND) -> Response:
    body = object_body(await optional_json_body(request), {"upto", "app", "edits"})
    check_app(body.get("app"), principal)
    fork = await forks_of(request, principal).create(
        instance_id_of(instance_id), upto=body.get("upto"), app=body.get("app"), edits=body.get("edits"),
    )
    return json_response(fork.as_dict(), status_code=201)


@router.post(
    "/v1/failures/{failure_id}/fork", status_code=201,
    openapi_extra=request_body(FailureForkRequest, required=False, description="No body: the input as it failed"),
    responses={201: answer(ForkCreated, "The fork, through the failed input")},
    summary="Fork a dead letter's instance through its input, corrected or under other code",
)
async def fork_failure(request: Request, failure_id: str = Path(description="The failure id"),
                       principal: Principal = APPEND) -> Response:
    body = object_body(await optional_json_body(request), {"event", "patch", "app"})
    check_app(body.get("app"), principal)
    inbox = runtime_of(request).failures(principal.tenant)
    if body.get("event") is not None or body.get("patch") is not None:
        await refuse_corrections_of_pinned(request, principal, [await inbox.get(failure_id)])
    fork = await inbox.fork(failure_id, body.get("event"), patch=body.get("patch"), app=body.get("app"))
    return json_response(fork.as_dict(), status_code=201)


@router.get("/v1/forks", responses={200: answer(ForkList, "Forks, by id")}, summary="Forks of this tenant")
async def listed(
    request: Request,
    instance_id: str | None = Query(None, max_length=MAX_ID_CHARS, description="Only this instance's"),
    after: str | None = Query(None, max_length=MAX_ID_CHARS, description="Continue after this fork id"),
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    found = await forks_of(request, principal).list(instance_id, after=after, limit=limit)
    return json_response({"forks": [f.as_dict() for f in found]})


@router.get("/v1/forks/{fork_id}", responses={200: answer(ForkCreated, "The fork")}, summary="A fork")
async def show(request: Request, fork_id: str = FORK_ID, principal: Principal = READ) -> Response:
    return json_response((await forks_of(request, principal).get(fork_id_of(fork_id))).as_dict())


@router.get(
    "/v1/forks/{fork_id}/runs", responses={200: answer(ForkRuns, "Its runs in order")},
    summary="What each run of a fork did",
)
async def runs(
    request: Request, fork_id: str = FORK_ID,
    after: int = Query(0, ge=0, le=2**63 - 1, description="Runs after this many"),
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    every = await forks_of(request, principal).runs(fork_id_of(fork_id))
    page = every[after: after + limit]
    pins = PinnedPaths(runtime_of(request), principal.tenant)
    for run in page:
        if await pins.pinned(run["event"].get("path")):  # as its kept input shows: without its texts
            run.update(event=None, error=None, traceback=None, ops=[])
    return json_response({"runs": page, "next_after": after + limit if after + limit < len(every) else None})


@router.get(
    "/v1/forks/{fork_id}/state", responses={200: answer(InstanceState, "Its ctx.state document")},
    summary="A fork's state",
)
async def state(request: Request, fork_id: str = FORK_ID, principal: Principal = READ) -> Response:
    value, version = await forks_of(request, principal).state(fork_id_of(fork_id))
    return json_response({"value": value, "version": version})


@router.post(
    "/v1/forks/{fork_id}/sql", openapi_extra=request_body(SqlQuery),
    responses={200: answer(SqlResult, "Columns and rows (at most max_rows)")},
    summary="A read-only SQL query on a fork's database",
)
async def sql(request: Request, fork_id: str = FORK_ID, principal: Principal = READ) -> Response:
    return await read_only_query(request, functools.partial(forks_of(request, principal).query, fork_id_of(fork_id)))


@router.get(
    "/v1/forks/{fork_id}/diff", responses={200: answer(ForkDiff, "What differs")},
    summary="A fork against its live instance or another fork",
)
async def diff(
    request: Request, fork_id: str = FORK_ID,
    against: str | None = Query(None, max_length=MAX_ID_CHARS, description="Another fork's id (default: live)"),
    principal: Principal = READ,
) -> Response:
    forks = forks_of(request, principal)
    d = await forks.diff(fork_id_of(fork_id), against)
    pins = PinnedPaths(runtime_of(request), principal.tenant)
    for fork in (fork_id, against):
        if fork is not None and any([await pins.pinned(r["event"].get("path")) for r in await forks.runs(fork)]):
            # Effects and errors often quote the events: as the runs show them, without.
            for e in d["effects"]:
                for side in ("only_live", "only_fork"):
                    e[side] = [{"op": x["op"], "params": None} for x in e[side]]
                e["changed"] = [{"op": x["op"], "live": None, "fork": None} for x in e["changed"]]
            for o in d["outcomes"]:
                o["live_error"] = o["fork_error"] = None
            break
    return json_response(d)


@router.delete("/v1/forks/{fork_id}", responses={200: answer(ForkCreated, "The discarded fork")},
               summary="Discard a fork")
async def discard(request: Request, fork_id: str = FORK_ID, principal: Principal = APPEND) -> Response:
    return json_response((await forks_of(request, principal).discard(fork_id_of(fork_id))).as_dict())


@router.post(
    "/v1/deploy-checks", openapi_extra=request_body(DeployCheckRequest),
    responses={200: answer(DeployCheckResult, "Where the candidate code diverges")},
    summary="The deploy check: a sample of instances forked under candidate code (admin)",
)
async def deploy_check(request: Request, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"app", "current", "actors", "instances", "inputs"})
    for field in ("app", "current"):
        value = body.get(field)
        if (field == "app" or value is not None) and (not isinstance(value, str) or not 1 <= len(value) <= 500):
            raise errors.InvalidInput(f"{field} is module:attribute (or a JavaScript module's path)", field=field)
    actors = body.get("actors")
    if actors is not None and (not isinstance(actors, list) or not all(isinstance(a, str) for a in actors)):
        raise errors.InvalidInput("actors is a list of actor names", field="actors")
    report = await runtime_of(request).check_deploy(
        body["app"], current=body.get("current"), actors=actors, instances=body.get("instances", 100),
        inputs=body.get("inputs", 1000), tenants=[principal.tenant],
    )
    return json_response(report)
