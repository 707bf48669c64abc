"""The shape of yoke/'s imports, kept by a test (ARCHITECTURE.md, "Layers").

import-linter's contracts (pyproject.toml, ``[tool.importlinter]``) keep the
layers, who may import ``yoke.runtime`` and that no subsystem imports
another in a circle; this file runs them and adds what import-linter has no
contract for: no circle of more than ``MAX_CIRCLE`` modules anywhere in
yoke/. Every import counts, ``TYPE_CHECKING`` ones and those inside
functions included: they are the design's arrows.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_CIRCLE = 4


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def circles(graph: grimp.ImportGraph) -> list[set[str]]:
    """The import graph's strongly connected components of two or more modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = 0

    def visit(start: str) -> None:
        # Tarjan's algorithm, iterative (the graph is deep enough to matter).
        nonlocal counter
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            module, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = counter
                    counter += 1
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.find_modules_directly_imported_by(target)))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(component)

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_holds_more_than_four_modules() -> None:
    graph = grimp.build_graph("yoke", exclude_type_checking_imports=False)
    too_big = [sorted(c) for c in circles(graph) if len(c) > MAX_CIRCLE]
    assert not too_big, f"import circles of more than {MAX_CIRCLE} modules: {too_big}"


def folder(module: str) -> str:
    """The folder a module's file is in (a package's own __init__ is in its folder)."""
    path = ROOT / (module.replace(".", "/"))
    return module if path.is_dir() else module.rpartition(".")[0]


def test_no_import_circle_crosses_a_folder() -> None:
    graph = grimp.build_graph("yoke", exclude_type_checking_imports=False)
    across = [sorted(c) for c in circles(graph) if len({folder(m) for m in c}) > 1]
    assert not across, f"import circles across folders: {across}"


def test_every_folder_of_yoke_is_a_package() -> None:
    """A folder without __init__.py is a namespace package: import-linter's
    graph leaves it out (its contracts would pass unchecked) and the
    installed distribution (packages.find) would leave it behind."""
    missing = [
        str(d.relative_to(ROOT)) for d in (ROOT / "yoke").rglob("*")
        if d.is_dir() and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert not missing, missing
