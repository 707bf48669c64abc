"""The admin token files a local ``yoke serve`` leaves for the CLI.

Each server writes its admin token (tenant ``default``) to
``<data_dir>/token-<port>``, mode 0600: two servers started in one directory
(on two ports, perhaps on two databases) keep a token each, and the CLI reads
the file of the port its ``--url`` names. Standard library only: the CLI
imports this module on every call.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_DATA_DIR = ".yoke"  # = Settings.data_dir, without importing the settings


def data_dir() -> str:
    """``YOKE_DATA_DIR``, else ``.yoke`` (relative to the current directory)."""
    return os.environ.get("YOKE_DATA_DIR") or DEFAULT_DATA_DIR


def token_file(directory: str | Path, port: int) -> Path:
    """Where the server on ``port`` keeps its admin token."""
    return Path(directory) / f"token-{port}"


def token_files(directory: str | Path) -> list[Path]:
    """Every token file in ``directory``, newest first (``token`` is the name
    servers used before the files were keyed by port)."""
    base = Path(directory)
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.is_file() and (p.name == "token" or p.name.startswith("token-"))]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def read_token(path: Path) -> str | None:
    try:
        token = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return token or None


def write_token(path: Path, token: str) -> None:
    """Replace ``path`` atomically with a file of mode 0600 holding ``token``."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
