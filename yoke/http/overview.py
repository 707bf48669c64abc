"""``GET /v1/overview``: the token's tenant at a glance (``yoke.overview``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from ..overview import overview as tenant_overview
from . import sse
from .auth import READ, Principal, runtime_of
from .responses import ERROR_RESPONSES, json_response
from .schemas import Overview, answer

router = APIRouter(prefix="/v1", tags=["overview"], responses=ERROR_RESPONSES)


@router.get(
    "/overview", responses={200: answer(Overview, "Streams, queues, dead letters, fan-out and subscription lag")},
    summary="The tenant at a glance",
)
async def overview(request: Request, principal: Principal = READ) -> Response:
    runtime = runtime_of(request)
    found = await tenant_overview(
        runtime.store, principal.tenant, open_tails=sse.OPEN_TAILS[principal.tenant], clock=runtime.clock
    )
    return json_response(found.to_dict())
