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
