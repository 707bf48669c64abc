"""Which delivering process holds which subscription: a pure function of
the subscriptions and the live processes, so that every process, looking at
the same rows, comes to the same answer.

A process holds a subscription while it is alive (its heartbeat in
``delivery_owners``): leases are renewed once per process, not once per
subscription. Each subscription goes to one preferred process among the
live ones that can deliver it, by rendezvous hashing (the highest hash of
process and subscription): each process prefers about its share, and when
a process joins or leaves only the subscriptions it gains or held move. A
process takes the free subscriptions it is preferred for (free: no holder,
or a holder no longer alive) and gives up those it holds for which another
live process is preferred, which then takes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..store.subscriptions import DeliveryOwner, SubscriptionRow

Key = tuple[str, str]  # (source path, name) within a tenant


def can_deliver(row: SubscriptionRow, owner: DeliveryOwner) -> bool:
    """Whether ``owner`` delivers ``row`` now: copies and webhooks anywhere,
    calls and processors where the application registers the name; not a
    halted one, unless a delivery halted it under a deploy version that
    ``owner`` is not at and has not given up on (its runner then tries to
    resume it: a pause, an operator's halt or a halt without a version waits
    for the operator)."""
    halted = row.halted
    if halted is not None:
        version = owner.version
        if not version or version in row.gave_up or not halted.get("version") or halted.get("parked"):
            return False
    config = row.config
    return (
        config.get("kind") in ("copy", "webhook")
        or config.get("function") in owner.functions
        or config.get("processor") in owner.processors
    )


def _score(owner: str, row: SubscriptionRow) -> bytes:
    return hashlib.blake2b(f"{owner}\0{row.path}\0{row.name}".encode(), digest_size=8).digest()


def preferred(row: SubscriptionRow, owners: Iterable[DeliveryOwner]) -> str | None:
    """The live process ``row`` goes to (None: no live process can deliver it)."""
    able = [o.owner for o in owners if can_deliver(row, o)]
    return max(able, key=lambda owner: _score(owner, row), default=None)


@dataclass(frozen=True, slots=True)
class Plan:
    take: list[Key]  # free, and this process is preferred
    give: list[Key]  # held here, another live process is preferred
    keep: list[SubscriptionRow]  # held here and staying here


def plan(rows: Sequence[SubscriptionRow], owners: Sequence[DeliveryOwner], me: str) -> Plan:
    """What process ``me`` does with one tenant's subscriptions."""
    live = {o.owner for o in owners}
    take: list[Key] = []
    give: list[Key] = []
    keep: list[SubscriptionRow] = []
    for row in rows:
        goes_to = preferred(row, owners)
        holder = row.lease_owner if row.lease_owner in live else None
        if holder == me:
            if goes_to is None or goes_to == me:
                if goes_to == me:
                    keep.append(row)
            else:
                give.append((row.path, row.name))
        elif holder is None and goes_to == me:
            take.append((row.path, row.name))
    return Plan(take, give, keep)
