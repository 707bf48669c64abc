"""Which browser origins may call the server (``cors_origins``), on every
surface alike: ``/v1`` (Yoke's API), ``/api/workflow-streams`` and
``/v1/stream`` (the Durable Streams protocol).

Unset, nothing here runs and each surface keeps its old behaviour: the
Durable Streams routes answer any origin (``*``, as the protocol's browser
clients and conformance suite expect) and the rest none. Set, this layer
decides for all of them: ``*`` (any origin), ``none`` (no origin), or a
comma-separated list of origins (``https://app.example.com``). Allowed
origins get ``Access-Control-Allow-Origin`` on every answer and their
preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered
here; no credentials are allowed (the API takes bearer tokens in a header,
and the console's cookie is for its own origin only).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

ALLOW_ORIGIN = b"access-control-allow-origin"
EXPOSE = b"access-control-expose-headers"
OWN = {ALLOW_ORIGIN, EXPOSE}
METHODS = b"GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
# What a page may read of an answer: the protocol's headers and the API's.
EXPOSED = (
    b"Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At,"
    b" Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Content-Type,"
    b" Location, stream-sse-data-encoding, Retry-After, X-Request-ID"
)
REQUESTED_HEADERS = re.compile(rb"[A-Za-z0-9\-, ]{0,1024}")
DEFAULT_HEADERS = b"authorization, content-type"


@dataclass(frozen=True)
class CorsPolicy:
    origins: frozenset[str] | None  # None: any origin

    @classmethod
    def parse(cls, text: str) -> CorsPolicy | None:
        """None for an unset setting (each surface's old behaviour)."""
        text = text.strip()
        if not text:
            return None
        if text == "*":
            return cls(None)
        if text.lower() == "none":
            return cls(frozenset())
        origins = frozenset(o.strip().rstrip("/") for o in text.split(",") if o.strip())
        bad = [o for o in origins if not re.fullmatch(r"https?://[A-Za-z0-9.\-\[\]:]+", o)]
        if bad:
            raise ValueError(f"cors_origins: {', '.join(sorted(bad))} is not an origin (scheme://host[:port])")
        return cls(origins)

    def allowed(self, origin: bytes | None) -> bytes | None:
        """The Access-Control-Allow-Origin value for a request from ``origin``."""
        if origin is None:
            return None
        if self.origins is None:
            return b"*"
        return origin if origin.decode("latin-1") in self.origins else None


class Cors:
    def __init__(self, app: ASGIApp, policy: CorsPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        allow = self.policy.allowed(headers.get(b"origin"))
        if scope["method"] == "OPTIONS" and b"access-control-request-method" in headers:
            await self._preflight(allow, headers.get(b"access-control-request-headers"), send)
            return

        async def send_with_policy(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", ()) if k not in OWN]
                if allow is not None:
                    kept += [(ALLOW_ORIGIN, allow), (EXPOSE, EXPOSED)]
                kept.append((b"vary", b"Origin"))
                message["headers"] = kept
            await send(message)

        await self.app(scope, receive, send_with_policy)

    async def _preflight(self, allow: bytes | None, requested: bytes | None, send: Any) -> None:
        headers = [(b"vary", b"Origin"), (b"content-length", b"0")]
        if allow is not None:
            asked = requested if requested and REQUESTED_HEADERS.fullmatch(requested) else DEFAULT_HEADERS
            headers += [
                (ALLOW_ORIGIN, allow), (b"access-control-allow-methods", METHODS),
                (b"access-control-allow-headers", asked), (b"access-control-max-age", b"86400"),
            ]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
