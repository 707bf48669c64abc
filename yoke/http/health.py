"""``/healthz``, ``/readyz`` and ``/metrics``."""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from .. import errors
from ..metrics import sample_actor_gauges, sample_failure_gauges, sample_memory
from .auth import bearer_token, runtime_of
from .responses import error_response, json_response
from .schemas import Health, NotReady, Ready, answer, text_answer

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
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        200: text_answer(
            "text/plain", "Prometheus text format",
            "# HELP yoke_open_tails Open tails\n# TYPE yoke_open_tails gauge\nyoke_open_tails 0.0\n",
        ),
        401: {"description": "YOKE_METRICS_TOKEN is set and the request lacks it (unauthorized)"},
    },
)
async def metrics(request: Request) -> Response:
    expected = runtime_of(request).settings.metrics_token
    if expected:
        given = bearer_token(request.headers.get("authorization")) or ""
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return error_response(errors.Unauthorized("/metrics needs the metrics token"))
    await sample_actor_gauges(runtime_of(request).store.actors)
    await sample_failure_gauges(runtime_of(request))
    sample_memory(runtime_of(request))
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
