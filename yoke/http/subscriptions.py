"""``/v1/streams/{path}/-/subscriptions``: the subscriptions of a source stream.

A subscription name is 1-500 arbitrary characters (``/`` included), so the
routes about one subscription take it in the query string:
``/v1/streams/orders/-/subscription?name=to-billing``. The collection is
``.../-/subscriptions``.

Configuring, removing, pausing, halting, resuming and moving a cursor need ``admin`` (a
webhook sends the tenant's events out of Yoke); listing, showing and waiting
need ``read``. The routes call the same ``Stream`` methods as Python.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Query, Request
from fastapi.routing import APIRouter
from starlette.responses import Response

from .. import errors
from ..events import MAX_OFFSET, json_text
from ..subscriptions import receivers
from ..subscriptions.catalogue import MAX_NAME_CHARS
from ..subscriptions.management import HISTORY_SCAN, SubscriptionStatus
from .auth import ADMIN, READ, Principal
from .responses import ErrorBody, json_body, json_response
from .schemas import (
    Subscribed, SubscriptionCursor, SubscriptionHistory, SubscriptionList, SubscriptionRequest,
    SubscriptionStatus as SubscriptionStatusAnswer, answer, request_body,
)
from .streams import PATH_PARAM, object_body, stream_of

T = TypeVar("T")

MAX_WAIT_S = 60.0  # a waiting request holds a connection: keep it short over HTTP


ERROR_DESCRIPTIONS = {
    400: "Invalid input (invalid_input, invalid_subscription, invalid_filter, invalid_transform,"
         " invalid_cursor, invalid_path)",
    401: "Missing or invalid bearer token (unauthorized)",
    403: "Missing scope, or another tenant (forbidden)",
    404: "No such subscription on this stream (subscription_not_found); history: no such stream"
         " (stream_not_found)",
    409: "The source stream is closed: its control events cannot be appended (stream_closed)",
    413: "The request body is too large (event_too_large)",
    429: "The source stream reached its unread ceiling; see Retry-After (backpressure)",
    503: "The server is shutting down (runtime_closed)",
    504: "Not processed through the offset within timeout_s (not_processed)",
    507: "The source stream reached its total ceiling (quota_exhausted)",
}


def answers(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route documents: 400, 401 and 403, plus ``statuses``."""
    return {
        status: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[status]}
        for status in (400, 401, 403, *statuses)
    }


# A change of configuration appends control events to the source stream,
# which a closed or full stream refuses.
CONTROL = (409, 429, 507)

router = APIRouter(prefix="/v1/streams", tags=["subscriptions"])

NAME = Query(min_length=1, max_length=MAX_NAME_CHARS, description="The subscription's name")

SUBSCRIBE_BODY = request_body(SubscriptionRequest)
CURSOR_BODY = request_body(SubscriptionCursor)
STATUS = {200: answer(SubscriptionStatusAnswer, "The subscription: configuration, cursor, lag, halt, errors")}
SUBSCRIBE_FIELDS = {"name", "receiver", "filter", "transform", "start", "on_failing_event"}


def status_json(status: SubscriptionStatus) -> dict[str, Any]:
    return status.to_dict()


def receiver_of(raw: Any) -> receivers.Receiver:
    if raw is None:
        raise errors.InvalidInput("receiver is required", field="receiver")
    json_text(raw, "receiver")  # storable: no NUL (else the control event would refuse it)
    if isinstance(raw, dict) and not isinstance(raw.get("kind"), str):  # from_dict assumes hashable
        raise errors.InvalidInput("receiver.kind is copy, call, processor or webhook", field="receiver.kind")
    try:
        return receivers.from_dict(raw)
    except ValueError as exc:  # urlsplit refuses some URLs outright ("http://[::1")
        raise errors.InvalidInput(f"a webhook url is an http(s) URL: {exc}", field="receiver.url") from None


def filter_of(raw: Any) -> Any:
    """What ``Filter.from_dict`` gets; expressions must be text (it assumes so)."""
    if raw is None:
        return None
    if isinstance(raw, dict):
        for field in ("where", "key"):
            if raw.get(field) is not None and not isinstance(raw[field], str):
                raise errors.InvalidFilter(f"{field} must be a JSONata expression (a string)", field=field)
    return raw


def default(value: Any, fallback: Any) -> Any:
    return fallback if value is None else value


# --- the collection ------------------------------------------------------------


@router.post(
    "{path:path}/-/subscriptions", status_code=201, openapi_extra=SUBSCRIBE_BODY,
    responses={
        200: answer(Subscribed, "An identical configuration already stands; nothing appended"),
        201: answer(Subscribed, "Configured (a webhook secret generated here is answered once)"),
        **answers(413, *CONTROL),
    },
    summary="Configure a subscription (200 when an identical one already stands)",
)
async def subscribe(request: Request, path: str = PATH_PARAM, principal: Principal = ADMIN) -> Response:
    stream = stream_of(request, principal, path)
    body = object_body(await json_body(request), SUBSCRIBE_FIELDS)
    subscribed = await stream.subscribe(
        body.get("name"),
        receiver_of(body.get("receiver")),
        filter=filter_of(body.get("filter")),
        transform=body.get("transform"),
        start=default(body.get("start"), "now"),
        on_failing_event=default(body.get("on_failing_event"), "halt"),
    )
    return json_response(
        {
            "name": subscribed.name,
            "path": stream.path,
            "offset": subscribed.offset,
            "id": subscribed.id,
            "created": subscribed.created,
            "replaced": subscribed.replaced,
            "secret": subscribed.secret,
        },
        status_code=201 if subscribed.created else 200,
    )


@router.get(
    "{path:path}/-/subscriptions", responses={200: answer(SubscriptionList, "The subscriptions"), **answers()},
    summary="List the stream's subscriptions",
)
async def list_subscriptions(request: Request, path: str = PATH_PARAM, principal: Principal = READ) -> Response:
    listed = await stream_of(request, principal, path).subscriptions()
    return json_response({"subscriptions": [status_json(s) for s in listed]})


# --- one subscription (?name=) -----------------------------------------------------


@router.get(
    "{path:path}/-/subscription", responses={**STATUS, **answers(404)},
    summary="A subscription: configuration, cursor, lag, halt, errors",
)
async def show(request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = READ) -> Response:
    return json_response(status_json(await stream_of(request, principal, path).subscription(name)))


@router.delete(
    "{path:path}/-/subscription", status_code=204, response_class=Response, responses=answers(404, *CONTROL),
    summary="Remove a subscription",
)
async def remove(request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = ADMIN) -> Response:
    await stream_of(request, principal, path).unsubscribe(name)
    return Response(status_code=204)


@router.post(
    "{path:path}/-/subscription/pause", responses={**STATUS, **answers(404, *CONTROL)},
    summary="Pause a subscription: delivery stops, the cursor stays, its state is parked (resume continues)",
)
async def pause(request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = ADMIN) -> Response:
    return json_response(status_json(await stream_of(request, principal, path).pause(name)))


@router.post(
    "{path:path}/-/subscription/halt", responses={**STATUS, **answers(404, *CONTROL)},
    summary="Halt a subscription by command (only resume starts it again, never a deployment)",
)
async def halt(request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = ADMIN) -> Response:
    return json_response(status_json(await stream_of(request, principal, path).halt(name)))


@router.post(
    "{path:path}/-/subscription/resume", responses={**STATUS, **answers(404, *CONTROL)},
    summary="Resume a halted or parked subscription where it stopped",
)
async def resume(request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = ADMIN) -> Response:
    return json_response(status_json(await stream_of(request, principal, path).resume(name)))


@router.post(
    "{path:path}/-/subscription/cursor", openapi_extra=CURSOR_BODY, responses={**STATUS, **answers(404, 413, *CONTROL)},
    summary="Move the cursor (deliver again, or skip ahead); a new delivery run",
)
async def set_cursor(
    request: Request, path: str = PATH_PARAM, name: str = NAME, principal: Principal = ADMIN
) -> Response:
    stream = stream_of(request, principal, path)
    body = object_body(await json_body(request), {"after_offset", "resume"})
    if "after_offset" not in body:
        raise errors.InvalidInput('give {"after_offset": N}', field="after_offset")
    also_resume = default(body.get("resume"), False)
    if not isinstance(also_resume, bool):
        raise errors.InvalidInput("resume must be true or false", field="resume")
    if also_resume:
        status = await stream.set_cursor_and_resume(name, body["after_offset"])
    else:
        status = await stream.set_cursor(name, body["after_offset"])
    return json_response(status_json(status))


@router.get(
    "{path:path}/-/subscription/history",
    responses={200: answer(SubscriptionHistory, "A page of its control events"), **answers(404)},
    summary="A subscription's configuration history: its control events in the log",
)
async def history(
    request: Request,
    path: str = PATH_PARAM,
    name: str = NAME,
    after: int = Query(0, ge=0, le=MAX_OFFSET, description="Look at the events after this offset"),
    scan: int = Query(HISTORY_SCAN, ge=1, le=100_000, description="Look at this many events at most"),
    principal: Principal = READ,
) -> Response:
    found = await stream_of(request, principal, path).subscription_history(name, after=after, scan=scan)
    return json_response(found.to_dict())


@router.get(
    "{path:path}/-/subscription/wait", responses={**STATUS, **answers(404, 503, 504)},
    summary="Wait until the subscription processed through an offset",
)
async def wait(
    request: Request,
    path: str = PATH_PARAM,
    name: str = NAME,
    offset: int | None = Query(
        None, ge=0, lt=2**63, description="Default: the stream's head when the request arrives"
    ),
    timeout_s: float = Query(20.0, ge=0, le=MAX_WAIT_S, allow_inf_nan=False),
    principal: Principal = READ,
) -> Response:
    stream = stream_of(request, principal, path)
    if offset is None:
        offset = (await stream.subscription(name)).head
    status = await until_shutdown(request, stream.wait_until_processed(name, offset, timeout_s))
    return json_response(status_json(status))


async def until_shutdown(request: Request, work: Awaitable[T]) -> T:
    """``work``'s result, or 503 ``runtime_closed`` as soon as the server
    begins to shut down (a wait must not hold the graceful shutdown)."""
    shutdown: asyncio.Event = request.app.state.shutdown
    task = asyncio.ensure_future(work)
    stop = asyncio.ensure_future(shutdown.wait())
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, stop):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.done() and not task.cancelled():
        return task.result()
    raise errors.RuntimeClosed("the server is shutting down")
