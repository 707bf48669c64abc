"""A real browser for tests of the pages Yoke serves (/docs, /redoc, the
console): Debian's ``chromium`` (``make test`` installs it) driven by
Playwright, which downloads no browser of its own here.

Fixtures:

- ``browser``: one headless Chromium per test module (Playwright's sync
  API keeps an asyncio loop running in the main thread while it is open:
  left open for the session, every later test's ``asyncio.run`` fails);
- ``page``: a fresh context (no cookies, no storage) and page per test in
  which **every request that does not go to 127.0.0.1 is blocked** and
  recorded; the test fails afterwards if there was any (a page that needs
  the network is a page that is blank offline). Uncaught script errors on
  the page fail the test too, and so does anything the page's
  Content-Security-Policy refused that the test did not expect
  (``offline.refusals_expected``);
- ``server``: a real ``yoke serve`` on SQLite for the module
  (``server.url``; its admin token is ``server.token``);
- ``console_server``: ``yoke serve --app tests.http.console_app:app`` per
  backend, SQLite and PostgreSQL (tests/http/conftest.py).

Without chromium (or Playwright) the tests are skipped with the reason;
``make test`` installs both, so there they always run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.http.conftest import Server, start_server, stop_server
from tests.http.conftest import console_server as http_console_server

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# Two shared cores: Swagger UI's 1.5 MB of script may take a while to render.
TIMEOUT_MS = 30_000
LOCAL_HOSTS = {"127.0.0.1"}
LOCAL_SCHEMES = {"data", "blob", "about"}


def chromium_path() -> str | None:
    return CHROMIUM if Path(CHROMIUM).exists() else shutil.which("chromium")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (`make test` installs it: apt-get install chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (`make test` installs the dev extra)")
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as playwright:
        # Playwright gives each launch a fresh temporary profile (user data dir).
        launched = playwright.chromium.launch(executable_path=executable, chromium_sandbox=False, args=LAUNCH_ARGS)
        try:
            yield launched
        finally:
            launched.close()


class Offline:
    """What a page tried to reach beyond 127.0.0.1, its script errors, and
    what its Content-Security-Policy refused (a test that expects a refusal
    names the URL in ``refusals_expected``)."""

    def __init__(self) -> None:
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.refused: list[str] = []
        self.refusals_expected: set[str] = set()
        # Every error the page logged; a test that sets ``strict`` fails on
        # any whose text contains none of ``errors_expected``.
        self.logged: list[str] = []
        self.strict = False
        self.errors_expected: set[str] = set()

    def console(self, message: Any) -> None:
        if message.type == "error" and "Content Security Policy" in message.text:
            self.refused.append(message.text)
        if message.type == "error":
            self.logged.append(message.text)

    def unexpected_logged(self) -> list[str]:
        if not self.strict:
            return []
        return [m for m in self.logged if not any(e in m for e in self.errors_expected)]

    def unexpected_refusals(self) -> list[str]:
        return [r for r in self.refused if not any(url in r for url in self.refusals_expected)]

    def route(self, route: Any) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in LOCAL_SCHEMES or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("blockedbyclient")


@pytest.fixture
def offline() -> Offline:
    return Offline()


@pytest.fixture
def page(browser: Any, offline: Offline) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(TIMEOUT_MS)
    context.route("**/*", offline.route)
    opened = context.new_page()
    opened.on("pageerror", lambda error: offline.errors.append(str(error)))
    opened.on("console", offline.console)
    try:
        yield opened
    finally:
        context.close()
    assert not offline.blocked, f"the page needed the network: {offline.blocked}"
    assert not offline.errors, f"script errors on the page: {offline.errors}"
    assert not offline.unexpected_refusals(), f"refused by the page's policy: {offline.unexpected_refusals()}"
    assert not offline.unexpected_logged(), f"errors in the browser console: {offline.unexpected_logged()}"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("browser")
    srv = start_server(f"sqlite:///{base}/yoke.db", base / ".yoke")
    try:
        yield srv
    finally:
        stop_server(srv)


console_server = http_console_server
