"""The application the failures tests serve (``yoke serve --app
tests.failures.app:app``): a poisoned event (``payload.poison``) fails it
everywhere.

- ``orders`` (actor, ``order`` events of ``/s``: not the copies a test
  makes of them; 2 attempts, fast retries) raises on
  poison, else adds ``payload.n`` to its state's ``seen`` list;
- ``answers`` (actor, ``answer`` events of workflow streams ``/runs/*/answer``,
  one attempt) raises on poison;
- ``rec`` (call receiver) raises on poison, else writes one JSON line per
  event (``{"offset", "payload", "replay_of"}``) to the file named by
  ``$FAILURES_RECEIVED`` when it is set.
"""

from __future__ import annotations

import os

import orjson

from yoke import App, Filter

app = App()

POISON_COPY = 'payload.poison ? "not an object" : {"payload": payload}'  # a copy transform that fails on poison


def poisoned(payload: object) -> bool:
    return isinstance(payload, dict) and bool(payload.get("poison"))


@app.actor(
    "orders", filter=Filter(types=["order"], streams=["/s"]), max_attempts=2, retry_base_s=0.01, retry_max_s=0.02
)
async def orders(ctx, event):
    if poisoned(event.payload):
        raise ValueError(f"poisoned order {event.payload.get('n')}")
    await ctx.state.update(lambda s: {"seen": [*s.get("seen", []), event.payload.get("n")]})


@app.actor("answers", filter=Filter(types=["answer"], streams=["/runs/*/answer"]), max_attempts=1)
async def answers(ctx, event):
    if poisoned(event.payload):
        raise ValueError(f"poisoned answer for {event.payload.get('user')}")  # quotes the event


@app.receiver("rec")
async def rec(batch: dict) -> None:
    for e in batch["events"]:
        if poisoned(e["payload"]):
            raise RuntimeError(f"poisoned event at {e['offset']}")
    received = os.environ.get("FAILURES_RECEIVED")
    if received:
        with open(received, "ab") as f:
            for e in batch["events"]:
                replay_of = (e["source"] or {}).get("replay_of")
                line = {"offset": e["offset"], "payload": e["payload"], "replay_of": replay_of}
                f.write(orjson.dumps(line) + b"\n")
