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
from .clock import SYSTEM, Clock, wall_ms
from .events import check_text, validate_tenant
from .store.contract import Store, TokenInfo

SCOPES = ("read", "append", "admin")
# The longest a token may be made to last (an expiry is for tokens that should end).
MAX_EXPIRY_S = 10 * 366 * 86400
TOKEN_RE = re.compile(r"yk_(tok_[0-9a-f]{16})\.([A-Za-z0-9_\-]{43})")
TOKEN_ID_RE = re.compile(r"tok_[0-9a-f]{16}")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


# A scope of the application's own (``pii:read``): what a workflow stream's
# definition may name to lift a redaction or to allow reading or appending
# (streams/data_handling.py). The colon keeps a misspelt built-in scope an error.
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
    def __init__(self, store: Store, clock: Clock = SYSTEM) -> None:
        self.store = store
        self.clock = clock  # creation, revocation and expiry times

    async def create(
        self, tenant: str, scopes: Iterable[str], name: str = "", *, expires_in_s: int | None = None
    ) -> NewToken:
        """A new token; with ``expires_in_s`` it is refused (``token_expired``) from then on."""
        validate_tenant(tenant)
        if not isinstance(name, str) or len(name) > 200:
            raise errors.InvalidInput("a token name is at most 200 characters", field="name")
        check_text(name, "name", errors.InvalidInput)
        if expires_in_s is not None and (
            isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int) or not 1 <= expires_in_s <= MAX_EXPIRY_S
        ):
            raise errors.InvalidInput(
                f"expires_in_s is a whole number of seconds, 1 to {MAX_EXPIRY_S} (10 years)", field="expires_in_s"
            )
        token_id = "tok_" + secrets.token_hex(8)
        secret = secrets.token_urlsafe(32)
        created = wall_ms(self.clock)
        info = TokenInfo(
            token_id=token_id,
            tenant=tenant,
            name=name,
            scopes=check_scopes(scopes),
            secret_hash=_hash(secret),
            created_at=created,
            revoked_at=None,
            expires_at=None if expires_in_s is None else created + expires_in_s * 1000,
        )
        await self.store.create_token(info)
        return NewToken(token=f"yk_{token_id}.{secret}", info=info)

    async def list(self, tenant: str) -> list[TokenInfo]:
        return await self.store.list_tokens(validate_tenant(tenant))

    async def revoke(self, tenant: str, token_id: str) -> bool:
        if not isinstance(token_id, str) or not TOKEN_ID_RE.fullmatch(token_id):
            return False
        return await self.store.revoke_token(validate_tenant(tenant), token_id, wall_ms(self.clock))

    async def authenticate(self, bearer: str | None) -> TokenInfo:
        """The token's record, or ``Unauthorized`` (missing, malformed,
        unknown, wrong secret or revoked: all look the same to the caller),
        or ``TokenExpired`` (the right secret, past its expiry)."""
        match = TOKEN_RE.fullmatch(bearer or "")
        if match is None:
            raise errors.Unauthorized("a valid bearer token is required")
        token_id, secret = match.groups()
        info = await self.store.find_token(token_id)
        expected = info.secret_hash if info is not None else _hash("")
        ok = hmac.compare_digest(_hash(secret), expected)
        if info is None or not ok or info.revoked_at is not None:
            raise errors.Unauthorized("a valid bearer token is required")
        self.check_expiry(info)
        return info


    def check_expiry(self, info: TokenInfo) -> None:
        """``TokenExpired`` once the token's expiry has come by the clock
        (also asked of tokens an HTTP server remembers, whose expiry can pass
        while remembered)."""
        check_expiry(info, wall_ms(self.clock))


def check_expiry(info: TokenInfo, now: int) -> None:
    """``TokenExpired`` once the token's expiry has come at ``now``."""
    if info.expires_at is not None and info.expires_at <= now:
        raise errors.TokenExpired(
            f"token {info.token_id} expired; create a new one (yoke tokens create, POST /v1/tokens)",
            token_id=info.token_id, expired_at=info.expires_at,
        )
