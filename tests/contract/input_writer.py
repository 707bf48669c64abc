"""A process that appends input records until it is killed (test_input_outbox).

    python -m tests.contract.input_writer URL TENANT DISPATCH_S

Prints "committed <offset>" after each append returns.
"""

from __future__ import annotations

import asyncio
import sys

import yoke


async def main(url: str, tenant: str, dispatch_s: float) -> None:
    async with yoke.open(url, input_dispatch_s=dispatch_s, prune_interval_s=3600) as y:
        stream = y.stream("/runs/crash/input", tenant)
        i = 0
        while True:
            [result] = await stream.append_input([{"type": "input", "payload": {"i": i}}], wake="/runs/crash")
            print("committed", result.offset, flush=True)
            i += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
