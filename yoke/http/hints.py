"""Which route a request that missed probably meant.

A stream's actions sit after a ``-`` segment (``/v1/streams/orders/-/events``),
and forgetting it gives a URL that still names a stream:
``POST /v1/streams/orders/events`` reaches the stream routes (``GET`` info,
``PUT`` create) and is a 405; ``GET /v1/streams/orders/events`` asks for the
info of a stream ``/orders/events``. ``probable_route`` looks for the route
the caller meant by putting the ``-`` segment back before each segment in
turn and asking the route table itself, so it knows every action there is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute, Match, Route

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
SEPARATOR = "-"


def allowed_methods(routes: Sequence[BaseRoute], path: str) -> list[str]:
    """The methods some route answers on ``path``."""
    return [m for m in METHODS if _route_for(routes, m, path) is not None]


def probable_route(routes: Sequence[BaseRoute], method: str, path: str) -> str | None:
    """``"METHOD /url"`` with the ``-`` segment put back where a route of
    the same method has it, or None. The matching route must have the
    separator in its own template (a catch-all ``{path:path}`` route does
    not count) and its parameters must not hold another one."""
    segments = path.split("/")
    if SEPARATOR in segments:
        return None  # it has its separator: another mistake
    for at in range(2, len(segments)):  # never before the first segment (/v1)
        if not segments[at]:
            continue
        candidate = "/".join([*segments[:at], SEPARATOR, *segments[at:]])
        found = _route_for(routes, method, candidate)
        if found is None:
            continue
        route, params = found
        if f"/{SEPARATOR}/" in route.path and not any(
            SEPARATOR in str(value).split("/") for value in params.values()
        ):
            return f"{method} {candidate}"
    return None


def _route_for(routes: Sequence[BaseRoute], method: str, path: str) -> tuple[Route, dict[str, Any]] | None:
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    for route in routes:
        if not isinstance(route, Route):
            continue
        match, child = route.matches(scope)
        if match is Match.FULL:
            return route, child.get("path_params", {})
    return None


def missing_separator(routes: Sequence[BaseRoute], method: str, path: str) -> dict[str, str]:
    """The details a 405 or a 404 adds when the probable route is known:
    ``{"hint": "POST /v1/streams/a/-/events"}``, or nothing."""
    hint = probable_route(routes, method, path)
    return {"hint": hint} if hint else {}


def hint_sentence(hint: str) -> str:
    return f"did you mean {hint}? (a segment '-' separates a stream's path from the action)"
