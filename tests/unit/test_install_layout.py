"""Installing Yoke puts one top-level package on the import path: ``yoke``.

The repository's own ``tests``, ``examples`` and ``bench`` are not part of
it: with the repository root on sys.path (what a ``package-dir = {"" =
"."}`` editable install wrote, a plain .pth entry), a user's own ``tests``
package imported Yoke's tests/conftest.py instead. pyproject.toml's
``[tool.setuptools]`` sections decide both layouts checked here: the
editable install this venv has, and the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OTHERS = ("tests", "examples", "bench")

FIND = """
import importlib.util, json, sys
names = ("yoke",) + tuple(sys.argv[1:])
print(json.dumps({"found": {n: importlib.util.find_spec(n) is not None for n in names}, "path": sys.path}))
"""


def test_the_installed_yoke_is_the_only_package_it_adds(tmp_path):
    """This venv's interpreter, from a directory of its own and with no
    PYTHON* variable (PYTHONPATH would add the repository back): ``yoke``
    imports, the repository's other top-level packages do not, and the
    repository root is not on sys.path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [sys.executable, "-c", FIND, *OTHERS], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )
    seen = json.loads(done.stdout)
    assert seen["found"] == {"yoke": True, **{name: False for name in OTHERS}}, seen
    on_path = {Path(entry or tmp_path).resolve() for entry in seen["path"]}
    assert ROOT not in on_path, seen["path"]


def test_the_wheel_holds_only_yoke(tmp_path):
    """The wheel built from a copy of this checkout (tests, examples and bench
    included, so that leaving them out is the configuration's doing) has no
    top-level name but ``yoke`` and its .dist-info.

    It is built for real, as ``pip install`` builds it, rather than by
    re-deriving setuptools' package list: pyproject.toml needs setuptools>=77
    and this venv has whichever setuptools venv gave it (none at all from
    Python 3.12 on), so pip builds in an isolated environment with setuptools
    from the package index that ``make install`` uses too (about 3 s). Without
    that index the build cannot run and the test is skipped; the editable
    install's test above still runs.
    """
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__", ".yoke", ".pytest_cache",
        ".hypothesis", "artifacts",
    ))
    out = tmp_path / "wheels"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
         "-w", str(out), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    if done.returncode != 0 and ("No matching distribution found for setuptools" in done.stderr
                                 or "Could not find a version that satisfies the requirement setuptools" in done.stderr):
        said = next(line for line in done.stderr.splitlines() if "setuptools" in line).strip()
        pytest.skip(f"no package index to build the wheel with: {said}")
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("yoke-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {name for name in top if name.endswith(".dist-info")}
    assert len(dist_info) == 1 and top - dist_info == {"yoke"}, sorted(top)
    assert "yoke/__init__.py" in names and "yoke/store/sqlite/migrations/0001_streams.sql" in names
