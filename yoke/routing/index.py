"""The fan-out index: from an event to the routes it matches.

Routes are indexed by event type first (exact names, then each dotted
prefix of the type for ``prefix.*`` filters, then ``*``); stream globs and
JSONata run only on those candidates.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .filters import Filter, FilterError, key_of

log = logging.getLogger("yoke.routing")


@dataclass(frozen=True, slots=True)
class Route:
    """Where matching events go: one instance (``instance_id``), or the
    instance of ``actor`` named by the event's key (keyed and singleton
    actors; ``filter.key`` None means the singleton key)."""

    filter: Filter
    instance_id: str | None = None
    actor: str | None = None


SINGLETON_KEY = "singleton"


@dataclass(frozen=True, slots=True)
class Target:
    instance_id: str | None
    actor: str | None
    key: str | None


class RoutingIndex:
    def __init__(self, routes: Iterable[Route]) -> None:
        self._exact: dict[str, list[Route]] = defaultdict(list)
        self._prefix: dict[str, list[Route]] = defaultdict(list)
        self._all: list[Route] = []
        self.size = 0
        for route in routes:
            self.size += 1
            for t in set(route.filter.types):
                if t == "*":
                    self._all.append(route)
                elif t.endswith(".*"):
                    self._prefix[t[:-1]].append(route)  # keeps the dot: "order."
                else:
                    self._exact[t].append(route)

    def _candidates(self, event_type: str) -> list[Route]:
        found = list(self._exact.get(event_type, ()))
        if self._prefix:
            dot = event_type.find(".")
            while dot != -1:
                found.extend(self._prefix.get(event_type[: dot + 1], ()))
                dot = event_type.find(".", dot + 1)
        found.extend(self._all)
        return found

    def targets(self, document: Mapping[str, Any]) -> list[Target]:
        """Every target of the event, each once. A route whose expression
        fails on this event is skipped (and logged), never fatal."""
        out: list[Target] = []
        seen: set[Any] = set()
        for route in self._candidates(document["type"]):
            f = route.filter
            try:
                if f.streams is not None or f.where is not None:
                    if not f.matches(document):
                        continue
                if route.instance_id is not None:
                    target = Target(route.instance_id, None, None)
                else:
                    key = SINGLETON_KEY if f.key is None else key_of(f.key, document)
                    if key is None:
                        continue
                    target = Target(None, route.actor, key)
            except (FilterError, Exception) as exc:  # noqa: BLE001 - a bad expression skips the route
                log.warning("routing: filter of %s failed on %s: %s",
                            route.instance_id or route.actor, document.get("id"), exc)
                continue
            ident = target.instance_id or (target.actor, target.key)
            if ident not in seen:
                seen.add(ident)
                out.append(target)
        return out
