"""Determinism of forks, drawn by hypothesis: any sequence of inputs (state
updates, table writes, appends, schedules, children, messages, portal
calls, clock and random reads, failures) to an instance, then a fork under
the same code with no edits: no difference from the live instance, in the
default and the atomic mode. On SQLite (the replay does not depend on the
backend; tests/actors/test_forks.py runs both)."""

from __future__ import annotations

import asyncio
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yoke
from tests.actors.fork_app import app

T = "acme"

line = st.fixed_dictionaries(
    {"id": st.just("P"), "sku": st.sampled_from(["a", "b", "c"]), "qty": st.integers(1, 5)},
    optional={"remind": st.booleans(), "ship": st.booleans(), "poison": st.booleans()},
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line, min_size=1, max_size=8), atomic=st.booleans())
def test_a_fork_under_the_same_code_matches_the_live_instance(lines: list[dict], atomic: bool) -> None:
    async def check() -> None:
        folder = tempfile.mkdtemp(prefix="yoke-fork-")
        kind = "atomic.line" if atomic else "order.line"
        async with yoke.open(f"sqlite:///{folder}/yoke.db", app=app, data_dir=folder) as y:
            await y.stream("/orders", T).append_many([{"type": kind, "payload": p} for p in lines])
            await y.wait_idle(timeout_s=60)
            inst = await y.instances(T).find("order_atomic" if atomic else "order", "P")
            d = await (await y.instances(T).fork(inst.instance_id)).diff()
            assert d["changed"] is False, (lines, d)

    asyncio.run(check())
