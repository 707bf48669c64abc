"""The order pipeline of yoke/examples/orders.py with its payments desk in TypeScript,
run by the Node host (yoke/hosts/node/README.md).

Everything else (the shop portal, the per-order actor, the statistics) is
orders.py's; ``payments`` is examples/node/payments.ts, compiled to
examples/node/dist/payments.js by ``make npm``. Run it with::

    make npm && .venv/bin/yoke serve --app examples.orders_node:app

then post an order as in orders.py; the payments instance's state is its
ledger and its SQLite database has a ``charges`` table.
"""

from __future__ import annotations

from pathlib import Path

from yoke import App, Filter

from yoke.examples import orders

SCRIPT = Path(__file__).parent / "node" / "dist" / "payments.js"

app = App(
    version="orders-node-1",
    actors={name: d for name, d in orders.app.actors.items() if name != "payments"},
    portals=orders.app.portals,
)
app.node_actor("payments", SCRIPT, filter=Filter(types=["payment.requested"], streams=["/payments"]), singleton=True)
