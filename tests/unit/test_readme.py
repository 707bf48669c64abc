"""The README's Python works when pasted, its settings table is complete and
its links lead somewhere. (Its shell tour runs against a real server in
tests/http/test_readme_tour.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from yoke.config import Settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_python_of_the_tour_runs(tmp_path):
    tour = README.read_text().split("## A five-minute tour", 1)[1]
    code = re.search(r"```python\n(.*?)```", tour, re.S).group(1)
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    assert "appended at offset 1" in out.stdout
    assert "tail: 3 order.shipped" in out.stdout
    assert (tmp_path / ".yoke" / "yoke.db").exists()


def test_every_setting_is_in_the_configuration_table():
    text = README.read_text()
    table = text[text.index("## Configuration"):text.index("## Layout")]
    named = set(re.findall(r"`([a-z0-9_]+)`", table))
    missing = [f.name for f in fields(Settings) if f.name not in named]
    assert missing == [], f"settings missing from the README's Configuration table: {missing}"


DOCS = [README, ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
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
