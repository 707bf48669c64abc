"""The example application (yoke/examples/orders.py) works end to end."""

from __future__ import annotations

import asyncio

import yoke
from yoke.examples import orders
from yoke import PortalRequest
from yoke.actors.portals import handle_request


async def test_an_order_is_placed_paid_and_shipped(fresh_url: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(orders, "SHIP_AFTER_S", 0.05)
    async with yoke.open(fresh_url, app=orders.app, data_dir=str(tmp_path), schedule_poll_s=0.02) as y:
        body = b'{"order_id": "A-1", "items": ["tea"], "total": 42}'
        for _ in range(2):  # a resubmitted order is placed once
            status, answer = await handle_request(
                y.actor_kernel, orders.app, "shop", PortalRequest("POST", "/orders", body=body), worker_id=y.worker_id
            )
            assert (status, answer) == (202, {"order_id": "A-1", "offset": 1})
        stream = y.stream("/orders/A-1")
        deadline = asyncio.get_running_loop().time() + 15
        while "order.shipped" not in [e.type for e in await stream.read(after=0)]:
            assert asyncio.get_running_loop().time() < deadline, "the order never shipped"
            await y.wait_idle(timeout_s=15)
        await y.wait_idle(timeout_s=15)
        assert [e.type for e in await stream.read(after=0)] == ["order.placed", "payment.captured", "order.shipped"]
        inst = await y.instances().find("order", "A-1")
        assert inst is not None
        assert (await y.instances().state(inst.instance_id))[0] == {"status": "shipped", "total": 42}
        messages = await y.store.actors.messages("default", "order-A-1", None, 10)
        assert [m.content for m in messages] == ["Order A-1 has shipped."]
        assert sorted(i.actor for i in await y.instances().list()) == ["order", "payments", "stats"]
