"""The Node SDK as a TypeScript team gets it: ``npm pack`` of
yoke/hosts/node (the ``yoke-sdk`` package) installed in a project of its
own; ordinary strict TypeScript against its types compiles (interfaces as
state, generic payloads, typed ops), what must not compile does not
(``@ts-expect-error``), the op list in the types is the kernel's, and the
compiled actor runs, catching the host's errors with the package's
``YokeError``."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import orjson
import pytest

import yoke
from yoke import App, Filter
from yoke.actors.ops import OPS

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "yoke" / "hosts" / "node"
TSC = ROOT / "examples" / "node" / "node_modules" / ".bin" / "tsc"
HERE = Path(__file__).parent / "node_types"
TSCONFIG = {
    "compilerOptions": {
        "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
        "noEmitOnError": True, "types": [], "rootDir": ".", "outDir": "dist",
    },
}


def test_the_ops_the_types_name_are_the_kernels() -> None:
    types = (SDK / "yoke.d.ts").read_text()
    block = types.split("export interface Ops {", 1)[1].split("\n}\n", 1)[0]
    assert set(re.findall(r"^  (\w+): \{", block, re.M)) == set(OPS)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("ts")
    packed = subprocess.run(["npm", "pack", str(SDK), "--pack-destination", str(where), "--json"],
                            capture_output=True, text=True, check=True, timeout=120)
    tarball = where / orjson.loads(packed.stdout)[0]["filename"]
    app = where / "app"
    app.mkdir()
    (app / "package.json").write_text(orjson.dumps(
        {"name": "ts-app", "private": True, "type": "module", "dependencies": {"yoke-sdk": f"file:{tarball}"}}
    ).decode())
    subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund"], cwd=app, check=True,
                   capture_output=True, timeout=120)
    for name in ("good.ts", "wrong.ts", "client_use.ts"):
        shutil.copy(HERE / name, app / name)
    (app / "tsconfig.json").write_text(orjson.dumps({**TSCONFIG, "files": ["good.ts"]}).decode())
    return app


def test_the_package_holds_the_sdk_and_only_it(project: Path) -> None:
    [tarball] = project.parent.glob("yoke-sdk-*.tgz")
    with tarfile.open(tarball) as packed:
        assert sorted(packed.getnames()) == [
            "package/README.md", "package/api.d.ts", "package/client.d.ts", "package/client.js", "package/package.json",
            "package/testing.d.ts", "package/testing.js", "package/yoke.d.ts", "package/yoke.js",
        ]


def tsc(project: Path, *files: str) -> subprocess.CompletedProcess[str]:
    """tsc --strict on ``files`` alone (no output)."""
    config = project / f"tsconfig.{files[0]}.json"
    config.write_text(orjson.dumps({**TSCONFIG, "compilerOptions": {**TSCONFIG["compilerOptions"], "noEmit": True},
                                    "files": list(files)}).decode())
    return subprocess.run([str(TSC), "-p", config.name], cwd=project, capture_output=True, text=True, timeout=120)


def test_strict_typescript_compiles_and_what_must_not_does_not(project: Path) -> None:
    done = tsc(project, "good.ts")
    assert done.returncode == 0, done.stdout
    client = tsc(project, "client_use.ts")  # the client and the test kit, from the package's subpaths
    assert client.returncode == 0, client.stdout
    # Every @ts-expect-error line must be an error: tsc fails on one that is not.
    wrong = tsc(project, "wrong.ts")
    assert wrong.returncode == 0, wrong.stdout
    # ...and without the directives, each of those lines is refused.
    (project / "wrong_bare.ts").write_text((project / "wrong.ts").read_text().replace("// @ts-expect-error", "//"))
    bare = tsc(project, "wrong_bare.ts")
    assert len(re.findall(r"wrong_bare\.ts\(\d+,\d+\): error", bare.stdout)) == 6, bare.stdout


async def test_the_compiled_actor_runs_with_the_typed_ops(project: Path, tmp_path: Path) -> None:
    subprocess.run([str(TSC), "-p", "."], cwd=project, check=True, capture_output=True, timeout=120)
    app = App()
    app.node_actor("txns", project / "dist" / "good.js", filter=Filter(types=["txn"], key="payload.account"))

    @app.actor("ledger")
    async def ledger(ctx, event):  # noqa: ANN001, ANN202
        pass

    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=app, data_dir=str(tmp_path), host_processes=1) as y:
        await y.stream("/").append({"type": "txn", "payload": {"account": "a1", "cents": 250}})
        await y.wait_idle(timeout_s=30)
        instances = y.instances()
        txns = await instances.find("txns", "a1")
        ledger_one = await instances.find("ledger", "a1")
        assert txns is not None and ledger_one is not None
        state, _ = await instances.state(txns.instance_id)
        assert state["cents"] == 250 and state["child"] == ledger_one.instance_id
        assert state["schedules"] == 1 and state["due_at"] > 0
        assert state["refused"].startswith("invalid_event")
        [changed] = [e for e in await y.stream("/balances").read() if e.type == "balance.changed"]
        assert changed.payload["cents"] == 250 and changed.correlation is None
