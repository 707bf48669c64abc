"""Each PL/pgSQL function's current text lives in one file,
``yoke/store/postgres/functions/<name>.sql``: the migrations install it
(several redefine ``yoke_append``), the file is what a reader reads. These
tests keep the two equal: each file is the definition a migrated database
holds (``pg_get_functiondef``, whitespace normalised), every ``yoke_*``
function in the database has its file, and each file's header names the
last migration that defines the function."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest

from yoke.store.postgres.migrate import migrations

FUNCTIONS = Path(__file__).resolve().parents[2] / "yoke" / "store" / "postgres" / "functions"


def normalised(sql: str) -> str:
    return " ".join(sql.split())


def file_text(path: Path) -> tuple[str, str]:
    """(its leading comment, the definition without its final semicolon)."""
    lines = path.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    definition = "\n".join(lines[n:]).rstrip()
    assert definition.endswith(";"), f"{path.name}: a definition ends with ';'"
    return "\n".join(lines[:n]), definition[:-1]


async def installed(url: str) -> dict[str, str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'public' AND p.proname LIKE 'yoke\\_%'"
        )
    finally:
        await conn.close()
    names = [r[0] for r in rows]
    assert len(names) == len(set(names)), "one definition per name: an overload would need a file of its own"
    return {r[0]: r[1] for r in rows}


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(FUNCTIONS.glob("*.sql"))}


async def test_every_function_has_its_file_and_no_file_is_stale(pg_actors_db, files):
    assert set(files) == set(await installed(pg_actors_db))


async def test_each_file_is_the_installed_definition(pg_actors_db, files):
    live = await installed(pg_actors_db)
    for name, path in files.items():
        _, definition = file_text(path)
        assert normalised(definition) == normalised(live[name]), (
            f"{path.name} is not what the migrations install: write the new definition into it"
        )


def test_each_header_names_the_last_migration_defining_it(files):
    for name, path in files.items():
        creates = re.compile(rf"CREATE\s+(OR\s+REPLACE\s+)?FUNCTION\s+(public\.|%I\.)?{name}\s*\(", re.I)
        last = [m.name for m in migrations() if creates.search(m.sql)][-1]
        header, _ = file_text(path)
        assert f"migrations/{last}" in header, f"{path.name}: its header should name {last}"
