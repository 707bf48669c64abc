"""Bearer-token authentication and scope checks.

Every route depends on ``require(scope)``. A console session's cookie stands
in for the header (``session.py``: writes need its CSRF token too). The token decides the tenant; a
request that names another tenant (``?tenant=``) is refused with 403 whether
or not that tenant or stream exists, so responses never reveal another
tenant's streams. ``admin`` includes ``read`` and ``append``.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .. import errors
from ..clock import SYSTEM, Clock
from ..runtime import Runtime
from ..store.contract import TokenInfo
from . import session

# Authenticated tokens are remembered this long, so most requests skip the
# token lookup; a revocation reaches other processes within this time.
TOKEN_CACHE_S = 2.0
# At most this many are remembered (the oldest go first).
TOKEN_CACHE_MAX = 10_000
# A token revoked through this process is not cached again for this long:
# longer than any lookup that started before the revocation can take.
REVOKED_KEEP_S = 60.0

bearer = HTTPBearer(auto_error=False, description="`Authorization: Bearer yk_tok_...`")


@dataclass(frozen=True)
class Principal:
    tenant: str
    scopes: tuple[str, ...]
    token_id: str


class TokenCache:
    """Authenticated tokens by the hash of their secret, each for ``ttl_s``
    and at most ``max_entries`` of them. Entries are kept in the order they
    expire (one TTL for all), so expired ones are dropped from the front."""

    def __init__(
        self, max_entries: int = TOKEN_CACHE_MAX, ttl_s: float = TOKEN_CACHE_S,
        revoked_keep_s: float = REVOKED_KEEP_S, clock: Clock = SYSTEM,
    ) -> None:
        self._clock = clock  # the runtime's (monotonic): how long entries stay
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self.revoked_keep_s = revoked_keep_s
        self._entries: OrderedDict[str, tuple[float, TokenInfo]] = OrderedDict()
        # Token ids revoked here, until when they must not be cached again.
        self._revoked: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def revocations(self) -> int:
        return len(self._revoked)

    def get(self, key: str) -> TokenInfo | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock.monotonic():
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: str, info: TokenInfo) -> None:
        now = self._clock.monotonic()
        self._expire(now)
        if info.token_id in self._revoked:
            return
        self._entries.pop(key, None)  # to the back: the order stays the expiry order
        self._entries[key] = (now + self.ttl_s, info)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def revoked(self, token_id: str) -> bool:
        until = self._revoked.get(token_id)
        return until is not None and until > self._clock.monotonic()

    def forget(self, token_id: str) -> None:
        now = self._clock.monotonic()
        self._expire(now)
        self._revoked.pop(token_id, None)
        self._revoked[token_id] = now + self.revoked_keep_s
        while len(self._revoked) > self.max_entries:
            self._revoked.popitem(last=False)
        for key, (_, info) in list(self._entries.items()):
            if info.token_id == token_id:
                del self._entries[key]

    def _expire(self, now: float) -> None:
        entries, revoked = self._entries, self._revoked
        while entries and next(iter(entries.values()))[0] <= now:
            entries.popitem(last=False)
        while revoked and next(iter(revoked.values())) <= now:
            revoked.popitem(last=False)


# Who a request without a token is on a ``yoke serve --dev`` server.
DEV = Principal("default", ("admin", "read", "append"), "dev")


def runtime_of(request: Request) -> Runtime:
    return request.app.state.runtime


async def authorize(state: Any, token: str | None, tenant: str | None, scope: str | None) -> Principal:
    """The caller behind ``token``, if it may act with ``scope`` on ``tenant``
    (``scope`` None: whatever its scopes, for checks that only need the tenant).
    A server started with ``--dev`` takes a request without a token as
    tenant ``default`` with every scope."""
    if not token and getattr(state, "dev", False):
        if tenant is not None and tenant != DEV.tenant:
            raise errors.Forbidden("without a token, requests act as tenant default")
        return DEV
    cache: TokenCache = state.token_cache
    key = hashlib.sha256(token.encode()).hexdigest() if token else ""
    info = cache.get(key) if key else None
    if info is None:
        info = await state.runtime.tokens.authenticate(token)
        cache.put(key, info)
        if cache.revoked(info.token_id):  # revoked while we were looking it up
            raise errors.Unauthorized("a valid bearer token is required")
    else:
        state.runtime.tokens.check_expiry(info)  # it may have expired while remembered
    if scope is not None and scope not in info.scopes and "admin" not in info.scopes:
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
        bearer = credentials.credentials if credentials is not None else None
        token = session.credentials(request.method, request.headers, bearer)
        return await authorize(request.app.state, token, tenant, scope)

    return check


READ = Depends(require("read"))
APPEND = Depends(require("append"))
ADMIN = Depends(require("admin"))
