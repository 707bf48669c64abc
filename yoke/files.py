"""Files only their owner may read: what Yoke writes holds events, state and
tokens, so a new file is made mode 0600 and a new directory 0700, whatever
the process's umask. Files that exist keep their mode (an operator may have
chosen it). SQLite gives a database's -wal and -shm files its main file's
mode, so creating the main file 0600 covers them."""

from __future__ import annotations

import os
from pathlib import Path


def private_dir(path: Path) -> None:
    """``path`` and missing parents, made 0700 (existing ones left as they are)."""
    missing = []
    for p in (path, *path.parents):
        if p.exists():
            break
        missing.append(p)
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(p, 0o700)  # mkdir's mode is filtered by the umask


def private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it does not exist (SQLite then
    opens it as a new database)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.fchmod(fd, 0o600)  # the umask may have taken bits off: it cannot add any, but be exact
    os.close(fd)


def open_private(path: Path, mode: str = "wb"):  # noqa: ANN201 - a file object
    """``open(path, mode)`` for writing, a new file made 0600."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    return os.fdopen(os.open(path, flags, 0o600), mode)
