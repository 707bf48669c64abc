"""Who may read ``/metrics`` (``yoke serve``'s and ``yoke worker``'s).

Its series name tenants and actors, so it is open only where only this
machine can reach it:

- ``metrics_token`` set: a request must carry ``Authorization: Bearer <it>``;
- else open when the server listens on a loopback address and no proxy
  forwards to it (``proxy_headers`` off), or when ``metrics_public`` says so
  (a network policy guards it);
- else closed: every request is refused (401) with the way to open it, and
  the process says so when it starts.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from .. import errors
from ..config import Settings
from .addresses import is_loopback


@dataclass(frozen=True)
class MetricsAccess:
    token: str  # "" unless one is required
    closed_reason: str  # "" unless /metrics is refused to everyone

    @classmethod
    def of(cls, settings: Settings, host: str, *, behind_proxy: bool = False) -> MetricsAccess:
        if settings.metrics_token:
            return cls(settings.metrics_token, "")
        if settings.metrics_public or (is_loopback(host) and not behind_proxy):
            return cls("", "")
        where = f"listens on {host}" if not is_loopback(host) else "is behind a proxy (proxy_headers)"
        return cls("", f"/metrics is closed: this process {where} and YOKE_METRICS_TOKEN is not set; set it"
                       " (scrapers send Authorization: Bearer <it>), or YOKE_METRICS_PUBLIC=1 to leave it open")

    def check(self, authorization: str | None) -> None:
        """Raise ``Unauthorized`` unless a request with this header may read."""
        if self.closed_reason:
            raise errors.Unauthorized(self.closed_reason)
        if not self.token:
            return
        kind, _, given = (authorization or "").partition(" ")
        if kind.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            raise errors.Unauthorized("/metrics needs the metrics token (Authorization: Bearer <YOKE_METRICS_TOKEN>)")
