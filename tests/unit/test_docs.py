"""The docs stay true to the code and to each other: every relative link
leads to a file (and heading), every docs path the code, tests and benches
name exists, the configuration page lists every setting with its variable and
default, the errors page every error code with its status, and
ARCHITECTURE.md stays short enough to read."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from yoke import errors
from yoke.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    ROOT / "README.md",
    ROOT / "ARCHITECTURE.md",
    ROOT / "yoke" / "hosts" / "node" / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_to_files_and_headings(doc):
    text = doc.read_text()
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(target)
    assert broken == []


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as -."""
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_docs_paths_named_in_code_exist():
    """Error hints, CLI help, docstrings and comments that send a reader to
    docs/... send them to a page that is there."""
    missing = []
    sources = [
        p
        for folder in ("yoke", "tests", "bench", "examples")
        for p in (ROOT / folder).rglob("*")
        if p.suffix in (".py", ".js", ".ts", ".md", ".yml") and "node_modules" not in p.parts and "dist" not in p.parts
    ]
    for source in sources:
        for path, anchor in re.findall(r"(?<![\w/])(docs/[\w./-]*[\w])(?:#([\w-]+))?", source.read_text()):
            file = ROOT / path
            if path.startswith("docs/assets"):
                continue  # the /docs/assets route, not a file
            if not file.exists():
                missing.append(f"{source.relative_to(ROOT)}: {path}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
                missing.append(f"{source.relative_to(ROOT)}: {path}#{anchor}")
    assert missing == []


CONFIGURATION = ROOT / "docs" / "production" / "configuration.md"


def literal(value: object) -> str:
    """A default as the configuration page writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def test_every_setting_is_on_the_configuration_page_with_its_variable_and_default():
    rows = [line for line in CONFIGURATION.read_text().splitlines() if line.startswith("| `")]
    wrong = []
    for f in fields(Settings):
        row = next((r for r in rows if f"`{f.name}`" in r.split("|")[1]), None)
        if row is None:
            wrong.append(f"{f.name}: no row")
            continue
        cells = [c.strip() for c in row.strip("|").split("|")]
        names = re.findall(r"`([a-z0-9_]+)`", cells[0])
        variables = re.findall(r"`([A-Z0-9_]+)`", cells[1])
        defaults = re.findall(r"`([^`]*)`", cells[2])
        at = names.index(f.name)
        if variables[at:at + 1] != ["YOKE_" + f.name.upper()]:
            wrong.append(f"{f.name}: variable {variables}")
        if defaults[at:at + 1] != [literal(f.default)]:
            wrong.append(f"{f.name}: default {defaults}, expected {literal(f.default)}")
    assert wrong == []


ERRORS = ROOT / "docs" / "reference" / "errors.md"


def test_every_error_code_is_on_the_errors_page_with_its_status():
    rows = {}
    for line in ERRORS.read_text().splitlines():
        found = re.match(r"\| `([a-z_]+)` \| (\d+) \|", line)
        if found:
            rows[found.group(1)] = int(found.group(2))
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.YokeError)]
    wrong = [f"{c.code}: {rows.get(c.code)}, expected {c.http_status}" for c in classes if rows.get(c.code) != c.http_status]
    assert wrong == []


def test_architecture_stays_short():
    size = len((ROOT / "ARCHITECTURE.md").read_text())
    assert size <= 15_000, f"ARCHITECTURE.md is {size} characters; details belong in docs/dev/ or the docstrings"
