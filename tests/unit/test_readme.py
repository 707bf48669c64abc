"""The README's Python works when pasted. (Its shell tour runs against a real
server in tests/http/test_readme_tour.py; its links are checked with every
doc's in test_docs.py.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path


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
