"""The application of bench/actors.py's isolation row (hosts import it by
name, so it lives in a module): one actor whose process() does nothing; the
runtime's ``isolation`` setting decides where it runs."""

from __future__ import annotations

from yoke import App

app = App()


@app.actor("bench", concurrency=1, max_attempts=5, timeout_s=30)
async def process(ctx, event) -> None:  # noqa: ANN001
    return None


@app.actor("busy", concurrency=1, max_attempts=1, timeout_s=60)
async def busy(ctx, event) -> None:  # noqa: ANN001
    """Spin on the CPU for payload.seconds without yielding (bench/isolation.py)."""
    import time

    end = time.monotonic() + event.payload["seconds"]
    while time.monotonic() < end:
        pass


@app.actor("probe", concurrency=1, max_attempts=5, timeout_s=30)
async def probe(ctx, event) -> None:  # noqa: ANN001
    return None
