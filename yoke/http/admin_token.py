"""The admin token of a data directory: one per directory and database.

``yoke serve`` keeps the admin token of tenant ``default`` in the token
files of its data directory (``token-PORT``, mode 0600, for the CLI). What
"one per data directory" means:

- **Restarts** reuse it: a token in any of the directory's files that still
  authenticates on this database as the default tenant's admin.
- **Several servers** sharing the directory and the database share it (each
  port's file holds the same token); a file lock makes simultaneous starts
  agree on one instead of minting one each. Servers of another database in
  the same directory keep a token of their own (it does not authenticate
  here, so it is left alone).
- **Minted** only when no file holds a working one, named after the
  directory (``yoke serve admin (HOST:/abs/path)``); the tokens of that name
  minted before are revoked then: their files were lost (a wiped directory,
  a container restarted with a fresh one on the same host and path).
- **Rotated** on request (``yoke serve --rotate-token``): a new one is
  minted, the old one revoked, and every file of the directory that held
  the old one is rewritten.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from .. import errors, tokenfile
from ..runtime import Runtime

NAME = "yoke serve admin"
TENANT = "default"
LOCK = ".admin-token.lock"


def directory_name(data_dir: str | Path) -> str:
    """The name of the tokens minted for ``data_dir`` on this host (at most
    200 characters: a long path keeps its end)."""
    where = f"{socket.gethostname()}:{os.path.abspath(data_dir)}"
    room = 200 - len(NAME) - 3
    return f"{NAME} ({where[-room:]})"


@contextlib.asynccontextmanager
async def directory_lock(data_dir: Path) -> AsyncIterator[None]:
    """An exclusive lock on ``data_dir`` among the servers that use it."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)  # another server may hold it for a moment
        yield
    finally:
        os.close(fd)  # releases the lock


async def _working(runtime: Runtime, token: str) -> bool:
    try:
        info = await runtime.tokens.authenticate(token)
    except errors.Unauthorized:  # another database's, revoked or expired
        return False
    return info.tenant == TENANT and "admin" in info.scopes


async def ensure(runtime: Runtime, data_dir: str | Path, port: int, *, rotate: bool = False) -> str:
    """The directory's admin token, written to ``token-PORT`` (see above)."""
    directory = Path(data_dir)
    token_file = tokenfile.token_file(directory, port)
    async with directory_lock(directory):
        siblings = [p for p in tokenfile.token_files(directory) if p != token_file]
        current = None
        for candidate in [token_file, *siblings]:
            token = tokenfile.read_token(candidate)
            if token is not None and await _working(runtime, token):
                current = token
                break
        if current is not None and not rotate:
            if tokenfile.read_token(token_file) != current:
                tokenfile.write_token(token_file, current)
            return current
        name = directory_name(directory)
        new = await runtime.tokens.create(TENANT, ["admin"], name=name)
        old_id = None if current is None else current.split(".", 1)[0].removeprefix("yk_")
        for info in await runtime.tokens.list(TENANT):
            if info.revoked_at is None and info.token_id != new.info.token_id and (
                info.name == name or info.token_id == old_id
            ):
                await runtime.tokens.revoke(TENANT, info.token_id)
        for path in tokenfile.token_files(directory):
            if current is not None and tokenfile.read_token(path) == current:
                tokenfile.write_token(path, new.token)
        tokenfile.write_token(token_file, new.token)
        return new.token
