"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from .auth import ADMIN, Principal, runtime_of
from .metrics_access import MetricsAccess
from .responses import json_response
from .schemas import Health, Idle, NotReady, Ready, answer, text_answer

router = APIRouter(tags=["operations"])


@router.get("/healthz", responses={200: answer(Health, "Up")}, summary="The process is up")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@router.get(
    "/readyz", responses={200: answer(Ready, "Ready"), 503: answer(NotReady, "Not ready, and why")},
    summary="The store is reachable and migrated",
)
async def readyz(request: Request) -> Response:
    runtime = runtime_of(request)
    try:
        await runtime.ready()
    except Exception as exc:  # any failure means "not ready", with the reason
        return json_response({"status": "unavailable", "reason": str(exc)[:500]}, status_code=503)
    return json_response({"status": "ready"})


@router.get(
    "/v1/idle", responses={200: answer(Idle, "Idle, or what is busy when the time ran out")},
    summary="Wait until the actors are idle (tests, scripts)",
)
async def idle(
    request: Request,
    timeout_s: float = Query(10.0, ge=0, le=60, description="How long to wait (seconds)"),
    principal: Principal = ADMIN,
) -> Response:
    """Until fan-out has caught up and no queue row of this server's actors
    is pending or processing (``Runtime.wait_idle``, every tenant: admin
    scope); a server without actors is idle."""
    runtime = runtime_of(request)
    if runtime.executor is None:
        return json_response({"idle": True, "busy": ""})
    try:
        await runtime.wait_idle(timeout_s)
    except TimeoutError as exc:
        return json_response({"idle": False, "busy": str(exc)})
    return json_response({"idle": True, "busy": ""})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: text_answer(
            "text/plain", "Prometheus text format",
            "# HELP yoke_open_tails Open tails\n# TYPE yoke_open_tails gauge\nyoke_open_tails 0.0\n",
        ),
        401: {"description": "The metrics token is required and missing, or /metrics is closed off loopback"
                             " (docs/production/metrics.md)"},
    },
)
async def metrics_route(request: Request) -> Response:
    """From memory only (the database-sampled gauges are refreshed in the
    background), so it answers while the database is down."""
    runtime = runtime_of(request)
    access = getattr(request.app.state, "metrics_access", None) or MetricsAccess.of(
        runtime.settings, runtime.settings.host
    )
    access.check(request.headers.get("authorization"))
    return Response(runtime.exposition(), media_type=CONTENT_TYPE_LATEST)
