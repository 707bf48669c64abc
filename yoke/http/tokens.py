"""``/v1/tokens``: an admin token manages its own tenant's tokens."""

from __future__ import annotations


from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from .. import errors
from .auth import ADMIN, Principal, runtime_of
from .responses import ERROR_RESPONSES, json_body, json_response
from .schemas import NewToken, TokenList, TokenRequest, answer, request_body
from .streams import object_body

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=ERROR_RESPONSES)


@router.post(
    "", status_code=201, openapi_extra=request_body(TokenRequest),
    responses={201: answer(NewToken, "The new token, with its secret (shown this once)")},
    summary="Create a token for this tenant (shown once)",
)
async def create(request: Request, principal: Principal = ADMIN) -> Response:
    body = object_body(await json_body(request), {"scopes", "name", "expires_in_s"})
    scopes = body.get("scopes")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise errors.InvalidInput("scopes is a list of read, append, admin or name:thing", field="scopes")
    new = await runtime_of(request).tokens.create(
        principal.tenant, scopes, body.get("name", ""), expires_in_s=body.get("expires_in_s")
    )
    return json_response({"token": new.token, **new.info.to_dict()}, status_code=201)


@router.get("", responses={200: answer(TokenList, "The tenant's tokens (never their secrets)")},
            summary="List this tenant's tokens")
async def list_tokens(request: Request, principal: Principal = ADMIN) -> Response:
    tokens = await runtime_of(request).tokens.list(principal.tenant)
    return json_response({"tokens": [t.to_dict() for t in tokens]})


@router.delete("/{token_id}", status_code=204, response_class=Response, summary="Revoke a token")
async def revoke(request: Request, token_id: str = Path(), principal: Principal = ADMIN) -> Response:
    if not await runtime_of(request).tokens.revoke(principal.tenant, token_id):
        raise errors.TokenNotFound(f"no active token {token_id}", token_id=token_id)
    request.app.state.token_cache.forget(token_id)
    return Response(status_code=204)
