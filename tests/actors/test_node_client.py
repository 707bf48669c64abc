"""The Node package's client and test kit, as a TypeScript team uses them:
the TypeScript example's own tests (examples/node/shop.test.mjs, node:test)
start the real engine with the kit and drive it with the client (append,
idempotency keys, batches, read paging, a tail, instances, failures, idle);
the routes the client calls are the ones Yoke's OpenAPI document lists."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import orjson

from yoke.http.app import create_app

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "yoke" / "hosts" / "node" / "client.js"


def test_the_clients_routes_are_in_the_openapi_document() -> None:
    printed = subprocess.run(
        ["node", "--input-type=module", "-e",
         f"import {{ ROUTES }} from {orjson.dumps(CLIENT.as_uri()).decode()}; console.log(JSON.stringify(ROUTES));"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    routes = orjson.loads(printed.stdout)
    paths = create_app(lambda: contextlib.nullcontext()).openapi()["paths"]
    missing = [(method, path) for method, path in routes if method not in paths.get(path, {})]
    assert routes and missing == []


def test_the_typescript_examples_tests_pass_with_the_test_kit() -> None:
    shop = ROOT / "examples" / "node" / "dist" / "shop.js"
    assert shop.is_file(), "examples/node/dist/shop.js is missing: run `make npm` (compiles examples/node)"
    done = subprocess.run(
        ["node", "--test", str(ROOT / "examples" / "node" / "shop.test.mjs")],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "YOKE_BIN": str(Path(sys.executable).parent / "yoke")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "# pass 4" in done.stdout and "# fail 0" in done.stdout


def test_the_idle_route_waits_for_the_actors_and_says_what_is_busy(tmp_path: Path) -> None:
    from tests.http.conftest import start_server, stop_server

    app_module = tmp_path / "slowapp.py"
    app_module.write_text(
        "import asyncio\nfrom yoke import App, Filter\napp = App()\n\n"
        "@app.actor('slow', filter=Filter(types=['slow']))\n"
        "async def slow(ctx, event):\n    await asyncio.sleep(event.payload['s'])\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    server = start_server(f"sqlite:///{tmp_path}/y.db", data, args=("--app", "slowapp:app"), PYTHONPATH=str(tmp_path))
    try:
        admin = server.client()
        assert admin.get("/v1/idle", params={"timeout_s": 5}).json() == {"idle": True, "busy": ""}
        admin.post("/v1/instances", json={"actor": "slow", "key": "k"})
        admin.post("/v1/streams/work/-/events", json={"type": "slow", "payload": {"s": 3}})
        busy = admin.get("/v1/idle", params={"timeout_s": 0.2}).json()
        assert busy["idle"] is False and "slow" in busy["busy"], busy
        assert admin.get("/v1/idle", params={"timeout_s": 30}).json()["idle"] is True
        assert server.client(token="").get("/v1/idle").status_code == 401  # admin scope
    finally:
        stop_server(server)


def test_the_typescript_examples_vitest_tests_pass_with_the_test_kit() -> None:
    """The same kit under Vitest (the one pinned for the Durable Streams
    suite, tests/durable_streams/package-lock.json; its globals, as the
    example's folder does not install it)."""
    vitest = ROOT / "tests" / "durable_streams" / "node_modules" / ".bin" / "vitest"
    done = subprocess.run(
        [str(vitest), "run", "--globals", "--root", str(ROOT / "examples" / "node"), "shop.spec.mjs"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "YOKE_BIN": str(Path(sys.executable).parent / "yoke"), "NO_COLOR": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_clients_answer_types_are_generated_from_the_openapi_document() -> None:
    """api.d.ts is what yoke/http/typescript_types.py makes of the document
    now: a schema change without regenerating it fails here."""
    from yoke.http.typescript_types import generate

    document = create_app(lambda: contextlib.nullcontext()).openapi()
    committed = (ROOT / "yoke" / "hosts" / "node" / "api.d.ts").read_text()
    assert committed == generate(document), (
        "regenerate: .venv/bin/python -m yoke.http.typescript_types > yoke/hosts/node/api.d.ts"
    )
