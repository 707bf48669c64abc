"""API tokens: hashed, tenant-bound, scoped, revocable."""

from __future__ import annotations

import pytest

from yoke import errors


async def test_create_authenticate_revoke(y, tenant):
    new = await y.tokens.create(tenant, ["read", "append"], name="ci")
    assert new.token.startswith("yk_tok_")
    info = await y.tokens.authenticate(new.token)
    assert (info.tenant, info.scopes, info.name) == (tenant, ("read", "append"), "ci")
    assert new.token.split(".")[1] not in info.secret_hash  # only a hash is stored
    assert [t.token_id for t in await y.tokens.list(tenant)] == [info.token_id]
    assert await y.tokens.list(tenant + "x") == []
    assert not await y.tokens.revoke(tenant + "x", info.token_id)  # another tenant cannot
    assert await y.tokens.revoke(tenant, info.token_id)
    with pytest.raises(errors.Unauthorized) as exc:
        await y.tokens.authenticate(new.token)
    assert exc.value.http_status == 401


@pytest.mark.parametrize("bearer", [None, "", "garbage", "yk_tok_0000000000000000." + "a" * 43])
async def test_bad_tokens_are_unauthorized(y, bearer):
    with pytest.raises(errors.Unauthorized):
        await y.tokens.authenticate(bearer)


async def test_wrong_secret_is_unauthorized(y, tenant):
    new = await y.tokens.create(tenant, ["read"])
    token_id, secret = new.token.split(".")
    wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    with pytest.raises(errors.Unauthorized):
        await y.tokens.authenticate(f"{token_id}.{wrong}")


async def test_scopes_are_checked(y, tenant):
    with pytest.raises(errors.InvalidInput):
        await y.tokens.create(tenant, ["root"])
    with pytest.raises(errors.InvalidInput):
        await y.tokens.create(tenant, [])


# --- PostgreSQL: the sign-in lookup is the only cross-tenant read ----------------


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_naming_a_token_id_opens_no_side_door(db_url, tenant):
    """As the runtime role, a transaction that sets ``yoke.token_id`` to
    another tenant's token id (with its own tenant, or none) can neither
    read, revoke nor delete that token; sign-in still finds it."""
    import yoke

    other = tenant + "-b"
    async with yoke.open(db_url) as y:
        theirs = await y.tokens.create(other, ["read"], name="theirs")
        token_id = (await y.tokens.authenticate(theirs.token)).token_id
        async with y.store.pool.acquire() as conn:
            assert await conn.fetchval("SELECT session_user") == "yoke_runtime"
            for own_tenant in (tenant, None):
                async with conn.transaction():
                    if own_tenant is not None:
                        await conn.execute("SELECT set_config('yoke.tenant', $1, true)", own_tenant)
                    await conn.execute("SELECT set_config('yoke.token_id', $1, true)", token_id)
                    assert await conn.fetchval("SELECT count(*) FROM tokens WHERE token_id=$1", token_id) == 0
                    assert await conn.fetchval("SELECT count(*) FROM tokens") == 0
                    assert await conn.execute(
                        "UPDATE tokens SET revoked_at = 1 WHERE token_id=$1", token_id
                    ) == "UPDATE 0"
                    assert await conn.execute("DELETE FROM tokens WHERE token_id=$1", token_id) == "DELETE 0"
                    assert await conn.execute("DELETE FROM tokens") == "DELETE 0"
            # The lookup function returns that one row, read-only, to anyone
            # holding the id (useless without the secret).
            rows = await conn.fetch("SELECT * FROM yoke_find_token($1)", token_id)
            assert [(r["token_id"], r["tenant_id"]) for r in rows] == [(token_id, other)]
            assert await conn.fetch("SELECT * FROM yoke_find_token($1)", "tok_nosuchtoken") == []
        # Nothing changed, and sign-in works.
        info = await y.tokens.authenticate(theirs.token)
        assert (info.tenant, info.revoked_at) == (other, None)
        assert [t.token_id for t in await y.tokens.list(other)] == [token_id]
        assert not await y.tokens.revoke(tenant, token_id)
        assert await y.tokens.revoke(other, token_id)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_token_lookup_function_is_definer_with_a_safe_search_path(db_url, tenant):
    import yoke

    async with yoke.open(db_url) as y:
        theirs = await y.tokens.create(tenant, ["read"])
        token_id = (await y.tokens.authenticate(theirs.token)).token_id
        async with y.store.pool.acquire() as conn:
            definer, config = await conn.fetchrow(
                "SELECT prosecdef, proconfig FROM pg_proc WHERE proname = 'yoke_find_token'"
            )
            assert definer and config == ["search_path=pg_catalog, pg_temp"]
            # A temporary table of the caller's named like the real one
            # shadows nothing inside the function.
            async with conn.transaction():
                await conn.execute(
                    "CREATE TEMP TABLE tokens (token_id text, tenant_id text, name text, scopes text[],"
                    " secret_hash text, created_at bigint, revoked_at bigint) ON COMMIT DROP"
                )
                await conn.execute(
                    "INSERT INTO pg_temp.tokens VALUES ('tok_forged', $1, 'x', '{admin}', 'h', 0, NULL)",
                    tenant,
                )
                assert await conn.fetch("SELECT * FROM yoke_find_token('tok_forged')") == []
                rows = await conn.fetch("SELECT * FROM yoke_find_token($1)", token_id)
                assert [r["tenant_id"] for r in rows] == [tenant]


async def test_sign_in_with_a_non_superuser_owner(tenant):
    """Migrations applied by a login that owns the database but is neither
    superuser nor BYPASSRLS (FORCE'd row-level security applies to it):
    the lookup function still finds the token, and the runtime role still
    sees no other tenant's tokens."""
    import uuid

    import asyncpg

    import yoke
    from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
    from yoke.store.postgres.store import with_user

    owner, database = f"yoke_owner_{uuid.uuid4().hex[:8]}", f"yoke_own_{uuid.uuid4().hex[:8]}"
    await admin_sql(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER NOBYPASSRLS')
    await admin_sql(f'CREATE DATABASE "{database}" OWNER "{owner}"')
    url = with_database(PG_ADMIN_URL, database)
    try:
        async with yoke.open(
            with_user(url, owner), pg_runtime_url=with_user(url, "yoke_runtime"), executor=False
        ) as y:
            mine = await y.tokens.create(tenant, ["read"])
            theirs = await y.tokens.create(tenant + "-b", ["read"])
            assert (await y.tokens.authenticate(mine.token)).tenant == tenant
            assert (await y.tokens.authenticate(theirs.token)).tenant == tenant + "-b"
            async with y.store.pool.acquire() as conn:
                assert await conn.fetchval("SELECT session_user") == "yoke_runtime"
                async with conn.transaction():
                    await conn.execute("SELECT set_config('yoke.tenant', $1, true)", tenant)
                    assert await conn.fetchval("SELECT count(*) FROM tokens") == 1
        conn = await asyncpg.connect(with_user(url, owner))
        try:
            assert await conn.fetchval(
                "SELECT relowner::regrole::text FROM pg_class WHERE relname = 'tokens'"
            ) == owner
            # The owner reads through a SELECT policy of its own; the runtime has none.
            policies = await conn.fetch(
                "SELECT policyname, cmd, roles::text[] FROM pg_policies WHERE tablename = 'tokens'"
                " ORDER BY policyname"
            )
            assert [tuple(p) for p in policies] == [
                ("tenant_isolation", "ALL", ["public"]), ("token_lookup", "SELECT", [owner])
            ]
        finally:
            await conn.close()
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin_sql(f'DROP ROLE IF EXISTS "{owner}"')


async def test_a_non_superuser_owner_login_never_runs_the_runtime(tenant):
    """The default deployment of a managed database: migrations and the
    server run with one login that owns the database, is not a superuser
    and has no BYPASSRLS (CREATEROLE, as creating ``yoke_runtime`` needs).
    FORCE'd row-level security binds that owner, but the migrations give it
    a SELECT policy on tokens (for ``yoke_find_token``), and an owner can
    switch row-level security off: the runtime must hand over to
    ``yoke_runtime``, with no setting, so that its own pool (and a raw
    connection as the runtime role) sees, revokes and deletes no token of
    another tenant, while sign-in still works."""
    import uuid

    import asyncpg

    import yoke
    from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
    from yoke.store.postgres.store import with_user

    owner, database = f"rv_owner_{uuid.uuid4().hex[:8]}", f"yoke_own_{uuid.uuid4().hex[:8]}"
    await admin_sql(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER NOBYPASSRLS CREATEROLE')
    await admin_sql(f'CREATE DATABASE "{database}" OWNER "{owner}"')
    url = with_database(PG_ADMIN_URL, database)
    other = tenant + "-b"
    try:
        async with yoke.open(with_user(url, owner), executor=False) as y:
            mine = await y.tokens.create(tenant, ["read"])
            theirs = await y.tokens.create(other, ["read"])
            their_id = (await y.tokens.authenticate(theirs.token)).token_id
            assert (await y.tokens.authenticate(mine.token)).tenant == tenant
            raw = await asyncpg.connect(with_user(url, "yoke_runtime"))
            try:
                async with y.store.pool.acquire() as pooled:
                    for conn in (pooled, raw):
                        assert await conn.fetchval("SELECT session_user") == "yoke_runtime"
                        for own_tenant in (None, tenant):
                            async with conn.transaction():
                                if own_tenant is not None:
                                    await conn.execute(
                                        "SELECT set_config('yoke.tenant', $1, true)", own_tenant
                                    )
                                rows = await conn.fetch("SELECT tenant_id, secret_hash FROM tokens")
                                expected = [] if own_tenant is None else [tenant]
                                assert [r["tenant_id"] for r in rows] == expected
                                assert await conn.execute(
                                    "UPDATE tokens SET revoked_at = 1 WHERE token_id = $1", their_id
                                ) == "UPDATE 0"
                                assert await conn.execute(
                                    "DELETE FROM tokens WHERE tenant_id <> $1", tenant
                                ) == "DELETE 0"
                                assert await conn.execute(
                                    "UPDATE tokens SET revoked_at = 1 WHERE tenant_id <> $1", tenant
                                ) == "UPDATE 0"
                        # and it cannot turn row-level security off
                        with pytest.raises(asyncpg.InsufficientPrivilegeError):
                            await conn.execute("ALTER TABLE tokens NO FORCE ROW LEVEL SECURITY")
            finally:
                await raw.close()
            # Nothing changed; sign-in still works for both tenants.
            info = await y.tokens.authenticate(theirs.token)
            assert (info.tenant, info.revoked_at) == (other, None)
            assert (await y.tokens.authenticate(mine.token)).tenant == tenant
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin_sql(f'DROP ROLE IF EXISTS "{owner}"')


async def test_a_runtime_login_that_owns_the_tables_is_refused(tenant):
    """A runtime URL naming the tables' owner, or a login that is a member of
    the owner role, is refused at start with a clear error; a runtime URL
    naming yoke_runtime is accepted; so is a plain login on a database
    migrated before (it owns nothing: it runs the pool itself)."""
    import uuid

    import yoke
    from tests.conftest import PG_ADMIN_URL, admin_sql, with_database
    from yoke import errors
    from yoke.store.postgres.store import with_user

    suffix = uuid.uuid4().hex[:8]
    owner, member, app = f"rv_owner_{suffix}", f"rv_member_{suffix}", f"rv_app_{suffix}"
    database = f"yoke_own_{suffix}"
    await admin_sql(f'CREATE ROLE "{owner}" LOGIN NOSUPERUSER NOBYPASSRLS CREATEROLE')
    await admin_sql(f'CREATE ROLE "{member}" LOGIN NOSUPERUSER NOBYPASSRLS NOINHERIT IN ROLE "{owner}"')
    await admin_sql(f'CREATE DATABASE "{database}" OWNER "{owner}"')
    url = with_database(PG_ADMIN_URL, database)
    try:
        for login in (owner, member):
            with pytest.raises(errors.YokeError) as caught:
                async with yoke.open(with_user(url, owner), pg_runtime_url=with_user(url, login),
                                     executor=False):
                    pass
            assert "row-level security" in caught.value.message
            assert "owns (or is a member of the owner of) the tables" in caught.value.message
            assert "tokens" in caught.value.message
        with pytest.raises(errors.YokeError) as caught:
            async with yoke.open(with_user(url, owner), pg_runtime_url=url, executor=False):
                pass
        assert "superuser or has BYPASSRLS" in caught.value.message
        async with yoke.open(with_user(url, owner), pg_runtime_url=with_user(url, "yoke_runtime"),
                             executor=False) as y:
            async with y.store.pool.acquire() as conn:
                assert await conn.fetchval("SELECT session_user") == "yoke_runtime"
        # A login of the application's own, granted the runtime role's rights
        # (it owns nothing), on a database migrated before: no hand-over.
        await admin_sql(f'CREATE ROLE "{app}" LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE yoke_runtime')
        async with yoke.open(with_user(url, app), executor=False) as y:
            async with y.store.pool.acquire() as conn:
                assert await conn.fetchval("SELECT session_user") == app
            token = await y.tokens.create(tenant, ["read"])
            assert (await y.tokens.authenticate(token.token)).tenant == tenant
    finally:
        await admin_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin_sql(f'DROP ROLE IF EXISTS "{member}"')
        await admin_sql(f'DROP ROLE IF EXISTS "{app}"')
        await admin_sql(f'DROP ROLE IF EXISTS "{owner}"')


# --- expiry ----------------------------------------------------------------------------


async def test_tokens_expire_and_say_so_only_to_their_holder(y, tenant):
    import hashlib
    import secrets

    from tests.conftest import now_ms
    from yoke.store.contract import TokenInfo

    new = await y.tokens.create(tenant, ["read"], name="short", expires_in_s=3600)
    info = await y.tokens.authenticate(new.token)
    assert info.expires_at == info.created_at + 3_600_000
    assert [t.to_dict()["expires_at"] for t in await y.tokens.list(tenant)] == [info.expires_at]
    assert (await y.tokens.authenticate((await y.tokens.create(tenant, ["read"])).token)).expires_at is None

    # A token whose expiry has passed, as it is stored: refused with its own code.
    secret = secrets.token_urlsafe(32)
    token_id = "tok_" + secrets.token_hex(8)
    await y.store.create_token(TokenInfo(
        token_id, tenant, "old", ("read",), hashlib.sha256(secret.encode()).hexdigest(), now_ms() - 60_000, None,
        expires_at=now_ms() - 1,
    ))
    with pytest.raises(errors.TokenExpired) as exc:
        await y.tokens.authenticate(f"yk_{token_id}.{secret}")
    assert (exc.value.code, exc.value.http_status, exc.value.details["token_id"]) == ("token_expired", 401, token_id)
    # Without the secret nothing tells an expired token from an unknown one.
    wrong = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    with pytest.raises(errors.Unauthorized) as exc:
        await y.tokens.authenticate(f"yk_{token_id}.{wrong}")
    assert exc.value.code == "unauthorized"


@pytest.mark.parametrize("bad", [0, -5, 1.5, True, "30d", 11 * 366 * 86400])
async def test_an_expiry_is_whole_seconds_up_to_ten_years(y, tenant, bad):
    with pytest.raises(errors.InvalidInput):
        await y.tokens.create(tenant, ["read"], expires_in_s=bad)
