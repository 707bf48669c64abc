"""The deploy check: is new code safe against the instances that exist?
(docs/advanced/forks.md#the-deploy-check)

For each actor of the candidate application (or the ones named), a sample
of its live instances (up to ``instances`` of each, drawn at random) is
forked under the candidate code and compared with the same history under
the current code (the live instances themselves, which it made, or
``current`` when given): every instance whose state, tables or effects
diverge is reported with the first input where its runs differ. Nothing
is kept and nothing live changes (forks.py).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import errors

if TYPE_CHECKING:
    from .app import App
    from .instances import Instances

LIST_PAGE = 1000
MAX_SAMPLE = 10_000  # instances of one actor one check forks


async def check_deploy(
    instances: Instances, candidate: App, *, current: App | None = None, actors: Sequence[str] | None = None,
    sample: int = 100, inputs: int = 1000, rng: random.Random | None = None,
) -> dict[str, Any]:
    """One tenant's check: ``{"tenant", "diverged", "checked", "actors":
    {name: {"instances", "checked", "diverged": [...], "errors": [...]}}}``."""
    if isinstance(sample, bool) or not isinstance(sample, int) or not 1 <= sample <= MAX_SAMPLE:
        raise errors.InvalidInput(f"instances must be 1-{MAX_SAMPLE}", field="instances")
    if isinstance(inputs, bool) or not isinstance(inputs, int) or not 1 <= inputs < 2**63:
        raise errors.InvalidInput("inputs must be a positive number", field="inputs")
    names = list(actors) if actors else sorted(candidate.actors)
    unknown = [n for n in names if n not in candidate.actors]
    if unknown:
        raise errors.InvalidInput(f"the candidate application has no actor {unknown[0]!r}", field="actor")
    rng = rng or random.Random()
    forks = instances.forks()
    report: dict[str, Any] = {"tenant": instances.tenant, "diverged": 0, "checked": 0, "actors": {}}
    for name in names:
        ids = await _instance_ids(instances, name)
        chosen = sorted(rng.sample(ids, min(sample, len(ids))))
        entry: dict[str, Any] = {"instances": len(ids), "checked": 0, "diverged": [], "errors": []}
        for instance_id in chosen:
            try:
                result = await forks.check(instance_id, candidate, current=current, inputs=inputs)
            except errors.YokeError as exc:
                entry["errors"].append({"instance_id": instance_id, "code": exc.code, "message": exc.message})
                continue
            entry["checked"] += 1
            if result["diverged"]:
                entry["diverged"].append(result)
        report["actors"][name] = entry
        report["checked"] += entry["checked"]
        report["diverged"] += len(entry["diverged"])
    return report


async def _instance_ids(instances: Instances, actor: str) -> list[str]:
    ids: list[str] = []
    after = None
    while True:
        page = await instances.list(actor, limit=LIST_PAGE, after=after)
        ids += [i.instance_id for i in page]
        if len(page) < LIST_PAGE:
            return ids
        after = page[-1].instance_id
