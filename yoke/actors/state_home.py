"""Where the instances' state lives, so that it is never lost silently: an
instance's state is either reachable by whichever process runs it next, or
that process refuses to run it.

A process's home comes from its settings: the storage mode and, for file
storage, the identity of its ``<data_dir>/actors`` folder, an id file made
once, atomically, in that folder (a folder shared between hosts, or moved,
keeps its id; another folder has another). The first executor on a database
records its home there (``store.actors.record_state_home``). An executor
whose home differs refuses to start, naming both places; a process that only
reads state (the API's instance state and SQL query) answers
``state_elsewhere``. Processes that never open state are never asked.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import errors
from ..files import private_dir
from ..store.actors import StateHome

if TYPE_CHECKING:
    from ..config import Settings
    from ..store.actors import ActorStore

# In the file storage root, next to the tenants' folders: '~' is in no
# tenant name, so no tenant's folder can take its place.
ID_FILE = "yoke~storage-id"
FIX = (
    "run every process with one shared YOKE_DATA_DIR (the same directory, shared between hosts),"
    " or keep the state where every process reaches it: YOKE_STORAGE=pg_sqlite (PostgreSQL) or s3"
)


def storage_mode(settings: Settings) -> str:
    """The storage mode ``settings`` choose (the backend's default when unset)."""
    return settings.storage or ("file" if settings.database_url.startswith("sqlite") else "pg_sqlite")


def directory_id(root: Path, *, create: bool) -> str | None:
    """The id of the file storage folder ``root``; made when missing if
    ``create`` (else None). The id file appears whole or not at all (a
    hard link of a complete file), and one process's id wins a race."""
    path = root / ID_FILE
    if not path.exists() and create:
        private_dir(root)
        draft = root / f"{ID_FILE}.{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with os.fdopen(os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
                f.write(f"dir_{secrets.token_hex(16)}\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(draft, path)  # fails if another process's id is there first
            except FileExistsError:
                pass
        finally:
            draft.unlink(missing_ok=True)
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def home_of(settings: Settings, *, create: bool) -> StateHome:
    """This process's home. ``create``: make the data directory's id if it
    has none (an executor's; a reader with none reaches no state there)."""
    mode = storage_mode(settings)
    if mode == "file":
        root = Path(settings.data_dir).resolve() / "actors"
        return StateHome("file", directory_id(root, create=create) or "", f"{root} on host {socket.gethostname()}")
    if mode == "s3":
        place = f"s3://{settings.s3_bucket}/{settings.s3_prefix}"
        endpoint = f" at {settings.s3_endpoint_url}" if settings.s3_endpoint_url else ""
        return StateHome("s3", place, place + endpoint)
    return StateHome(mode, "", "the database itself (actor_sqlite)")


def _described(home: StateHome) -> str:
    recorded = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(home.recorded_at / 1000))
    return f"{home.label} ({home.storage} storage, recorded {recorded})"


class Guard:
    """The check one process makes, at most once per answer it needs."""

    def __init__(self, store: ActorStore, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        self._confirmed = False

    async def claim(self) -> None:
        """For an executor, before it runs anything: record this process's
        home if none is recorded; ``StateElsewhere`` if another one is."""
        mine = home_of(self._settings, create=True)
        recorded = await self._store.record_state_home(mine)
        if not recorded.same_place(mine):
            raise errors.StateElsewhere(
                f"refusing to run actors: the state of this database's instances lives in"
                f" {_described(recorded)}, but this process would keep it in {mine.label}"
                f" ({mine.storage} storage), where instances moving here would start from empty"
                f" state; {FIX}"
            )
        self._confirmed = True

    async def check(self) -> None:
        """For a process about to read an instance's state: ``StateElsewhere``
        if the recorded home is not this process's (none recorded: no
        executor ran on this database yet, nothing to miss)."""
        if self._confirmed:
            return
        recorded = await self._store.state_home()
        if recorded is None:
            return
        mine = home_of(self._settings, create=False)
        if not recorded.same_place(mine):
            raise errors.StateElsewhere(
                f"the state of this database's instances lives in {_described(recorded)}, which this"
                f" process does not reach (its own: {mine.label}, {mine.storage} storage); {FIX}"
            )
        self._confirmed = True
