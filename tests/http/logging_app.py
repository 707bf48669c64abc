"""The application tests/http/test_logging.py serves: a portal that logs a
line while it handles its request (so the line must carry the request id)."""

from __future__ import annotations

import logging

from yoke import App

app = App()
log = logging.getLogger("tests.logging_app")


@app.portal("say")
async def say(ctx, request):
    log.warning("portal heard %s", request.json())
    return 200, {"ok": True}
