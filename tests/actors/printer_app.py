"""Actors that print, in a Python host and in the Node host
(tests/actors/test_host_output.py)."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from yoke import App, Filter

app = App()
PRINTS = Filter(types=["print"], key="payload.order")


@app.actor("py", filter=PRINTS, isolation="process", max_attempts=1)
async def py(ctx, event):  # noqa: ANN001, ANN201
    print("charging", event.payload["order"], "for 4200 cents")
    print(f"attempt {ctx.attempt} on stderr", file=sys.stderr)
    logging.getLogger("shop").warning("a logged warning")
    await asyncio.to_thread(print, "printed by a worker thread")
    if event.payload.get("fail"):
        raise RuntimeError("card declined")


app.node_actor("js", Path(__file__).parent / "node" / "printer.mjs", filter=PRINTS, max_attempts=1)
