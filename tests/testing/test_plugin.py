"""The pytest plugin as a user gets it: a project of its own, outside this
repository (no conftest), whose tests ask for ``yoke_env``, run by pytest in
the environment Yoke is installed in. The fixture can only come from the
``pytest11`` entry point. The same test file passes with explicit advances
and with ``--yoke-auto-advance``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP = '''
import datetime as dt
from yoke import App, Filter

app = App(name="nudges")

@app.actor("nudge", filter=Filter(types=["signed.up", "nudge.due"], key="payload.user"))
async def nudge(ctx, event):
    if event.type == "signed.up":
        await ctx.schedules.upsert("nudge", after_s=3 * 24 * 3600,
                                   event={"type": "nudge.due", "payload": {"user": ctx.instance.key}})
        await ctx.state.set({"nudged_at": None})
    else:
        await ctx.state.set({"nudged_at": ctx.now().isoformat()})
'''

TESTS = '''
import datetime as dt
import pytest

START = dt.datetime(2031, 5, 1, tzinfo=dt.timezone.utc)

@pytest.mark.yoke_app(app="nudges:app", start=START)
async def test_a_nudge_three_days_after_sign_up(yoke_env):
    await yoke_env.y.stream("/").append({"type": "signed.up", "payload": {"user": "ann"}})
    await yoke_env.advance(days=2)
    assert await yoke_env.state("nudge", "ann") == {"nudged_at": None}
    await yoke_env.advance(days=1)
    assert await yoke_env.state("nudge", "ann") == {"nudged_at": (START + dt.timedelta(days=3)).isoformat()}

@pytest.fixture
def yoke_app():
    from nudges import app
    return app

async def test_the_app_from_a_fixture_and_the_http_api(yoke_env):
    answer = await yoke_env.http.post("/v1/streams/signups/-/events", json={"type": "signed.up", "payload": {"user": "bob"}})
    assert answer.status_code in (200, 201), answer.text
    assert [e.type for e in await yoke_env.events("/signups")] == ["signed.up"]
'''


@pytest.mark.parametrize("mode", [[], ["--yoke-auto-advance"]], ids=["explicit", "auto-advance"])
def test_a_project_gets_the_yoke_env_fixture_from_the_installed_plugin(tmp_path: Path, mode: list[str]) -> None:
    (tmp_path / "nudges.py").write_text(textwrap.dedent(APP))
    (tmp_path / "test_nudges.py").write_text(textwrap.dedent(TESTS))
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *mode],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
