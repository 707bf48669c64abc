"""The application of bench/soak.py: ``yoke serve --app soak_app:app``
imports it by name (bench/ on PYTHONPATH), so it lives in a module.

One keyed actor, ``soak``: every ``soak.work`` event of ``/soak-main``
(not its copies in ``/soak-copy``) carries a key ``k``
and that key's sequence number ``s`` (1, 2, ... as the soak's feeder
appended them, one after another). Each instance (one per key) keeps in
``ctx.state`` how many distinct events it saw (``count``), the highest
``s`` (``last``), redeliveries of an ``s`` already counted (``dups``:
allowed, delivery is at least once) and jumps past ``last + 1``
(``jumps``: an event missing or out of order). The update is idempotent
by ``s``, so a retried run does not count its event twice. With
``concurrency=1`` one key's events run one at a time in queue order, so
the soak expects ``jumps == 0`` and ``count == last ==`` what it appended.
"""

from __future__ import annotations

from typing import Any

from yoke import App, Filter

app = App()


def step(s: int) -> Any:
    def apply(state: dict[str, Any]) -> dict[str, Any]:
        state = dict(state)
        last = state.get("last", 0)
        if s <= last:
            state["dups"] = state.get("dups", 0) + 1
            return state
        if s != last + 1:
            state["jumps"] = state.get("jumps", 0) + 1
        state["count"] = state.get("count", 0) + 1
        state["last"] = s
        return state

    return apply


@app.actor("soak", filter=Filter(types=["soak.work"], streams=["/soak-main"], key="payload.k"), concurrency=1, max_attempts=10,
           timeout_s=30)
async def process(ctx, event) -> None:  # noqa: ANN001
    await ctx.state.update(step(int(event.payload["s"])))
