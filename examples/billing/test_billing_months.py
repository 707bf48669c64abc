"""The billing example over months of virtual time (``yoke.testing``, the
``yoke_env`` fixture): the monthly schedule itself closes each period, on
the 1st at 00:00 UTC, and the invoices arrive signed at a webhook receiver;
an accounting system that is down halts the hook after its whole retry
ladder. Seconds of real time.

Run: ``.venv/bin/python -m pytest examples/billing`` from the repository root.
"""

from __future__ import annotations

import base64
import datetime as dt
import secrets
from collections.abc import AsyncIterator

import pytest
from standardwebhooks.webhooks import Webhook

from examples.billing.app import PLANS, UNIT_PRICE_CENTS, make_app
from yoke import App
from yoke.testing import Environment, WebhookReceiver

START = dt.datetime(2030, 1, 15, 10, 0, tzinfo=dt.UTC)
SECRET = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()

pytestmark = pytest.mark.yoke_app(start=START)


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver() as hook:
        yield hook


@pytest.fixture
def yoke_app(receiver: WebhookReceiver, monkeypatch: pytest.MonkeyPatch) -> App:
    monkeypatch.setenv("BILLING_WEBHOOK_SECRET", SECRET)  # read when the service starts
    return make_app(receiver.url)


def ms(moment: dt.datetime) -> int:
    return int(moment.timestamp() * 1000)


async def post(env: Environment, key: str, **body: object) -> None:
    answer = await env.http.post("/v1/portals/billing", json=body, headers={"idempotency-key": key})
    assert answer.status_code == 202, answer.text


def invoices(receiver: WebhookReceiver) -> list[dict]:
    """The invoices posted, each checked against its signature. Signed at
    the virtual time (``webhook-timestamp``): ``Webhook.verify`` would hold
    it against the machine's clock, so the signature is computed with
    ``sign`` at the posted time and compared."""
    found = []
    for p in receiver.posts:
        at = dt.datetime.fromtimestamp(int(p.headers["webhook-timestamp"]), dt.UTC)
        expected = Webhook(SECRET).sign(p.headers["webhook-id"], at, p.body.decode())
        assert expected in p.headers["webhook-signature"].split(" ")
        found.append(p.json()["event"]["payload"])
    return found


async def test_each_month_closes_on_the_first_and_its_invoice_arrives_signed(
    yoke_env: Environment, receiver: WebhookReceiver
) -> None:
    await post(yoke_env, "e1", customer="c1", type="plan.started", plan="pro")
    await post(yoke_env, "e2", customer="c1", type="usage.recorded", units=3)
    await yoke_env.advance(days=16, hours=13, minutes=59)  # January 31st, 23:59
    assert receiver.posts == []

    await yoke_env.advance(minutes=1)  # February 1st, 00:00: the period closes
    [january] = invoices(receiver)
    assert january["total_cents"] == PLANS["pro"] + 3 * UNIT_PRICE_CENTS
    assert january["period_end"] == ms(dt.datetime(2030, 2, 1, tzinfo=dt.UTC))
    # Posted (and signed) at that virtual moment, on the first try.
    assert receiver.posts[0].headers["webhook-timestamp"] == str(ms(dt.datetime(2030, 2, 1, tzinfo=dt.UTC)) // 1000)

    await post(yoke_env, "e3", customer="c1", type="usage.recorded", units=4)
    await yoke_env.advance(days=28)  # to March 1st, 00:00
    _, february = invoices(receiver)
    assert february["total_cents"] == PLANS["pro"] + 4 * UNIT_PRICE_CENTS
    assert (february["period_start"], february["period_end"]) == (
        ms(dt.datetime(2030, 2, 1, tzinfo=dt.UTC)), ms(dt.datetime(2030, 3, 1, tzinfo=dt.UTC))
    )
    rows = await yoke_env.query("customer", "c1", "SELECT number, total_cents FROM invoices ORDER BY number")
    assert [r["total_cents"] for r in rows] == [january["total_cents"], february["total_cents"]]


async def test_an_accounting_system_that_stays_down_halts_the_hook_after_its_ladder(
    yoke_env: Environment, receiver: WebhookReceiver
) -> None:
    receiver.fail_all(503)
    await post(yoke_env, "e1", customer="c2", type="plan.started", plan="team")
    async with yoke_env.auto_advance():
        [failure] = await yoke_env.until(lambda: yoke_env.y.failures().list(kind="halted"))
    # The first of February closed the period; the ladder took hours from there.
    assert failure.subscription == "billing-hook" and failure.attempt_count == 15
    assert len(receiver.posts) == 15 and yoke_env.now() > dt.datetime(2030, 2, 1, tzinfo=dt.UTC)

    receiver.succeed()  # back up: a replay delivers the invoice once
    await yoke_env.y.failures().replay(failure.id, wait=True, timeout_s=10)
    [*_, delivered] = invoices(receiver)
    assert delivered["total_cents"] == PLANS["team"]
