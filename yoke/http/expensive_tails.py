"""Tails whose ``where=`` is expensive (routing/cost.py): how many one token,
and one tenant, may hold open in this server process.

Their expressions run in the evaluator processes, tenants taking turns
(routing/pool.py), so they cannot hold the event loop; the limit keeps one
token from queueing more evaluations than it can use, and answers the rest
at once, before the tail starts: 429 ``too_many_expensive_tails`` with
Retry-After. A tail's place is free again when its response ends, however
it ends.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from .. import errors
from ..config import Settings
from ..routing.cost import expensive
from ..routing.filters import Filter
from .auth import Principal

RETRY_AFTER_S = 2


class ExpensiveTails:
    def __init__(self) -> None:
        self.by_token: Counter[tuple[str, str]] = Counter()
        self.by_tenant: Counter[str] = Counter()

    def claim(
        self, principal: Principal, event_filter: Filter | None, settings: Settings
    ) -> Callable[[], None] | None:
        """A place for a tail with ``event_filter`` (None when its filter is
        not expensive), as a function that frees it; ``TooManyExpensiveTails``
        when there is none."""
        if event_filter is None or event_filter.where is None or not expensive(event_filter.where):
            return None
        token, tenant = (principal.tenant, principal.token_id), principal.tenant
        for held, limit, per in ((self.by_token[token], settings.expensive_tails_per_token, "token"),
                                 (self.by_tenant[tenant], settings.expensive_tails_per_tenant, "tenant")):
            if held >= limit:
                raise errors.TooManyExpensiveTails(
                    f"this {per} has {held} tails with an expensive where= open, as many as it may"
                    " (regexes, function definitions, ... see docs/reference/http.md#expensive-filters)",
                    per=per, limit=limit, retry_after=RETRY_AFTER_S,
                )
        self.by_token[token] += 1
        self.by_tenant[tenant] += 1
        freed = False

        def free() -> None:
            nonlocal freed
            if not freed:
                freed = True
                _decrement(self.by_token, token)
                _decrement(self.by_tenant, tenant)

        return free


def _decrement(counter: Counter, key: object) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
