"""API tokens: bearer secrets bound to one tenant with scopes.

A token reads ``yk_<token_id>.<secret>``. Only a SHA-256 of the secret is
stored (the secret is 256 random bits, so a fast hash is enough), and the
comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from . import errors
from .events import check_text, now_ms, validate_tenant
from .store.contract import Store, TokenInfo

SCOPES = ("read", "append", "admin")
TOKEN_RE = re.compile(r"yk_(tok_[0-9a-f]{16})\.([A-Za-z0-9_\-]{43})")
TOKEN_ID_RE = re.compile(r"tok_[0-9a-f]{16}")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# A scope of the application's own (``pii:read``): what a workflow stream's
# definition may name to lift a redaction or to allow reading or appending
# (streams/pins.py). The colon keeps a misspelt built-in scope an error.
CUSTOM_SCOPE_RE = re.compile(r"[a-z][a-z0-9_.-]{0,31}:[a-z0-9_.-]{1,32}")


def check_scopes(scopes: Iterable[str]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(scopes))
    unknown = [s for s in chosen if s not in SCOPES and not (isinstance(s, str) and CUSTOM_SCOPE_RE.fullmatch(s))]
    if unknown or not chosen:
        raise errors.InvalidInput(
            f"scopes are a non-empty list of {', '.join(SCOPES)} or scopes of your own written"
            " name:thing (a-z, 0-9, _ . -)", field="scopes", unknown=unknown,
        )
    return chosen


@dataclass(frozen=True)
class NewToken:
    token: str  # the bearer secret: shown once, never stored
    info: TokenInfo


class Tokens:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def create(self, tenant: str, scopes: Iterable[str], name: str = "") -> NewToken:
        validate_tenant(tenant)
        if not isinstance(name, str) or len(name) > 200:
            raise errors.InvalidInput("a token name is at most 200 characters", field="name")
        check_text(name, "name", errors.InvalidInput)
        token_id = "tok_" + secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        info = TokenInfo(
            token_id=token_id,
            tenant=tenant,
            name=name,
            scopes=check_scopes(scopes),
            secret_hash=_hash(secret),
            created_at=now_ms(),
            revoked_at=None,
        )
        await self.store.create_token(info)
        return NewToken(token=f"yk_{token_id}.{secret}", info=info)

    async def list(self, tenant: str) -> list[TokenInfo]:
        return await self.store.list_tokens(validate_tenant(tenant))

    async def revoke(self, tenant: str, token_id: str) -> bool:
        if not isinstance(token_id, str) or not TOKEN_ID_RE.fullmatch(token_id):
            return False
        return await self.store.revoke_token(validate_tenant(tenant), token_id, now_ms())

    async def authenticate(self, bearer: str | None) -> TokenInfo:
        """The token's record, or ``Unauthorized`` (missing, malformed,
        unknown, wrong secret or revoked: all look the same to the caller)."""
        match = TOKEN_RE.fullmatch(bearer or "")
        if match is None:
            raise errors.Unauthorized("a valid bearer token is required")
        token_id, secret = match.groups()
        info = await self.store.find_token(token_id)
        expected = info.secret_hash if info is not None else _hash("")
        ok = hmac.compare_digest(_hash(secret), expected)
        if info is None or not ok or info.revoked_at is not None:
            raise errors.Unauthorized("a valid bearer token is required")
        return info
