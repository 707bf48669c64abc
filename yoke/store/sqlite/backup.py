"""An online backup of an embedded Yoke: the main database file, its object
files and every instance database, as of one moment (docs/production/backups.md).

Why one moment matters: the main file records which queue rows completed;
an instance's file holds the state its runs wrote. Files copied one after
another while the server runs pair a main file of one moment with instance
files of later ones, whose state already counts events the main file still
has queued: restored, those events run again and count twice.

The moment is made by holding the main file's write lock (``BEGIN
IMMEDIATE``, the lock the server's writer thread takes for every commit):

1. take the write lock: from here no queue row completes, none is claimed,
   nothing is appended, no object file is deleted (the writer waits, up to
   its busy timeout);
2. open a read snapshot of the main file: the moment;
3. copy every instance database (SQLite's backup API: each a consistent
   copy of its last commit) and every object file;
4. let the write lock go: the server carries on;
5. copy the main file from the snapshot of step 2, however long it takes.

What this gives, restored: an atomic actor's run (effects="atomic") commits
its state with an applied marker before its store transaction, which the
lock holds back; so every state an instance file holds belongs to a row the
main file completed, or to one it still has queued with its marker, which
a restored server replays without user code. Each event's state and effects
count once. A default actor's state writes are not tied to their row (they
are not, after a crash either): a run that wrote state and had not
completed when the lock was taken runs again after a restore, as it would
after a power cut at that moment (docs/advanced/effects.md).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .connection import path_from_url

# How long to wait for the server's writer to finish its transaction.
LOCK_WAIT_MS = 30_000


@dataclass(frozen=True)
class Backup:
    main: Path
    instances: int
    objects: int
    bytes: int
    locked_s: float  # how long the server's writes waited
    total_s: float


def backup(url: str, instance_root: Path, dest: Path, instance_dest: Path) -> Backup:
    """Copy the database at ``url`` (its file and its ``objects/``) into
    ``dest`` and the instance databases under ``instance_root`` into
    ``instance_dest``, as of one moment (above). ``dest`` must not exist."""
    started = time.monotonic()
    source = path_from_url(url)
    if not source.exists():
        raise FileNotFoundError(f"no database file {source}")
    dest.mkdir(parents=True)
    lock = _connect(source)
    snapshot = _connect(source)
    try:
        lock.execute("BEGIN IMMEDIATE")  # 1: the server's writes wait from here
        locked = time.monotonic()
        try:
            snapshot.execute("BEGIN")  # 2: the moment
            snapshot.execute("SELECT count(*) FROM sqlite_master").fetchone()
            instances = _copy_instances(instance_root, instance_dest)  # 3
            objects = _copy_tree(source.parent / "objects", dest / "objects")
        finally:
            lock.execute("ROLLBACK")  # 4
        unlocked = time.monotonic()
        main = dest / source.name
        target = sqlite3.connect(main)
        try:
            snapshot.backup(target)  # 5: from the open read transaction, the moment's
        finally:
            target.close()
        snapshot.execute("COMMIT")
        sync_files(dest)
        if not instance_dest.is_relative_to(dest):
            sync_files(instance_dest)
    finally:
        lock.close()
        snapshot.close()
    size = sum(p.stat().st_size for p in (*dest.rglob("*"), *instance_dest.rglob("*")) if p.is_file())
    return Backup(main, instances, objects, size, unlocked - locked, time.monotonic() - started)


def restore(backup_main: Path, url: str, instance_backup: Path, instance_root: Path) -> None:
    """Put a backup in place for a server that is not running: the main
    file at ``url`` (its objects beside it), the instance databases under
    ``instance_root``. Refuses to overwrite anything."""
    target = path_from_url(url)
    for path in (target, target.parent / "objects", instance_root):
        if path.exists() and (path.is_file() or any(path.iterdir())):
            raise FileExistsError(f"{path} exists: restore into a new place")
    target.parent.mkdir(parents=True, exist_ok=True)
    for suffix in ("-wal", "-shm"):  # a WAL left by a removed file must not join the new one
        target.with_name(target.name + suffix).unlink(missing_ok=True)
    shutil.copyfile(backup_main, target)
    _copy_tree(backup_main.parent / "objects", target.parent / "objects")
    _copy_tree(instance_backup, instance_root)
    for path in (target, target.parent / "objects", instance_root):
        if path.is_dir():
            sync_files(path)
        elif path.exists():
            fd = os.open(path, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None, timeout=LOCK_WAIT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout={LOCK_WAIT_MS}")
    return conn


def _copy_instances(root: Path, dest: Path) -> int:
    """Each instance database under ``root`` as of its last commit."""
    copied = 0
    for source in sorted(root.rglob("*.db")) if root.exists() else []:
        target = dest / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = _connect(source)  # mode=rw: never creates a file that went away
        except sqlite3.OperationalError:
            if source.exists():
                raise
            continue  # its instance was removed before the moment: the main file has none
        try:
            copy = sqlite3.connect(target)
            try:
                # No journal, no fsync while the server waits: the copies are
                # synced after the lock is let go (sync_files).
                copy.execute("PRAGMA journal_mode=OFF")
                copy.execute("PRAGMA synchronous=OFF")
                conn.backup(copy)
            finally:
                copy.close()
        finally:
            conn.close()
        copied += 1
    return copied


def sync_files(root: Path) -> None:
    """fsync every file under ``root``, then its directories: the backup is
    on disk when ``backup`` returns."""
    for path in sorted(root.rglob("*"), reverse=True):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _copy_tree(source: Path, dest: Path) -> int:
    """Object files (written whole, renamed into place, deleted only after
    their rows): plain copies."""
    if not source.exists():
        return 0
    copied = 0
    for path in sorted(source.rglob("*")):
        if path.is_file() and not path.name.endswith(".part"):
            target = dest / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            copied += 1
    return copied
