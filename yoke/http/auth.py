"""Bearer-token authentication and scope checks.

Every route depends on ``require(scope)``. The token decides the tenant; a
request that names another tenant (``?tenant=``) is refused with 403 whether
or not that tenant or stream exists, so responses never reveal another
tenant's streams. ``admin`` includes ``read`` and ``append``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .. import errors
from ..runtime import Runtime
from ..store.contract import TokenInfo

# Authenticated tokens are remembered this long, so most requests skip the
# token lookup; a revocation reaches other processes within this time.
TOKEN_CACHE_S = 2.0

bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer yk_tok_...`")


@dataclass(frozen=True)
class Principal:
    tenant: str
    scopes: tuple[str, ...]
    token_id: str


class TokenCache:
    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, TokenInfo]] = {}
        self._revoked: set[str] = set()  # revoked here: never cache them again

    def get(self, key: str) -> TokenInfo | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, key: str, info: TokenInfo) -> None:
        if info.token_id in self._revoked:
            return
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + TOKEN_CACHE_S, info)

    def revoked(self, token_id: str) -> bool:
        return token_id in self._revoked

    def forget(self, token_id: str) -> None:
        self._revoked.add(token_id)
        for key, (_, info) in list(self._entries.items()):
            if info.token_id == token_id:
                del self._entries[key]


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


async def authorize(state: Any, token: str | None, tenant: str | None, scope: str) -> Principal:
    """The caller behind ``token``, if it may act with ``scope`` on ``tenant``."""
    cache: TokenCache = state.token_cache
    key = hashlib.sha256(token.encode()).hexdigest() if token else ""
    info = cache.get(key) if key else None
    if info is None:
        info = await state.runtime.tokens.authenticate(token)
        cache.put(key, info)
        if cache.revoked(info.token_id):  # revoked while we were looking it up
            raise errors.Unauthorized("a valid bearer token is required")
    if scope not in info.scopes and "admin" not in info.scopes:
        raise errors.Forbidden(f"this token lacks the {scope!r} scope", scope=scope)
    if tenant is not None and tenant != info.tenant:
        raise errors.Forbidden("this token belongs to another tenant")
    return Principal(info.tenant, info.scopes, info.token_id)


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of an ``Authorization: Bearer ...`` header."""
    if not authorization:
        return None
    kind, _, credentials = authorization.partition(" ")
    return credentials.strip() if kind.lower() == "bearer" else None


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    async def check(
        request: Request,
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
        tenant: str | None = Query(None, description="Defaults to the token's tenant; any other is 403."),
    ) -> Principal:
        token = credentials.credentials if credentials is not None else None
        return await authorize(request.app.state, token, tenant, scope)

    return check


READ = Depends(require("read"))
APPEND = Depends(require("append"))
ADMIN = Depends(require("admin"))
