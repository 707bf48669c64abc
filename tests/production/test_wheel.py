"""The wheel stands alone (README, "Install from a wheel"): `python -m build`
makes an sdist and, from it, a wheel; the wheel goes into a fresh virtual
environment outside the repository, and there `yoke --version`, `yoke demo`
and `yoke serve --app` with a small application of the user's own answer,
on SQLite and on PostgreSQL. Nothing of this checkout is on the path: the
console's files, the Node host, the migrations come from the wheel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.http.conftest import free_port, own_database
from tests.production.building import building_the_checkout

ROOT = Path(__file__).resolve().parents[2]
APP = '''
import yoke

app = yoke.App()


@app.actor("wheel_counter", filter={"types": ["wheel.tick"]}, singleton=True)
async def counter(ctx, event):
    await ctx.state.update(lambda s: {"ticks": (s or {}).get("ticks", 0) + 1})
'''


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The bin/ of a fresh environment holding the wheel built from this checkout."""
    base = tmp_path_factory.mktemp("wheel")
    with building_the_checkout():
        subprocess.run([sys.executable, "-m", "build", "--outdir", str(base / "dist"), str(ROOT)], check=True,
                       capture_output=True, timeout=600)
    assert sorted(p.suffix for p in (base / "dist").iterdir()) == [".gz", ".whl"]  # the sdist and the wheel
    (wheel,) = (base / "dist").glob("*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(base / "env")], check=True, timeout=120)
    subprocess.run([str(base / "env" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-c", str(ROOT / "constraints.txt"), str(wheel)], check=True, capture_output=True, timeout=600)
    yield base / "env" / "bin"


def outside(tmp_path: Path) -> dict[str, str]:
    """An environment without this checkout: no PYTHONPATH, no virtual
    environment of the checkout's, no YOKE_* settings."""
    kept = {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PATH") and not k.startswith("YOKE_")}
    return kept | {"HOME": str(tmp_path), "PATH": "/usr/local/bin:/usr/bin:/bin"}


def test_version_and_demo_run_from_the_wheel(installed: Path, tmp_path: Path) -> None:
    env = outside(tmp_path)
    version = subprocess.run([str(installed / "yoke"), "--version"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, check=True, timeout=60).stdout
    assert version.startswith("yoke 0.")
    where = subprocess.run([str(installed / "python"), "-c", "import yoke; print(yoke.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    assert str(installed.parent) in where and str(ROOT) not in where
    # The example order pipeline ships with it.
    example = subprocess.run([str(installed / "python"), "-c", "from yoke.examples.orders import app; print(sorted(app.actors))"],
                             cwd=tmp_path, env=env, capture_output=True, text=True, check=True, timeout=60).stdout
    assert "order" in example
    demo = subprocess.run([str(installed / "yoke"), "demo", "--json"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, check=True, timeout=120).stdout
    assert '"order.placed"' in demo and (tmp_path / ".yoke" / "yoke.db").exists()


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of the test's own (a new server's first start, as a user's)."""
    with own_database(request.param, tmp_path, "yoke_wheel") as url:
        yield url


def test_serve_runs_an_application_from_the_wheel(installed: Path, tmp_path: Path, database: str) -> None:
    db_url = database
    (tmp_path / "shop.py").write_text(APP)
    port = free_port()
    env = outside(tmp_path) | {"YOKE_DATABASE_URL": db_url, "YOKE_PORT": str(port), "YOKE_DATA_DIR": str(tmp_path / "data")}
    log = open(tmp_path / "serve.log", "w")
    server = subprocess.Popen([str(installed / "yoke"), "serve", "--app", "shop:app"], cwd=tmp_path, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        assert httpx.get(url + "/healthz").status_code == 200
        token = (tmp_path / "data" / f"token-{port}").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
            assert http.post(f"/v1/streams/wheel-{uuid.uuid4().hex[:8]}/-/events",
                             json={"type": "wheel.tick"}).status_code == 201
            deadline = time.monotonic() + 30
            while True:  # the actor ran, from the wheel's runtime
                listed = http.get("/v1/instances", params={"actor": "wheel_counter"}).json()["instances"]
                if listed:
                    shown = http.get(f"/v1/instances/{listed[0]['instance_id']}").json()
                    if (shown["state"]["value"] or {}).get("ticks") == 1:
                        break
                assert time.monotonic() < deadline, listed
                time.sleep(0.1)
            assert http.get("/ui/").status_code == 200  # the console's files are in the wheel
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
