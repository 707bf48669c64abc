"""Subscriptions declared on the App, reconciled when the application starts.

Each declaration is configured through the source stream's control path
(``Subscriptions.declare``): created when missing, left alone when the row
stands as declared (no event), reconfigured when it changed. The decision
is taken under the source stream's row lock, so processes starting together
append exactly one configure event per change. Subscriptions this
application declared once (their configuration says ``declared_by``) and no
longer declares are reported, and removed only when asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import errors
from ..config import json_object_setting
from ..store import OpenStore
from .management import Subscriptions
from .receivers import Call, Processor, Webhook, resolve_secret

log = logging.getLogger("yoke.subscriptions")

# What reconciling did to one subscription.
CREATED, UNCHANGED, CHANGED = "created", "unchanged", "changed"
UNDECLARED, REMOVED = "undeclared", "removed"  # declared once, no longer


@dataclass(frozen=True)
class Reconciled:
    tenant: str
    path: str
    name: str
    outcome: str  # created, unchanged, changed, undeclared or removed
    offset: int | None = None  # the configure event that stands (None: removed)

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "path": self.path, "name": self.name, "outcome": self.outcome,
                "offset": self.offset}

    def __str__(self) -> str:
        where = self.path if self.tenant == "default" else f"{self.tenant}:{self.path}"
        return f"{self.outcome} {self.name} on {where}"


def webhook_secrets(text: str) -> dict[str, str]:
    """The ``webhook_secrets`` setting: a JSON object of name to secret; "" is none."""
    return json_object_setting(
        text, "webhook_secrets", str, 'an object of name to secret, e.g. {"billing": "whsec_..."}'
    )


async def reconcile(
    declared: Iterable[Any],
    subscriptions: Callable[[str, str], Subscriptions],
    store: OpenStore,
    *,
    declared_by: str,
    receivers: Mapping[str, Any],
    processors: Mapping[str, Any],
    environ: Mapping[str, str],
    secrets: Mapping[str, str],
    remove_undeclared: bool = False,
) -> list[Reconciled]:
    """Bring the database's subscriptions in line with ``declared``
    (``SubscriptionDef``s; ``subscriptions(path, tenant)`` operates a
    stream's). A declaration that cannot stand (a missing secret, a call or
    processor the application does not register, a refused filter) raises
    ``InvalidInput`` naming it; those before it are already reconciled."""
    if not isinstance(declared_by, str) or not 1 <= len(declared_by) <= 200:
        raise errors.InvalidInput("an App's name is 1-200 characters", field="name")
    report: list[Reconciled] = []
    keys = set()
    for d in declared:
        keys.add((d.tenant, d.source, d.name))
        receiver = d.receiver
        try:
            if isinstance(receiver, Call) and receiver.function not in receivers:
                raise errors.InvalidInput(f"the app registers no receiver {receiver.function!r}", field="receiver")
            if isinstance(receiver, Processor) and receiver.name not in processors:
                raise errors.InvalidInput(f"the app registers no processor {receiver.name!r}", field="receiver")
            if isinstance(receiver, Webhook) and receiver.secret_ref is not None:
                receiver = Webhook(receiver.url, resolve_secret(receiver.secret_ref, environ, secrets),
                                   secret_ref=receiver.secret_ref)
            done = await subscriptions(d.source, d.tenant).declare(
                d.name, receiver, declared_by=declared_by, filter=d.filter, transform=d.transform,
                start=d.start, on_failing_event=d.on_failing_event,
            )
        except errors.YokeError as exc:
            if exc.http_status >= 500:
                raise  # the database, not the declaration
            exc.message = f"declared subscription {d.name!r} of {d.source}: {exc.message}"
            exc.args = (exc.message,)
            raise
        outcome = UNCHANGED if not done.created else CHANGED if done.replaced else CREATED
        report.append(Reconciled(d.tenant, d.source, d.name, outcome, done.offset))
    opened = store()
    for tenant in await opened.subscriptions.tenants():
        for row in await opened.subscriptions.leases(tenant):
            if row.config.get("declared_by") != declared_by or (tenant, row.path, row.name) in keys:
                continue
            if remove_undeclared:
                try:
                    await subscriptions(row.path, tenant).unsubscribe(row.name)
                except errors.SubscriptionNotFound:
                    continue  # removed by another process starting too
                report.append(Reconciled(tenant, row.path, row.name, REMOVED))
            else:
                report.append(Reconciled(tenant, row.path, row.name, UNDECLARED, row.configured_at))
    for line in report:
        log.info("subscription %s", line)
    return report
