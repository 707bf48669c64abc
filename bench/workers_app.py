"""The application of bench/actors.py --workers: ``yoke worker`` processes
import it by name, so it lives in a module. The keyed actor of the other
scenarios (``key="payload.k"``) with a process() that does nothing; its
concurrency comes from BENCH_ACTOR_CONCURRENCY (default 4), which the
benchmark sets for the workers it starts."""

from __future__ import annotations

import os

from yoke import App, Filter

CONCURRENCY = int(os.environ.get("BENCH_ACTOR_CONCURRENCY", "4"))

app = App()


@app.actor("bench", filter=Filter(types=["bench.work"], key="payload.k"), concurrency=CONCURRENCY,
           max_attempts=5, timeout_s=30)
async def process(ctx, event) -> None:  # noqa: ANN001
    return None
