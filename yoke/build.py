"""Which build this is: the package version, plus the git commit when Yoke
runs from a checkout (``0.1.0+3f9c2a1b7d04``, ``.dirty`` when files differ
from it), so that two builds of one version are told apart.

The version itself lives in one place, here (``yoke.__version__`` is this
one; pyproject.toml reads it from there). Imports nothing of Yoke: the
metrics, low in the layers, read the version from it. The commit is asked of git once per process, and only
when the package sits in a git work tree; an installed package is its
version alone.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def commit() -> str | None:
    """``git describe`` of the checkout Yoke runs from (12 hex digits, then
    ``.dirty`` when tracked files changed), or None outside a checkout or
    without git."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():  # a directory, or a file in a worktree
        return None
    try:
        done = subprocess.run(
            # --match with no tag name: the commit alone, never a tag's distance.
            ["git", "-C", str(root), "describe", "--always", "--dirty=.dirty", "--abbrev=12", "--match=-"],
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    described = done.stdout.strip()
    return described if done.returncode == 0 and described else None


def build() -> str:
    """The version with the commit as a local version label (PEP 440)."""
    found = commit()
    return __version__ if found is None else f"{__version__}+{found}"
