"""Numbered migrations, shared by both backends: the files, and the check
that the migrations a database records are the files of this version.

Each backend records every migration it applies with its number, its file
name and a SHA-256 of its text. Tracking by number alone would let a
database migrated with an older file of the same number (a migration later
renumbered, renamed or edited) skip the new one silently: the schema would
then differ from what the code expects, in ways that surface much later.
Instead, before applying anything, the recorded migrations are compared
with the files, and any difference stops the start with ``SchemaMismatch``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from .. import errors


@dataclass(frozen=True)
class Migration:
    version: int
    name: str  # the file name, NNNN_what.sql
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class Recorded:
    """A migration as the database recorded it (checksum None: recorded
    before checksums were kept)."""

    name: str
    checksum: str | None


def read_migrations(package: str) -> list[Migration]:
    """The ``migrations/NNNN_name.sql`` files of ``package``, by number."""
    folder = resources.files(package).joinpath("migrations")
    found: dict[int, Migration] = {}
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        version = int(entry.name.split("_", 1)[0])
        if version in found:
            raise errors.SchemaMismatch(
                f"two migrations numbered {version}: {found[version].name} and {entry.name}"
            )
        # read_text: universal newlines, so a checkout with CRLF sums the same.
        found[version] = Migration(version, entry.name, entry.read_text())
    return [found[v] for v in sorted(found)]


@dataclass(frozen=True)
class Status:
    """Where a database stands against this build's migrations (file names)."""

    applied: list[str]  # recorded, and this build's
    pending: list[str]  # this build's, not recorded yet
    newer: list[str]  # recorded, numbered above this build's newest: a newer build applied them


def status(recorded: Mapping[int, Recorded], files: list[Migration]) -> Status:
    """``SchemaMismatch`` when the recorded migrations are not this build's
    (``check_recorded``), else what is applied, pending and newer."""
    check_recorded(recorded, files)
    known = {m.version for m in files}
    return Status(
        applied=[m.name for m in files if m.version in recorded],
        pending=[m.name for m in files if m.version not in recorded],
        newer=[recorded[v].name for v in sorted(recorded) if v not in known],
    )


def check_startable(found: Status, *, migrated: bool) -> None:
    """Refuse to run on a schema this build cannot use: migrations from a
    newer build (its code may rely on them, or on their absence, in ways
    this one cannot know), or, when this process did not migrate
    (``--no-migrate``), migrations still pending."""
    if found.newer:
        raise errors.SchemaNewer(
            f"the database was migrated by a newer Yoke: it records {', '.join(found.newer)}, which this"
            f" build ({_newest(found)}) does not know. Run the newer build (docs/production/upgrades.md)",
            newer=found.newer,
        )
    if found.pending and not migrated:
        raise errors.SchemaPending(
            f"{len(found.pending)} migration(s) of this build are not applied ({', '.join(found.pending)}),"
            " and this process does not migrate (--no-migrate): run `yoke migrate` with this build first",
            pending=found.pending,
        )


def _newest(found: Status) -> str:
    known = found.applied + found.pending
    return f"migrations up to {max(known)}" if known else "no migrations"


def check_recorded(recorded: Mapping[int, Recorded], files: list[Migration]) -> None:
    """Raise ``SchemaMismatch`` unless every recorded migration is the file
    of the same number (same name, and same text when a checksum was
    recorded). Migrations numbered above the newest file are a newer
    version's and are left alone; a recorded number below it that has no
    file is a mismatch."""
    by_version = {m.version: m for m in files}
    newest = files[-1].version if files else 0
    problems = []
    for version in sorted(recorded):
        seen = recorded[version]
        file = by_version.get(version)
        if file is None:
            if version < newest:
                problems.append(f"{seen.name} is recorded, but this Yoke has no migration {version}")
        elif seen.name != file.name:
            problems.append(f"{seen.name} is recorded as migration {version}, but this Yoke's is {file.name}")
        elif seen.checksum is not None and seen.checksum != file.checksum:
            problems.append(f"{file.name} was applied from a different text (checksum"
                            f" {seen.checksum[:12]}, the file's {file.checksum[:12]})")
    if problems:
        raise errors.SchemaMismatch(
            "the database's migrations do not match this version of Yoke: " + "; ".join(problems)
            + ". It was migrated by another version (a migration renumbered, renamed or edited):"
            " applying the rest could skip or repeat part of the schema. Use the Yoke version that"
            " migrated it, or a new database",
            mismatches=problems,
        )
