"""Data handling pins enforced on HTTP requests (seed 004, "Data handling").

A workflow stream definition may pin authorization, redaction, client
egress regions and content classes (``streams/pins.py``). The workflow
surface enforces them on every request (``guard``); the generic routes
(``/v1/streams/...``: events, tails, objects, subscriptions, settings)
would read and write the same stream around them, so they refuse a stream
that pins data handling (403 ``data_handling_pinned``). Workflow streams
live under ``/runs/``, so only those paths cost the generic routes a
lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from .. import errors
from ..runtime import Runtime
from ..streams.handle import Stream
from ..streams.pins import DataHandling, Redactor, check_not_forbidden
from . import session
from .auth import Principal, authorize, bearer_token

REGION_HEADER = "Client-Region"
WORKFLOW_PREFIX = "/runs/"


@dataclass(frozen=True)
class Guarded:
    stream: Stream
    pins: DataHandling | None
    principal: Principal

    @property
    def redactor(self) -> Redactor | None:
        return None if self.pins is None else self.pins.redactor(self.principal.scopes)

    def check_records(self, body: Any) -> None:
        """Each record's declared content class (``metadata.content_class``)."""
        for record in body if isinstance(body, list) else [body]:
            if not isinstance(record, dict):
                continue  # the append refuses it with its own error
            metadata = record.get("metadata")
            declared = metadata.get("content_class") if isinstance(metadata, dict) else None
            if self.pins is not None:
                self.pins.check_class(declared)
            else:
                check_not_forbidden(declared)


async def guard(request: Request, principal: Principal, stream: Stream, action: str | None) -> Guarded:
    """The stream's pins, after checking the request against them: the
    client region it declares (``Client-Region``) and, for ``read`` and
    ``append``, the token's scopes and id."""
    info = await stream.runtime.store.info(stream.tenant, stream.path)
    pins = None if info is None else DataHandling.from_stored(info.data_handling)
    if pins is not None:
        pins.check_egress(request.headers.get(REGION_HEADER))
        if action is not None:
            pins.check_access(action, principal.scopes, principal.token_id)
    return Guarded(stream, pins, principal)


async def pins_data_handling(runtime: Runtime, tenant: str, path: str) -> bool:
    """Whether the stream at ``path`` pins its data handling (only workflow streams can)."""
    if not path.startswith(WORKFLOW_PREFIX):
        return False
    info = await runtime.store.info(tenant, path)
    return info is not None and info.data_handling is not None


async def refuse_pinned(runtime: Runtime, tenant: str, path: str) -> None:
    """A generic route on a stream that pins data handling: 403."""
    if await pins_data_handling(runtime, tenant, path):
        raise errors.DataHandlingPinned(
            f"stream {path} pins its data handling: use /api/workflow-streams", path=path
        )


class PinnedPaths:
    """Which streams pin data handling, each looked up once: for listings
    that show events from many streams (failures, actor queues), which
    leave a pinned stream's events out."""

    def __init__(self, runtime: Runtime, tenant: str) -> None:
        self._runtime, self._tenant = runtime, tenant
        self._known: dict[str, bool] = {}

    async def pinned(self, path: str | None) -> bool:
        if path is None:
            return False
        if path not in self._known:
            self._known[path] = await pins_data_handling(self._runtime, self._tenant, path)
        return self._known[path]


async def generic_routes_guard(request: Request) -> None:
    """Router dependency of the generic stream routes (``refuse_pinned``).
    The route's own dependency checks the token's scope; this one only
    needs its tenant."""
    path = request.path_params.get("path") or ""
    if not path.startswith(WORKFLOW_PREFIX):
        return
    token = session.credentials(request.method, request.headers, bearer_token(request.headers.get("authorization")))
    principal = await authorize(request.app.state, token, request.query_params.get("tenant"), None)
    await refuse_pinned(request.app.state.runtime, principal.tenant, path)
