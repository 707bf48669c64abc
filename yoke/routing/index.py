"""The fan-out index: from an event to the routes it matches.

Routes are indexed by event type first (exact names, then each dotted
prefix of the type for ``prefix.*`` filters, then ``*``). Within a type,
routes whose ``where`` is an equality on a path (``payload.k = 5``, alone or
``and``-ed with more) are indexed by that literal, so an event is checked
only against the routes its value selects: thousands of instance filters
cost one dictionary lookup, not thousands of JSONata runs. Stream globs and
the remaining JSONata run only on those candidates.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..lifecycle import is_lifecycle
from .evaluation import Evaluations, Failed
from .filters import UNDECIDED, UNKNOWN, Filter, equality_of, literal_key, lookup, path_matches, plain_key

log = logging.getLogger("yoke.routing")

SINGLETON_KEY = "singleton"
MAX_KEY_CHARS = 500  # as for instance keys given to create()


@dataclass(frozen=True, slots=True)
class Route:
    """Where matching events go: one instance (``instance_id``), or the
    instance of ``actor`` named by the event's key (keyed and singleton
    actors; ``filter.key`` None means the singleton key)."""

    filter: Filter
    instance_id: str | None = None
    actor: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    instance_id: str | None
    actor: str | None
    key: str | None


@dataclass
class _Bucket:
    """The routes of one type key."""

    plain: list[Route] = field(default_factory=list)
    # path -> literal key -> routes whose where starts with path = literal
    by_value: dict[tuple[str, ...], dict[tuple[str, Any], list[Route]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )

    def add(self, route: Route) -> None:
        equality = None if route.filter.where is None else equality_of(route.filter.where)
        if equality is None:
            self.plain.append(route)
        else:
            self.by_value[equality.path][equality.key].append(route)

    def candidates(self, document: Mapping[str, Any], out: list[tuple[Route, bool]]) -> None:
        """Append (route, where_known_true) pairs."""
        out.extend((r, False) for r in self.plain)
        for path, by_key in self.by_value.items():
            value = lookup(document, path)
            if value is UNKNOWN:  # only JSONata can decide
                out.extend((r, False) for routes in by_key.values() for r in routes)
                continue
            key = literal_key(value)
            for r in by_key.get(key, ()) if key is not None else ():
                out.append((r, equality_of(r.filter.where).exact))  # type: ignore[union-attr, arg-type]


class RoutingIndex:
    def __init__(self, routes: Iterable[Route]) -> None:
        self._exact: dict[str, _Bucket] = defaultdict(_Bucket)
        self._prefix: dict[str, _Bucket] = defaultdict(_Bucket)
        self._all = _Bucket()
        self.size = 0
        for route in routes:
            self.size += 1
            for t in set(route.filter.types):
                if t == "*":
                    self._all.add(route)
                elif t.endswith(".*"):
                    self._prefix[t[:-1]].add(route)  # keeps the dot: "order."
                else:
                    self._exact[t].add(route)

    def _candidates(self, document: Mapping[str, Any]) -> list[tuple[Route, bool]]:
        event_type = document["type"]
        found: list[tuple[Route, bool]] = []
        bucket = self._exact.get(event_type)
        if bucket is not None:
            bucket.candidates(document, found)
        if self._prefix:
            dot = event_type.find(".")
            while dot != -1:
                bucket = self._prefix.get(event_type[: dot + 1])
                if bucket is not None:
                    bucket.candidates(document, found)
                dot = event_type.find(".", dot + 1)
        if not is_lifecycle(event_type):  # named, never matched by '*' (lifecycle.py)
            self._all.candidates(document, found)
        return found

    async def targets(
        self, tenant: str, documents: Sequence[Mapping[str, Any]], evaluations: Evaluations
    ) -> list[list[Target]]:
        """Every target of each event, each once. A route whose expression
        fails on an event is skipped for it (and logged), never fatal. The
        expressions run once per expression for all the events together
        (``evaluations``: on the event loop when light, in its processes
        when expensive)."""
        # The candidates that pass their stream globs, per event, and the
        # where expressions they still need.
        plans: list[list[Route]] = []
        wheres: dict[str, list[int]] = {}
        for i, document in enumerate(documents):
            plan = []
            for route, known in self._candidates(document):
                f = route.filter
                if f.streams is not None and not path_matches(f.streams, document["path"]):
                    continue
                plan.append(route)
                if f.where is not None and not known:
                    _ask(wheres, f.where, i)
            plans.append(plan)
        verdicts = await _answers(tenant, documents, wheres, "where", evaluations)
        # Those that pass, and the keys that only JSONata can find.
        keys: dict[str, list[int]] = {}
        for i, plan in enumerate(plans):
            passing = []
            for route in plan:
                f = route.filter
                verdict = verdicts[f.where].get(i, True) if f.where in verdicts else True
                if type(verdict) is Failed:
                    _skip(route, documents[i], "filter", verdict.message)
                elif verdict:
                    passing.append(route)
                    if route.instance_id is None and f.key is not None and plain_key(f.key, documents[i]) is UNDECIDED:
                        _ask(keys, f.key, i)
            plans[i] = passing
        found = await _answers(tenant, documents, keys, "key", evaluations)
        out = []
        for i, plan in enumerate(plans):
            document = documents[i]
            targets: list[Target] = []
            seen: set[Any] = set()
            for route in plan:
                f = route.filter
                if route.instance_id is not None:
                    target = Target(route.instance_id, None, None)
                else:
                    key = SINGLETON_KEY if f.key is None else plain_key(f.key, document)
                    if key is UNDECIDED:
                        key = found[f.key][i]
                    if type(key) is Failed:
                        _skip(route, document, "key", key.message)
                        continue
                    if key is None:
                        continue
                    if len(key) > MAX_KEY_CHARS or "\x00" in key:
                        log.warning("routing: event %s has an unusable key for %s (over %s"
                                    " characters or NUL); not routed", document.get("id"),
                                    route.actor, MAX_KEY_CHARS)
                        continue
                    target = Target(None, route.actor, key)
                ident = target.instance_id or (target.actor, target.key)
                if ident not in seen:
                    seen.add(ident)
                    targets.append(target)
            out.append(targets)
        return out


def _ask(asked: dict[str, list[int]], expression: str, i: int) -> None:
    indexes = asked.setdefault(expression, [])
    if not indexes or indexes[-1] != i:  # events in order: a repeat is the last one
        indexes.append(i)


async def _answers(
    tenant: str, documents: Sequence[Mapping[str, Any]], asked: dict[str, list[int]], what: str,
    evaluations: Evaluations,
) -> dict[str, dict[int, Any]]:
    """Each expression's outcome (or ``Failed``) on the events that need it, by event index."""
    out = {}
    for expression, indexes in asked.items():
        answers = await evaluations.run(tenant, expression, what, [documents[i] for i in indexes])
        out[expression] = dict(zip(indexes, answers))
    return out


def _skip(route: Route, document: Mapping[str, Any], what: str, message: str) -> None:
    log.warning("routing: %s of %s failed on %s: %s", what, route.instance_id or route.actor,
                document.get("id"), message)
