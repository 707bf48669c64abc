"""Subscriptions declared on the App (``app.subscription``), reconciled when
the application starts: created, unchanged (no event), changed (one event,
the cursor kept), undeclared (reported; removed when asked), secrets by
reference, and several processes starting at once."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors
from yoke.subscriptions.catalogue import reduce_log
from yoke.subscriptions.receivers import new_secret

from .common import FAST, control_events
from .webhook_server import WebhookReceiver, check_signed

SOURCE, TARGET = "/orders", "/orders-copy"


def copy_app(tenant: str, *, types: list[str] | None = None, name: str = "app") -> yoke.App:
    app = yoke.App(name=name)
    app.subscription(
        SOURCE, "mirror", yoke.copy_to_stream(TARGET), tenant=tenant,
        filter=None if types is None else {"types": types}, start="beginning",
    )
    return app


def outcomes(y: yoke.Runtime) -> dict[str, str]:
    return {r.name: r.outcome for r in y.subscriptions_reconciled}


async def test_created_then_unchanged_then_changed_going_on_from_its_cursor(fresh_url: str, tenant: str) -> None:
    async with yoke.open(fresh_url, app=copy_app(tenant), **FAST) as y:
        assert outcomes(y) == {"mirror": "created"}
        source = y.stream(SOURCE, tenant)
        first = await source.append_many([{"type": "order.placed", "payload": {"n": i}} for i in range(3)])
        await source.wait_until_processed("mirror", first[-1].offset)
    async with yoke.open(fresh_url, app=copy_app(tenant), **FAST) as y:
        source = y.stream(SOURCE, tenant)
        assert outcomes(y) == {"mirror": "unchanged"}
        controls = await control_events(source)
        assert [e.type for e in controls] == ["yoke.subscription.configured"]  # nothing appended
        paid = await source.append({"type": "order.paid", "payload": {"n": 3}})
        await source.wait_until_processed("mirror", paid.offset)
    # Changed while stopped: events appended meanwhile are delivered under the
    # new definition from where the cursor stood, none twice.
    async with yoke.open(fresh_url, executor=False) as y:
        source = y.stream(SOURCE, tenant)
        cursor = (await source.subscription("mirror")).processed_through_offset
        later = await source.append_many([
            {"type": "order.placed", "payload": {"n": 4}}, {"type": "order.paid", "payload": {"n": 5}},
        ])
    async with yoke.open(fresh_url, app=copy_app(tenant, types=["order.placed"]), **FAST) as y:
        source = y.stream(SOURCE, tenant)
        assert outcomes(y) == {"mirror": "changed"}
        controls = await control_events(source)
        assert len(controls) == 2 and controls[-1].payload["after_offset"] == cursor
        status = await source.subscription("mirror")
        assert status.config["filter"] == {"types": ["order.placed"]} and status.config["declared_by"] == "app"
        await source.wait_until_processed("mirror", status.head)
        target = await y.stream(TARGET, tenant).read(0, limit=100)
        payloads = [e.payload for e in target if not e.type.startswith("yoke.subscription.")]
        # 0-3 under the first definition (configure event aside), then only order.placed from the cursor on.
        assert [p.get("n") for p in payloads if "n" in p] == [0, 1, 2, 3, 4]
        assert later[-1].offset > cursor
        # The log alone gives the same cursor as the row (a catalogue rebuild).
        rebuilt = reduce_log(tenant, SOURCE, status.source_stream_id, controls)
        assert rebuilt["mirror"].cursor == cursor


async def test_processes_starting_together_append_one_event_per_change(fresh_url: str, tenant: str) -> None:
    async def start_all(app: yoke.App, n: int) -> list[dict[str, str]]:
        async with contextlib_group(n, fresh_url, app) as runtimes:
            return [outcomes(y) for y in runtimes]

    first = await start_all(copy_app(tenant), 4)
    assert sorted(o["mirror"] for o in first) == ["created", "unchanged", "unchanged", "unchanged"]
    second = await start_all(copy_app(tenant, types=["order.paid"]), 4)
    assert sorted(o["mirror"] for o in second) == ["changed", "unchanged", "unchanged", "unchanged"]
    async with yoke.open(fresh_url, executor=False) as y:
        assert len(await control_events(y.stream(SOURCE, tenant))) == 2


class contextlib_group:  # noqa: N801 - used as a context manager
    """``n`` runtimes on one database opened concurrently (as processes start)."""

    def __init__(self, n: int, url: str, app: yoke.App) -> None:
        self.managers = [yoke.open(url, app=app, **FAST) for _ in range(n)]

    async def __aenter__(self) -> list[yoke.Runtime]:
        return list(await asyncio.gather(*(m.__aenter__() for m in self.managers)))

    async def __aexit__(self, *exc: object) -> None:
        for m in self.managers:
            await m.__aexit__(None, None, None)


async def test_a_declared_webhook_signs_with_the_secret_its_reference_names(
    fresh_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from_env, from_setting = new_secret(), new_secret()
    monkeypatch.setenv("YOKE_TEST_HOOK_SECRET", from_env)
    async with WebhookReceiver() as hook:
        app = yoke.App()
        app.subscription("/invoices", "by-env", yoke.webhook(hook.url, secret=yoke.secret_from_env(
            "YOKE_TEST_HOOK_SECRET")), tenant=tenant)
        app.subscription("/invoices", "by-setting", yoke.webhook(hook.url, secret=yoke.secret_from_setting(
            "billing")), tenant=tenant)
        async with yoke.open(fresh_url, app=app, webhook_secrets=f'{{"billing": "{from_setting}"}}', **FAST) as y:
            assert outcomes(y) == {"by-env": "created", "by-setting": "created"}
            stream = y.stream("/invoices", tenant)
            sent = await stream.append({"type": "invoice.issued", "payload": {"amount": 12}})
            for name in ("by-env", "by-setting"):
                await stream.wait_until_processed(name, sent.offset)
            stream_id = (await stream.info()).stream_id
            by_name = {r.json["name"]: r for r in hook.requests}
            check_signed(by_name["by-env"], from_env, stream_id, "/invoices", "by-env")
            check_signed(by_name["by-setting"], from_setting, stream_id, "/invoices", "by-setting")
        # A rotated secret is a changed definition: one new configure event.
        monkeypatch.setenv("YOKE_TEST_HOOK_SECRET", new_secret())
        async with yoke.open(fresh_url, app=app, webhook_secrets=f'{{"billing": "{from_setting}"}}', **FAST) as y:
            assert outcomes(y) == {"by-env": "changed", "by-setting": "unchanged"}


async def test_a_declaration_that_cannot_stand_refuses_the_start(
    fresh_url: str, tenant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("YOKE_TEST_MISSING_SECRET", raising=False)
    missing = yoke.App()
    missing.subscription("/invoices", "hook", yoke.webhook(
        "http://127.0.0.1:9/hook", secret=yoke.secret_from_env("YOKE_TEST_MISSING_SECRET")), tenant=tenant)
    with pytest.raises(errors.InvalidInput, match="'hook' of /invoices.*YOKE_TEST_MISSING_SECRET is not set"):
        async with yoke.open(fresh_url, app=missing, **FAST):
            pass
    unregistered = yoke.App()
    unregistered.subscription("/invoices", "calls", yoke.call("bill"), tenant=tenant)
    with pytest.raises(errors.InvalidInput, match="registers no receiver 'bill'"):
        async with yoke.open(fresh_url, app=unregistered, **FAST):
            pass
    bad_filter = yoke.App()
    bad_filter.subscription("/invoices", "keyed", yoke.copy_to_stream("/b"), tenant=tenant,
                            filter={"key": "customer"})
    with pytest.raises(errors.InvalidFilter, match="'keyed' of /invoices"):
        async with yoke.open(fresh_url, app=bad_filter, **FAST):
            pass
    async with yoke.open(fresh_url, executor=False) as y:  # nothing was configured
        assert await y.stream("/invoices", tenant).subscriptions() == []


def test_secrets_are_never_written_in_a_declaration() -> None:
    app = yoke.App()
    for receiver in (yoke.webhook("https://example.com/h", secret=new_secret()), yoke.webhook("https://example.com/h")):
        with pytest.raises(errors.InvalidInput, match="a reference, never in code"):
            app.subscription("/invoices", "hook", receiver)
    app.subscription("/invoices", "hook", yoke.copy_to_stream("/b"))
    with pytest.raises(errors.InvalidInput, match="already declared"):
        app.subscription("/invoices", "hook", yoke.copy_to_stream("/c"))
    with pytest.raises(errors.InvalidInput, match="start"):
        app.subscription("/invoices", "other", yoke.copy_to_stream("/b"), start="yesterday")
    with pytest.raises(errors.InvalidPath):
        app.subscription("orders", "other", yoke.copy_to_stream("/b"))
    with pytest.raises(errors.InvalidInput, match="receiver"):
        app.subscription("/invoices", "other", "https://example.com/h")


async def test_a_reference_is_refused_by_subscribe(y: yoke.Runtime, tenant: str) -> None:
    hook = yoke.webhook("https://example.com/h", secret=yoke.secret_from_env("ANY"))
    with pytest.raises(errors.InvalidInput, match="declared on the App"):
        await y.stream("/invoices", tenant).subscribe("hook", hook)


async def test_no_longer_declared_is_reported_and_removed_only_when_asked(fresh_url: str, tenant: str) -> None:
    both = yoke.App()
    both.subscription(SOURCE, "kept", yoke.copy_to_stream("/a"), tenant=tenant)
    both.subscription(SOURCE, "dropped", yoke.copy_to_stream("/b"), tenant=tenant)
    other = yoke.App(name="other-service")
    other.subscription(SOURCE, "theirs", yoke.copy_to_stream("/c"), tenant=tenant)
    async with yoke.open(fresh_url, app=both, **FAST), yoke.open(fresh_url, app=other, **FAST):
        pass
    one = yoke.App()
    one.subscription(SOURCE, "kept", yoke.copy_to_stream("/a"), tenant=tenant)
    async with yoke.open(fresh_url, app=one, **FAST) as y:
        assert outcomes(y) == {"kept": "unchanged", "dropped": "undeclared"}  # another app's are not ours
        assert {s.name for s in await y.stream(SOURCE, tenant).subscriptions()} == {"kept", "dropped", "theirs"}
        assert "undeclared dropped on" in str(y.subscriptions_reconciled[-1])
    async with yoke.open(fresh_url, app=one, remove_undeclared_subscriptions=True, **FAST) as y:
        assert outcomes(y) == {"kept": "unchanged", "dropped": "removed"}
        assert {s.name for s in await y.stream(SOURCE, tenant).subscriptions()} == {"kept", "theirs"}


async def test_a_hand_made_subscription_becomes_the_apps_and_a_processor_refolds(
    fresh_url: str, tenant: str
) -> None:
    async with yoke.open(fresh_url, **FAST) as y:
        await y.stream(SOURCE, tenant).subscribe("mirror", yoke.copy_to_stream(TARGET), start="beginning")
    async with yoke.open(fresh_url, app=copy_app(tenant), **FAST) as y:
        assert outcomes(y) == {"mirror": "changed"}  # now marked as the app's
        assert (await y.stream(SOURCE, tenant).subscription("mirror")).config["declared_by"] == "app"

    def counting(where: dict[str, object] | None) -> yoke.App:
        app = yoke.App()

        @app.processor("count")
        class Count:
            version = "1"

            def initial_state(self) -> int:
                return 0

            def reduce(self, state: int, event: yoke.Event) -> int:
                return state + 1

        app.subscription(SOURCE, "count", yoke.processor("count"), tenant=tenant, start="beginning",
                         filter=where)
        return app

    async with yoke.open(fresh_url, app=counting(None), **FAST) as y:
        await y.stream(SOURCE, tenant).append({"type": "order.placed", "payload": {}})
    async with yoke.open(fresh_url, app=counting({"types": ["order.placed"]}), **FAST) as y:
        assert outcomes(y)["count"] == "changed"
        last = (await control_events(y.stream(SOURCE, tenant)))[-1]
        assert "after_offset" not in last.payload  # a fold under a new definition starts over
        assert (await y.stream(SOURCE, tenant).subscription("count")).processed_through_offset < last.offset
