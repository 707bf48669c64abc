"""A task cancelled in the middle of a store transaction (an actor's
timeout, a stopping runner or loop) ends that transaction before its
connection goes back to the pool: asyncpg never has to roll one back on
release (it warns "Resetting connection with an active transaction"), and
every pooled connection is idle outside a transaction afterwards.

PostgreSQL only: the cancellations land at spread moments of BEGIN, the
tenant setting, the statements and COMMIT of real store transactions.
"""

from __future__ import annotations

import asyncio
import random

import pytest

import yoke
from yoke.store.contract import Retention

CANCELS = 300


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_cancelled_transactions_leave_no_connection_in_a_transaction(db_url: str, tenant: str) -> None:
    loop = asyncio.get_running_loop()
    complaints: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: complaints.append(context["message"]))
    try:
        async with yoke.open(db_url) as y:
            store = y.store
            await y.stream("/cancelled", tenant).append({"type": "t"})

            async def transactions() -> None:
                days = 1
                while True:  # each a transaction: the stream row locked, read, updated
                    days += 1
                    await store.update_stream(tenant, "/cancelled", retention=Retention(max_age_s=86_400 * days))

            rng = random.Random(40)
            for _ in range(CANCELS):
                task = asyncio.create_task(transactions())
                await asyncio.sleep(rng.uniform(0, 0.008))
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            # Every pooled connection is back outside a transaction, and the store works on.
            pool = store.pool
            held = [await pool.acquire() for _ in range(pool.get_size())]
            try:
                assert not [c for c in held if c.is_in_transaction()]
            finally:
                for conn in held:
                    await pool.release(conn)
            assert (await y.stream("/cancelled", tenant).info()).retention.max_age_s > 86_400
        assert not [m for m in complaints if "active transaction" in m], complaints[:3]
    finally:
        loop.set_exception_handler(previous)
