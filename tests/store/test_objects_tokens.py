"""Large objects and tokens on both drivers."""

from __future__ import annotations

import hashlib

import pytest

from yoke import errors
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.results import TokenInfo

from .conftest import commit, new_id

DATA = b"the object's bytes"
SHA = hashlib.sha256(DATA).hexdigest()


async def prepared(store, tenant, path, key="k", expires_at=None):
    now = now_ms()
    return await store.prepare_object(
        tenant, path, new_id("obj_"), key, SHA, len(DATA), "text/plain", now,
        expires_at if expires_at is not None else now + 60_000, new_id(),
    )


def record(object_id: str):
    event = prepare({"type": "file", "idempotency_key": f"object:{object_id}"}, kernel_key=True)
    event.object_id = object_id
    return event


async def test_prepare_upload_commit(store, tenant):
    info = await prepared(store, tenant, "/o")
    assert (info.state, info.size, info.sha256, info.committed_offset) == ("prepared", len(DATA), SHA, None)
    again = await prepared(store, tenant, "/o")  # the same key: the same intent
    assert again.object_id == info.object_id
    # not uploaded: its record is refused
    assert [o.status for o in (await commit(store, tenant, "/o", [record(info.object_id)])).outcomes] == ["object"]
    with pytest.raises(errors.ObjectMismatch):
        await store.upload_object(tenant, "/o", info.object_id, b"other bytes")
    uploaded = await store.upload_object(tenant, "/o", info.object_id, DATA)
    assert uploaded.state == "uploaded"
    assert await store.object_data(tenant, "/o", info.object_id) is None  # not committed yet
    (o,) = (await commit(store, tenant, "/o", [record(info.object_id)])).outcomes
    assert o.status == "ok"
    committed = await store.object_info(tenant, "/o", info.object_id)
    assert (committed.state, committed.committed_offset) == ("committed", o.offset)
    assert await store.object_data(tenant, "/o", info.object_id) == DATA
    (dup,) = (await commit(store, tenant, "/o", [record(info.object_id)])).outcomes
    assert (dup.status, dup.offset) == ("duplicate", o.offset)


async def test_missing_objects(store, tenant):
    await commit(store, tenant, "/o", [prepare({"type": "e"})])
    with pytest.raises(errors.ObjectNotFound):
        await store.upload_object(tenant, "/o", "obj_missing", DATA)
    assert await store.object_info(tenant, "/o", "obj_missing") is None
    assert await store.abort_object(tenant, "/o", "obj_missing") is None


async def test_abort_and_cleanup(store, tenant):
    aborted = await prepared(store, tenant, "/o", "a")
    assert (await store.abort_object(tenant, "/o", aborted.object_id)).state == "aborted"
    expired = await prepared(store, tenant, "/o", "b", expires_at=now_ms() - 1)
    kept = await prepared(store, tenant, "/o", "c")
    assert await store.cleanup_objects(now_ms()) >= 2
    assert await store.object_info(tenant, "/o", aborted.object_id) is None
    assert await store.object_info(tenant, "/o", expired.object_id) is None
    assert (await store.object_info(tenant, "/o", kept.object_id)).state == "prepared"
    assert await store.pending_deletions() >= 0


async def test_a_closed_stream_takes_no_new_intent(store, tenant):
    await commit(store, tenant, "/o", [prepare({"type": "e"})])
    await store.update_stream(tenant, "/o", closed=True)
    with pytest.raises(errors.StreamClosed):
        await prepared(store, tenant, "/o")


async def test_tokens(store, tenant):
    token = TokenInfo(new_id("tok_"), tenant, "ci", ("read", "append"), "hash", now_ms(), None, None)
    await store.create_token(token)
    assert await store.find_token(token.token_id) == token
    assert await store.find_token("tok_missing") is None
    assert [t.token_id for t in await store.list_tokens(tenant)] == [token.token_id]
    assert await store.list_tokens(new_id("t")) == []
    assert await store.revoke_token(tenant, token.token_id, 1234)
    assert (await store.find_token(token.token_id)).revoked_at == 1234
    assert not await store.revoke_token(new_id("t"), token.token_id, 1)
    expiring = TokenInfo(new_id("tok_"), tenant, "short", ("read",), "h2", now_ms(), None, now_ms() + 1000)
    await store.create_token(expiring)
    assert (await store.find_token(expiring.token_id)).expires_at == expiring.expires_at
