"""An actor's retries: the decorator's arguments win, then the deployment's
per-actor setting (``actor_retry``), then its settings for every actor, then
the defaults (5 attempts, 1 s doubling to 300 s)."""

from __future__ import annotations

import pytest

import yoke
from yoke import errors
from yoke.actors.app import per_actor_retry, with_retry_settings
from yoke.config import Settings


async def noop(ctx, event) -> None:  # noqa: ANN001
    return None


def app() -> yoke.App:
    a = yoke.App()
    a.actor("plain")(noop)
    a.actor("tuned", max_attempts=9)(noop)
    a.actor("quick", retry_base_s=0.5)(noop)
    return a


def retries(resolved: yoke.App, name: str) -> tuple:
    d = resolved.actors[name]
    return d.max_attempts, d.retry_base_s, d.retry_max_s


def test_the_defaults() -> None:
    assert retries(app(), "plain") == (5, 1.0, 300.0)
    assert retries(with_retry_settings(app(), {}, {}), "plain") == (5, 1.0, 300.0)


def test_decorator_over_per_actor_over_every_actor() -> None:
    every = {"max_attempts": 3, "retry_base_s": 0.01, "retry_max_s": 0.1}
    per_actor = {"tuned": {"max_attempts": 2, "retry_max_s": 7}, "plain": {"retry_base_s": 0.2}}
    resolved = with_retry_settings(app(), every, per_actor)
    assert retries(resolved, "plain") == (3, 0.2, 0.1)
    assert retries(resolved, "tuned") == (9, 0.01, 7.0)  # its decorator's max_attempts wins
    assert retries(resolved, "quick") == (3, 0.5, 0.1)
    assert retries(app(), "tuned") == (9, 1.0, 300.0)  # the app itself is left as it was


def test_zero_seconds_is_an_immediate_retry() -> None:
    assert retries(with_retry_settings(app(), {"retry_base_s": 0, "retry_max_s": 0}, {}), "plain") == (5, 0.0, 0.0)


def test_the_setting_parses_and_refuses_with_the_field_named() -> None:
    assert per_actor_retry("") == {} and per_actor_retry(' {"a": {"max_attempts": 2}} ') == {"a": {"max_attempts": 2}}
    for text in ("{", "[1]", '{"a": 3}'):
        with pytest.raises(errors.InvalidInput) as refused:
            per_actor_retry(text)
        assert refused.value.details["field"] == "actor_retry"
    for every, per_actor, field in [
        ({"max_attempts": 0}, {}, "max_attempts"),
        ({"retry_base_s": -1}, {}, "retry_base_s"),
        ({}, {"plain": {"retry_max_s": "soon"}}, "retry_max_s"),
        ({}, {"plain": {"timeout_s": 3}}, "timeout_s"),
        ({}, {"missing": {"max_attempts": 2}}, "actor_retry"),
    ]:
        with pytest.raises(errors.InvalidInput) as refused:
            with_retry_settings(app(), every, per_actor)
        assert refused.value.details["field"] == field
    with pytest.raises(errors.InvalidInput):
        yoke.App().actor("bad", max_attempts=0)


def test_settings_from_the_environment() -> None:
    settings = Settings.from_env({
        "YOKE_ACTOR_MAX_ATTEMPTS": "2", "YOKE_ACTOR_RETRY_BASE_S": "0.05", "YOKE_ACTOR_RETRY_MAX_S": "1",
        "YOKE_ACTOR_RETRY": '{"plain": {"max_attempts": 4}}',
    })
    assert (settings.actor_max_attempts, settings.actor_retry_base_s, settings.actor_retry_max_s) == (2, 0.05, 1.0)
    assert per_actor_retry(settings.actor_retry) == {"plain": {"max_attempts": 4}}
