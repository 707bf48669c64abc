"""``/v1/portals/{name}[/{rest}]``: HTTP ingress into the application's portals.

Any method is passed to the portal's handler as a ``PortalRequest`` (method,
the path below the portal, query, headers, raw body). A portal needs no
Yoke token: external senders (a GitHub webhook, say) are verified by the
handler itself. When the request carries a valid Yoke token with the
``append`` scope, the handler runs in that token's tenant; without one (or
with a bearer credential that is not a Yoke token), in the portal's own
tenant. The handler's answer is sent as JSON with its status (no body when
it returns None).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from .. import errors
from ..actors.portals import PortalRequest, handle_request
from .auth import authorize, bearer_token, runtime_of
from .responses import ERROR_RESPONSES, MAX_JSON_BODY_BYTES, json_response, limited_body
from .schemas import PortalAnswer, PortalBody, answer, request_body

log = logging.getLogger("yoke.http")

router = APIRouter(prefix="/v1/portals", tags=["portals"], responses=ERROR_RESPONSES)

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
DOCUMENTED = {"GET", "POST", "PUT", "PATCH", "DELETE"}
WITH_BODY = {"POST", "PUT", "PATCH"}
PORTAL_BODY = request_body(PortalBody, required=False, description="Handed to the portal's handler as raw bytes")
PORTAL_ANSWER = {200: answer(PortalAnswer, "The handler's answer, with the status it chose")}


async def portal_tenant(request: Request) -> str | None:
    """The tenant of a valid Yoke token, or None (the portal's own tenant).

    A credential that is not a valid Yoke token belongs to the sender's own
    scheme and is left to the handler; a valid token without ``append`` is
    refused rather than silently ignored.
    """
    token = bearer_token(request.headers.get("authorization"))
    if not token:
        return None
    try:
        principal = await authorize(request.app.state, token, None, "append")
    except errors.Unauthorized:
        return None
    return principal.tenant


async def call_portal(request: Request, name: str, rest: str) -> Response:
    runtime = runtime_of(request)
    app = runtime.app
    if app is None or name not in app.portals:
        raise errors.PortalNotFound(f"no portal named {name[:80]!r}", portal=name[:80])
    tenant = await portal_tenant(request)
    portal_request = PortalRequest(
        method=request.method,
        path="/" + rest,
        query=dict(request.query_params),
        headers=dict(request.headers),
        body=await limited_body(request, MAX_JSON_BODY_BYTES),
    )
    try:
        status, value = await handle_request(
            runtime.actor_kernel, app, name, portal_request, tenant, worker_id=runtime.worker_id
        )
    except errors.YokeError:
        raise  # rendered as {"error": ...} with its status
    except Exception:
        log.exception("portal %s failed", name)
        return json_response(
            {"error": {"code": "internal_error", "message": f"portal {name} failed"}}, status_code=500
        )
    if not isinstance(status, int) or isinstance(status, bool) or not 200 <= status <= 599:
        log.error("portal %s answered with an invalid status %r", name, status)
        return json_response(
            {"error": {"code": "internal_error", "message": f"portal {name} answered an invalid status"}},
            status_code=500,
        )
    if value is None or status in (204, 304) or request.method == "HEAD":
        return Response(status_code=status)
    try:
        return json_response(value, status_code=status)
    except TypeError:
        log.exception("portal %s answered a value that is not JSON", name)
        return json_response(
            {"error": {"code": "internal_error", "message": f"portal {name} answered a value that is not JSON"}},
            status_code=500,
        )


async def portal_root(request: Request, name: str = Path(description="The portal's name")) -> Response:
    return await call_portal(request, name, "")


async def portal_path(
    request: Request,
    name: str = Path(description="The portal's name"),
    rest: str = Path(description="The path below the portal, passed to its handler"),
) -> Response:
    return await call_portal(request, name, rest)


def _register() -> None:
    # One route per method: distinct OpenAPI operation ids.
    for method in METHODS:
        lower = method.lower()
        shown = method in DOCUMENTED
        router.add_api_route(
            "/{name}", portal_root, methods=[method], name=f"portal_{lower}",
            summary=f"{method} to a portal" if shown else None, include_in_schema=shown,
            openapi_extra=PORTAL_BODY if method in WITH_BODY else None, responses=PORTAL_ANSWER,
        )
        router.add_api_route(
            "/{name}/{rest:path}", portal_path, methods=[method], name=f"portal_path_{lower}",
            summary=f"{method} to a path below a portal" if shown else None, include_in_schema=shown,
            openapi_extra=PORTAL_BODY if method in WITH_BODY else None, responses=PORTAL_ANSWER,
        )


_register()
