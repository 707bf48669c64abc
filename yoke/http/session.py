"""Console sessions: a cookie instead of the ``Authorization`` header.

A browser session holds an API token in an ``HttpOnly``, ``SameSite=Strict``
cookie, so the console's script never sees the secret and another site's
page cannot send it. Every request that changes something (any method but
GET, HEAD and OPTIONS) made with the cookie must also carry the session's
CSRF token in ``X-Yoke-CSRF``: an HMAC of the token, which only a page that
read it from ``/ui/session`` (this origin) can know. A request with a bearer
token is not ambient and needs none.

``yoke serve`` prints a console link with a one-time code (``LoginCodes``) on
a terminal: redeeming it creates an admin token for the default tenant named
``console sign-in``, expiring after 7 days (listed with the tenant's tokens;
signing out revokes it). Otherwise the console asks for a token and the
session holds that one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from .. import errors

COOKIE = "yoke_session"
CSRF_HEADER = "x-yoke-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SIGN_IN_TOKEN_NAME = "console sign-in"
SIGN_IN_TOKEN_S = 7 * 86400  # how long a session from the printed link lasts


def csrf_of(token: str) -> str:
    """The CSRF token of a session holding ``token``."""
    return hmac.new(token.encode(), b"yoke console csrf", hashlib.sha256).hexdigest()[:32]


def cookie_token(cookie_header: str | None) -> str | None:
    """The session cookie's value in a ``Cookie`` header."""
    if not cookie_header:
        return None
    for part in cookie_header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def credentials(method: str, headers: Mapping[str, str], bearer: str | None) -> str | None:
    """The token a request acts with: its bearer token, else its session
    cookie's, which a write must confirm with the CSRF header (else 403
    ``forbidden``, reason ``csrf``)."""
    if bearer:
        return bearer
    token = cookie_token(headers.get("cookie"))
    if token is None:
        return None
    if method not in SAFE_METHODS:
        sent = headers.get(CSRF_HEADER, "")
        if not hmac.compare_digest(sent.encode(), csrf_of(token).encode()):
            raise errors.Forbidden(
                f"a console session's write needs its CSRF token in {CSRF_HEADER}", reason="csrf"
            )
    return token


class LoginCodes:
    """One-time codes that sign a browser in (kept in this process only)."""

    def __init__(self) -> None:
        self._codes: set[str] = set()

    def issue(self) -> str:
        code = secrets.token_urlsafe(24)
        self._codes.add(code)
        return code

    def redeem(self, code: str) -> bool:
        """True once per issued code."""
        given = code.encode("utf-8", "surrogatepass")  # any string: a lone surrogate is just wrong
        for known in list(self._codes):
            if hmac.compare_digest(known.encode(), given):
                self._codes.discard(known)
                return True
        return False
