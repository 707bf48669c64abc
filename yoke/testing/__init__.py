"""Testing Yoke applications: the real engine on a temporary database, with
a clock the test moves (docs/basics/testing.md).

    async with yoke.testing.env(app=app) as env:
        await env.y.stream("/orders").append({"type": "order.placed", ...})
        await env.advance(days=7)
        assert await env.state("order", "o-1") == {...}

A pytest plugin (``yoke.testing.plugin``, registered when Yoke is
installed) gives the same as the ``yoke_env`` fixture.
"""

from .environment import Environment, env, scratch_database
from .receiver import Post, WebhookReceiver

__all__ = ["Environment", "Post", "WebhookReceiver", "env", "scratch_database"]
