"""``backup`` and ``restore``: an embedded (SQLite) Yoke's files as of one
moment, taken while it runs (yoke/store/sqlite/backup.py). PostgreSQL is
backed up with pg_dump (docs/production/backups.md)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import click

from .common import DB_OPTION, JSON_OPTION, Arg, command, emit, fail
from .server import settings_or_fail

MANIFEST = "backup.json"
DATA_DIR_OPTION = click.option(
    "--data-dir", default=None, metavar="DIR",
    help="The data directory whose actors/ holds the instance databases (default .yoke; YOKE_DATA_DIR).",
)


def _embedded(settings: Any, action: str) -> None:
    if not settings.database_url.startswith("sqlite:///"):
        fail(f"yoke {action} is for SQLite databases: back PostgreSQL up with pg_dump as a role that passes"
             " row-level security (docs/production/backups.md)")
    if settings.storage not in ("", "file"):
        fail(f"YOKE_STORAGE={settings.storage}: instance databases are not files under the data directory;"
             f" yoke {action} covers file storage only")


def _instance_root(data_dir: str) -> Path:
    from ..actors.state import FileStorage

    return FileStorage.root_in(data_dir)


@command(short_help="Copy a running SQLite Yoke (database, objects, instance states) as of one moment.")
@DB_OPTION
@DATA_DIR_OPTION
@click.argument("dest", cls=Arg, metavar="DEST", type=click.Path(path_type=Path),
                help="a directory that does not exist yet")
@JSON_OPTION
def backup(database_url: str | None, data_dir: str | None, dest: Path, as_json: bool) -> None:
    """Copy the SQLite database, its object files and every actor instance's
    database into DEST (a new directory) as of one moment, while `yoke
    serve` runs: restored, no queue row runs twice for an atomic actor, and
    no journaled effect repeats (docs/production/backups.md). The server's
    writes wait while the instance databases are copied."""
    from ..store.sqlite.backup import backup as take

    settings = settings_or_fail(database_url=database_url, data_dir=data_dir)
    _embedded(settings, "backup")
    if dest.exists():
        fail(f"{dest} exists: back up into a new directory")
    try:
        done = take(settings.database_url, _instance_root(settings.data_dir), dest, dest / "actors")
    except Exception as exc:  # a missing file, a full disk, a database locked past the wait
        fail(f"backup of {settings.database_url} failed: {type(exc).__name__}: {exc}")
    # The state's home goes with it (actors/state_home.py): restored, the
    # instances' state is where the database says it is.
    from ..actors.state_home import ID_FILE

    home_id = _instance_root(settings.data_dir) / ID_FILE
    if home_id.exists():
        (dest / "actors").mkdir(exist_ok=True)
        shutil.copyfile(home_id, dest / "actors" / ID_FILE)
    from ..build import build

    manifest = {
        "database": done.main.name, "instances": done.instances, "objects": done.objects, "bytes": done.bytes,
        "writes_waited_s": round(done.locked_s, 3), "took_s": round(done.total_s, 3),
        "at": int(time.time() * 1000), "build": build(),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    emit({"dest": str(dest), **manifest}, as_json, lambda v: (
        f"backed up {settings.database_url} to {dest}: {done.instances} instance databases, {done.objects}"
        f" object files, {done.bytes / 1e6:.1f} MB in {done.total_s:.2f} s (writes waited {done.locked_s:.2f} s)"
    ))


@command(short_help="Put a `yoke backup` in place for a new server (nothing is overwritten).")
@DB_OPTION
@DATA_DIR_OPTION
@click.argument("source", cls=Arg, metavar="SOURCE", type=click.Path(path_type=Path, exists=True, file_okay=False),
                help="a directory written by `yoke backup`")
@JSON_OPTION
def restore(database_url: str | None, data_dir: str | None, source: Path, as_json: bool) -> None:
    """Copy a backup made by `yoke backup` to the database file of --db and
    the instance databases under the data directory's actors/; both must be
    new. Then start `yoke serve` on them: queued rows run, atomic runs that
    committed their state replay their effects only."""
    from ..store.sqlite.backup import restore as put

    settings = settings_or_fail(database_url=database_url, data_dir=data_dir)
    _embedded(settings, "restore")
    try:
        manifest = json.loads((source / MANIFEST).read_text())
        put(source / manifest["database"], settings.database_url, source / "actors", _instance_root(settings.data_dir))
    except (OSError, ValueError, KeyError) as exc:
        fail(f"restore from {source} failed: {type(exc).__name__}: {exc}")
    emit({"source": str(source), "database_url": settings.database_url, **manifest}, as_json,
         lambda v: f"restored {source} to {settings.database_url} ({manifest['instances']} instance databases)")
