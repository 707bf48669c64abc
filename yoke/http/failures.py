"""``/v1/failures``: the failures inbox of the token's tenant (docs/advanced/failures.md).

Reads need ``read``; replays and discards change what runs, so they need
``admin`` (like redriving dead letters). The routes call the same
``runtime.failures(tenant)`` methods as Python.

Like the other generic routes, these keep out of streams that pin their
data handling (``pinned.py``): such a failure is listed without its event,
and cannot be replayed with a corrected one (403 ``data_handling_pinned``;
the workflow surface is the way in).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ..events import MAX_INT
from ..failures import Failure as FailureRecord
from ..failures import Failures
from .actors import optional_json_body
from .auth import ADMIN, READ, Principal, runtime_of
from .pinned_listings import PinnedPaths, refuse_pinned
from .responses import ERROR_RESPONSES, json_body, json_response
from .schemas import (
    BulkDiscardRequest, BulkReplayRequest, BulkResult, DiscardRequest, Failure, FailureList, ReplayRequest,
    Resolution, answer, request_body,
)
from .streams import object_body
from .subscriptions import MAX_WAIT_S, until_shutdown

router = APIRouter(prefix="/v1/failures", tags=["failures"], responses=ERROR_RESPONSES)

FAILURE_ID = Path(description="A failure id (dl_..., ht_..., sk_...)")
FILTERS = {"kind", "receiver", "stream", "actor", "instance_id", "subscription", "since", "until"}


def failures_of(request: Request, principal: Principal) -> Failures:
    return runtime_of(request).failures(principal.tenant)


async def shown(request: Request, principal: Principal, failures: list[FailureRecord]) -> list[dict[str, Any]]:
    """The failures as JSON, the events (and error texts) of pinned streams left out."""
    pins = PinnedPaths(runtime_of(request), principal.tenant)
    out = []
    for f in failures:
        d = f.to_dict()
        if await pins.pinned(f.path):
            # Error texts and tracebacks often quote the event: left out with it.
            d["event"] = d["error"] = d["traceback"] = None
            d["attempts"] = [{**a, "error": None} for a in d["attempts"]]
        out.append(d)
    return out


async def refuse_corrections_of_pinned(request: Request, principal: Principal, failures: list[FailureRecord]) -> None:
    for path in {f.path for f in failures if f.path is not None}:
        await refuse_pinned(runtime_of(request), principal.tenant, path)


def selection_of(body: dict[str, Any]) -> dict[str, Any]:
    return object_body(body.get("filter"), FILTERS, "filter")


@router.get("", responses={200: answer(FailureList, "Open failures, oldest first")}, summary="List failures")
async def list_failures(
    request: Request,
    kind: str | None = Query(None, description="dead_letter, halted or skipped"),
    receiver: str | None = Query(None, description="actor, copy, webhook, call or processor"),
    stream: str | None = Query(None, description="The event's stream"),
    actor: str | None = Query(None),
    instance_id: str | None = Query(None),
    subscription: str | None = Query(None, description="A subscription's name"),
    since: int | None = Query(None, ge=0, le=MAX_INT, description="failed_at at or after (ms since the epoch)"),
    until: int | None = Query(None, ge=0, le=MAX_INT, description="failed_at before (ms since the epoch)"),
    limit: int = Query(100, ge=1, le=1000),
    principal: Principal = READ,
) -> Response:
    listed = await failures_of(request, principal).list(
        kind=kind, receiver=receiver, stream=stream, actor=actor, instance_id=instance_id,
        subscription=subscription, since=since, until=until, limit=limit,
    )
    return json_response({"failures": await shown(request, principal, listed)})


async def bulk_of(request: Request, *fields: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A by-filter body: (the body, the keyword arguments of the filter and limit)."""
    body = object_body(await json_body(request), {"filter", "limit", *fields})
    return body, {"limit": body.get("limit", 1000), **selection_of(body)}


@router.post(
    "/replay", openapi_extra=request_body(BulkReplayRequest),
    responses={200: answer(BulkResult, "What was replayed, and what could not be")},
    summary="Replay every failure a filter selects",
)
async def replay_all(request: Request, principal: Principal = ADMIN) -> Response:
    body, chosen = await bulk_of(request, "event", "patch")
    event, patch = body.get("event"), body.get("patch")
    check = None if event is None and patch is None else functools.partial(refuse_corrections_of_pinned, request,
                                                                           principal)
    bulk = await failures_of(request, principal).replay_all(event=event, patch=patch, check=check, **chosen)
    return json_response(bulk.to_dict())


@router.post(
    "/discard", openapi_extra=request_body(BulkDiscardRequest),
    responses={200: answer(BulkResult, "What was discarded, and what could not be")},
    summary="Discard every failure a filter selects, with a reason",
)
async def discard_all(request: Request, principal: Principal = ADMIN) -> Response:
    body, chosen = await bulk_of(request, "reason")
    return json_response((await failures_of(request, principal).discard_all(body.get("reason"), **chosen)).to_dict())


@router.get(
    "/{failure_id}", responses={200: answer(Failure, "The failure, its event and attempts")},
    summary="One failure",
)
async def show_failure(request: Request, failure_id: str = FAILURE_ID, principal: Principal = READ) -> Response:
    [failure] = await shown(request, principal, [await failures_of(request, principal).get(failure_id)])
    return json_response(failure)


@router.post(
    "/{failure_id}/replay",
    openapi_extra=request_body(ReplayRequest, required=False, description="No body: replay as it is"),
    responses={200: answer(Resolution, "Replayed (yoke.failure.replayed appended)")},
    summary="Replay a failure, as it is or corrected (a patch of the event, or its fields replaced)",
)
async def replay(
    request: Request,
    failure_id: str = FAILURE_ID,
    wait: bool = Query(False, description="Then wait for what becomes of the event: the answer's outcome"),
    timeout_s: float = Query(
        30.0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False,
        description="With wait: how long to wait (then outcome.state is pending)",
    ),
    principal: Principal = ADMIN,
) -> Response:
    body = object_body(await optional_json_body(request), {"event", "patch"})
    inbox = failures_of(request, principal)
    if body.get("event") is not None or body.get("patch") is not None:
        await refuse_corrections_of_pinned(request, principal, [await inbox.get(failure_id)])
    done = await inbox.replay(failure_id, body.get("event"), patch=body.get("patch"))
    if wait:
        # Only the wait gives way to a shutdown: the replay above is done.
        outcome = await until_shutdown(request, inbox.outcome(done, timeout_s=timeout_s))
        if outcome.error is not None and done.failure is not None:
            pins = PinnedPaths(runtime_of(request), principal.tenant)
            if await pins.pinned(done.failure.path):  # error texts often quote the event
                outcome = replace(outcome, error=None)
        done = replace(done, outcome=outcome)
    return json_response(done.to_dict())


@router.post(
    "/{failure_id}/discard", openapi_extra=request_body(DiscardRequest),
    responses={200: answer(Resolution, "Discarded (yoke.failure.discarded appended)")},
    summary="Discard a failure, with a reason",
)
async def discard(request: Request, failure_id: str = FAILURE_ID, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"reason"})
    done = await failures_of(request, principal).discard(failure_id, body.get("reason"))
    return json_response(done.to_dict())
