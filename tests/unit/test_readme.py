"""The README's quickstart works when pasted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_quickstart_runs(tmp_path):
    code = re.search(r"## Quickstart\n\n```python\n(.*?)```", README.read_text(), re.S).group(1)
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=True
    )
    assert "appended at offset 1" in out.stdout
    assert "tail: 3 order.shipped" in out.stdout
    assert (tmp_path / ".yoke" / "yoke.db").exists()
