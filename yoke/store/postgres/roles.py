"""The runtime role: its name per database, its grants, its password.

The migrations grant what the runtime needs to ``yoke_runtime`` (their text
is fixed: each is recorded with its checksum). A database may run under a
role of its own instead (``YOKE_PG_ROLE``): ``yoke_runtime`` is one role for
the whole cluster, so every Yoke database that grants to it is open to
whoever holds its login. The grants the runtime needs are therefore read
from the migrations' ``GRANT ... TO yoke_runtime`` statements, and
``sync`` gives them to the configured role (and, for another role, takes
them from ``yoke_runtime`` in this database), in the migration lock.
``yoke migrate --print-grants`` prints the same statements.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from dataclasses import dataclass

import asyncpg

from ..schema import Migration

DEFAULT_ROLE = "yoke_runtime"
# The migrations' grants: privileges, the objects (tables, or FUNCTION and
# names) and the grantee, always yoke_runtime. 0006 grants inside a
# format() string, its schema as %I: the name alone resolves to the same
# function through the search path of a session on that database.
_GRANT = re.compile(r"GRANT\s+([A-Z, ]+?)\s+ON\s+(.+?)\s+TO\s+yoke_runtime\b", re.S)


# What the migrations took from PUBLIC (the sign-in lookup, the relay's
# channel name): taken again by sync, so that a restore without privileges
# (pg_restore --no-privileges) followed by `yoke migrate` leaves none open.
_REVOKE_PUBLIC = re.compile(r"REVOKE\s+ALL\s+ON\s+(FUNCTION\s+)?(\S+?)\s+FROM\s+PUBLIC", re.S)


def public_revokes(files: list[Migration]) -> list[tuple[str, str]]:
    """(TABLE or FUNCTION, name) of everything the migrations revoked from PUBLIC."""
    found: list[tuple[str, str]] = []
    for m in files:
        for function, name in _REVOKE_PUBLIC.findall(m.sql):
            entry = ("FUNCTION" if function else "TABLE", name.removeprefix("%I."))
            if entry not in found:
                found.append(entry)
    return found


# Whether PUBLIC holds a privilege on the object: its ACL names grantee 0,
# or a function's is NULL (the defaults: EXECUTE for PUBLIC; a table's
# defaults give PUBLIC nothing).
PUBLIC_HOLDS = """
SELECT coalesce(bool_or((acl IS NULL AND $2 = 'FUNCTION')
                        OR EXISTS (SELECT 1 FROM aclexplode(acl) a WHERE a.grantee = 0)), false)
FROM (SELECT relacl AS acl FROM pg_class WHERE oid = to_regclass($1) AND $2 = 'TABLE'
      UNION ALL SELECT proacl FROM pg_proc WHERE oid = to_regprocedure($1) AND $2 = 'FUNCTION') o
"""


@dataclass(frozen=True)
class Grant:
    privileges: tuple[str, ...]  # SELECT, INSERT, ...; EXECUTE for a function
    kind: str  # TABLE or FUNCTION
    name: str  # yoke_tenants; yoke_find_token(text)

    def sql(self, role: str, verb: str = "GRANT") -> str:
        to = "TO" if verb == "GRANT" else "FROM"
        return f"{verb} {', '.join(self.privileges)} ON {self.kind} {self.name} {to} {quote_ident(role)}"


def runtime_grants(files: list[Migration]) -> list[Grant]:
    """What the runtime is granted by the migrations, one entry per object
    (privileges merged), in the order first granted."""
    found: dict[tuple[str, str], list[str]] = {}
    for m in files:
        for privileges, objects in _GRANT.findall(m.sql):
            kind = "TABLE"
            objects = " ".join(objects.split())
            if objects.startswith("FUNCTION "):
                kind, objects = "FUNCTION", objects[len("FUNCTION "):]
            for name in objects.split(","):
                name = name.strip().removeprefix("%I.")
                held = found.setdefault((kind, name), [])
                held.extend(p.strip() for p in privileges.split(",") if p.strip() not in held)
    return [Grant(tuple(privileges), kind, name) for (kind, name), privileges in found.items()]


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def scram_verifier(password: str, iterations: int = 4096) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password``: sent
    instead of the password, which then never reaches the server's logs."""
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = lambda raw: base64.b64encode(raw).decode()  # noqa: E731
    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(hashlib.sha256(client_key).digest())}:{b64(server_key)}"


async def grant_statements(conn: asyncpg.Connection, role: str, files: list[Migration]) -> list[str]:
    """Every statement a runtime role needs on this database: CONNECT on
    it, USAGE on the schema of Yoke's tables, then the migrations' grants."""
    database, schema = await conn.fetchrow(
        "SELECT current_database(), coalesce((SELECT relnamespace::regnamespace::text FROM pg_class"
        " WHERE oid = to_regclass('yoke_schema_version')), current_schema())"
    )
    return [
        f"GRANT CONNECT ON DATABASE {quote_ident(database)} TO {quote_ident(role)}",
        f"GRANT USAGE ON SCHEMA {schema} TO {quote_ident(role)}",
        *(g.sql(role) for g in runtime_grants(files)),
    ]


async def missing(conn: asyncpg.Connection, role: str, files: list[Migration]) -> list[str]:
    """The grants ``role`` lacks on this (migrated) database, as statements."""
    grants = runtime_grants(files)
    checks = []
    for g in grants:
        for privilege in g.privileges:
            if g.kind == "TABLE":
                checks.append((g, f"has_table_privilege($1, to_regclass('{g.name}'), '{privilege}')"))
            else:
                resolve = "to_regprocedure" if "(" in g.name else "to_regproc"
                checks.append((g, f"has_function_privilege($1, {resolve}('{g.name}'), '{privilege}')"))
    held = await conn.fetchrow("SELECT " + ", ".join(sql for _, sql in checks), role)
    lacking: list[Grant] = []
    for (g, _), ok in zip(checks, held, strict=True):
        if not ok and g not in lacking:
            lacking.append(g)
    return [g.sql(role) for g in lacking]


# What yoke_runtime was granted directly on the tables and functions in the
# schema of Yoke's tables (grants through PUBLIC are not its own).
HELD_BY_DEFAULT = """
WITH yoke AS (SELECT relnamespace FROM pg_class WHERE oid = to_regclass('yoke_schema_version'))
SELECT 'TABLE', c.oid::regclass::text FROM pg_class c, aclexplode(c.relacl) a
WHERE c.relnamespace = (SELECT relnamespace FROM yoke) AND a.grantee = to_regrole($1)
UNION
SELECT 'FUNCTION', p.oid::regprocedure::text FROM pg_proc p, aclexplode(p.proacl) a
WHERE p.pronamespace = (SELECT relnamespace FROM yoke) AND a.grantee = to_regrole($1)
ORDER BY 1 DESC, 2
"""


async def role_exists(conn: asyncpg.Connection, role: str) -> bool:
    return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", role))


async def sync(
    conn: asyncpg.Connection, role: str, files: list[Migration], *, password: str = "", set_password: bool = False,
) -> list[str]:
    """Make ``role`` the runtime role of this database, as its owner: create
    it when missing (a login that cannot pass row-level security: no
    SUPERUSER, no BYPASSRLS), its password set when given and
    ``set_password`` (or when created), the grants it lacks given, and for
    a role other than ``yoke_runtime``, ``yoke_runtime``'s grants in this
    database taken back. Returns the statements run (the password as
    ``PASSWORD ***``). Run it in the migration lock: concurrent GRANTs on
    one object fail."""
    done: list[str] = []
    secret = f" PASSWORD '{scram_verifier(password)}'" if password else ""
    if not await role_exists(conn, role):
        await conn.execute(
            f"CREATE ROLE {quote_ident(role)} LOGIN NOSUPERUSER NOBYPASSRLS NOCREATEDB NOCREATEROLE{secret}"
        )
        done.append(f"CREATE ROLE {quote_ident(role)} LOGIN" + (" PASSWORD ***" if password else ""))
    elif password and set_password:
        await conn.execute(f"ALTER ROLE {quote_ident(role)}{secret}")
        done.append(f"ALTER ROLE {quote_ident(role)} PASSWORD ***")
    statements = await missing(conn, role, files)
    if role != DEFAULT_ROLE and await role_exists(conn, DEFAULT_ROLE):
        statements += [f"REVOKE ALL ON {kind} {name} FROM {DEFAULT_ROLE}"
                       for kind, name in await conn.fetch(HELD_BY_DEFAULT, DEFAULT_ROLE)]
    for kind, name in public_revokes(files):
        if await conn.fetchval(PUBLIC_HOLDS, name, kind):
            statements.append(f"REVOKE ALL ON {kind} {name} FROM PUBLIC")
    if statements:
        async with conn.transaction():
            for statement in statements:
                await conn.execute(statement)
    return done + statements
