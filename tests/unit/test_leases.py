"""Which process holds which subscription (subscriptions/leases.py): a pure
function of the rows and the live processes."""

from __future__ import annotations

from collections import Counter

from yoke.store.subscriptions import DeliveryOwner, SubscriptionRow
from yoke.subscriptions.leases import plan, preferred


def row(i: int, owner: str | None = None, halted: dict | None = None, **config) -> SubscriptionRow:  # noqa: ANN003
    return SubscriptionRow(
        tenant="t", path=f"/s/{i}", name="n", config={"kind": "copy", **config}, configured_at=1,
        configured_id="e", configured_ms=0, generation=1, source_stream_id="s", cursor=0, lease_owner=owner,
        halted=halted,
    )


def test_each_process_is_preferred_for_about_its_share_and_joining_moves_only_its_share() -> None:
    rows = [row(i) for i in range(3000)]
    two = [DeliveryOwner("a"), DeliveryOwner("b")]
    before = {r.path: preferred(r, two) for r in rows}
    assert all(600 < n < 2400 for n in Counter(before.values()).values())  # 1,500 +- 27 at one sigma
    after = {r.path: preferred(r, [*two, DeliveryOwner("c")]) for r in rows}
    moved = [p for p in before if before[p] != after[p]]
    assert all(after[p] == "c" for p in moved) and 500 < len(moved) < 1500  # only to the newcomer: about a third


def test_a_process_takes_what_it_is_preferred_for_gives_up_the_rest_and_leaves_calls_to_those_that_can() -> None:
    owners = [DeliveryOwner("a"), DeliveryOwner("b", functions=("f",))]
    rows = [row(i, owner=("a" if i % 2 else "gone")) for i in range(100)] + [row(100, kind="call", function="f")]
    for me in ("a", "b"):
        decided = plan(rows, owners, me)
        mine = {r.path for r in rows if preferred(r, owners) == me}
        others = {r.path for r in rows if r.lease_owner in ("a", "b") and r.lease_owner != me}
        # What another live process holds waits for it to give it up.
        assert {p for p, _ in decided.take} | {r.path for r in decided.keep} == mine - others
        assert {p for p, _ in decided.give} == {r.path for r in rows if r.lease_owner == me and r.path not in mine}
    assert preferred(rows[-1], owners) == "b"  # only b registers the function
    halted = row(7, owner="a", halted={"reason": "operator", "version": ""})
    assert preferred(halted, owners) is None and plan([halted], owners, "a") == plan([], owners, "a")
