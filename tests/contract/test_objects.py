"""Large objects: prepare, upload, commit (one record), abort, cleanup."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from yoke import errors
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.contract import ObjectInfo
from yoke.streams.append import new_stream_id
from yoke.streams.objects import object_reference

DATA = b"large payload " * 1000
DIGEST = hashlib.sha256(DATA).hexdigest()


async def test_prepare_upload_commit(y, tenant):
    s = y.stream("/files", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="upload-1", sha256=DIGEST, size=len(DATA), content_type="text/plain")
    assert o.state == "prepared" and o.object_id.startswith("obj_")
    # The same key returns the same object; a different object under it conflicts.
    assert (await s.objects.prepare(idempotency_key="upload-1", sha256=DIGEST, size=len(DATA), content_type="text/plain")).object_id == o.object_id
    with pytest.raises(errors.IdempotencyConflict):
        await s.objects.prepare(idempotency_key="upload-1", sha256=DIGEST, size=1)
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.commit(o.object_id)  # not uploaded yet
    assert (await s.objects.upload(o.object_id, DATA)).state == "uploaded"
    assert await s.read() == []  # nothing visible before commit
    r = await s.objects.commit(o.object_id, type="report.ready", payload={"name": "r.txt"})
    event = await s.get(r.offset)
    assert event.type == "report.ready"
    assert event.payload == {
        "name": "r.txt",
        "object": {"object_id": o.object_id, "sha256": DIGEST, "size": len(DATA), "content_type": "text/plain"},
    }
    info = await s.objects.info(o.object_id)
    assert (info.state, info.committed_offset) == ("committed", r.offset)
    assert await s.objects.data(o.object_id) == DATA
    # Committing again returns the original offset and appends nothing.
    assert await s.objects.commit(o.object_id, type="report.ready", payload={"name": "r.txt"}) == r
    assert len(await s.read()) == 1
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.abort(o.object_id)


async def test_upload_must_match_digest_and_size(y, tenant):
    s = y.stream("/files", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="k", sha256=DIGEST, size=len(DATA))
    with pytest.raises(errors.ObjectMismatch) as exc:
        await s.objects.upload(o.object_id, DATA + b"!")
    assert exc.value.http_status == 422
    assert (await s.objects.info(o.object_id)).state == "prepared"


async def test_limits_and_validation(y, tenant):
    s = y.stream("/files", tenant=tenant)
    with pytest.raises(errors.ObjectTooLarge) as exc:
        await s.objects.prepare(idempotency_key="big", sha256=DIGEST, size=32 * 1024 * 1024 + 1)
    assert exc.value.http_status == 413
    with pytest.raises(errors.InvalidInput):
        await s.objects.prepare(idempotency_key="x", sha256="nothex", size=1)
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.info("obj_missing")
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.upload("obj_missing", b"")


async def test_abort_and_cleanup(y, tenant):
    s = y.stream("/files", tenant=tenant)
    aborted = await s.objects.prepare(idempotency_key="a", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(aborted.object_id, DATA)
    assert (await s.objects.abort(aborted.object_id)).state == "aborted"
    expiring = await s.objects.prepare(idempotency_key="b", sha256=DIGEST, size=len(DATA), expires_in_s=1)
    kept = await s.objects.prepare(idempotency_key="c", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(kept.object_id, DATA)
    committed = await s.objects.commit(kept.object_id)
    await y.store.cleanup_objects(now_ms() + 5_000)
    for gone in (aborted, expiring):
        with pytest.raises(errors.ObjectNotFound):
            await s.objects.info(gone.object_id)
    assert (await s.objects.info(kept.object_id)).committed_offset == committed.offset
    assert await s.objects.data(kept.object_id) == DATA


async def test_legal_hold_prevents_object_deletion(y, tenant):
    s = y.stream("/held-files", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="h", sha256=DIGEST, size=len(DATA), expires_in_s=1)
    await s.set_legal_hold(True)
    await y.store.cleanup_objects(now_ms() + 5_000)
    assert (await y.store.object_info(tenant, "/held-files", o.object_id)).state == "prepared"
    await s.set_legal_hold(False)
    await y.store.cleanup_objects(now_ms() + 5_000)
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.info(o.object_id)


async def test_expired_object_cannot_be_uploaded(y, tenant):
    s = y.stream("/files", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="late", sha256=DIGEST, size=len(DATA), expires_in_s=1)
    await until_expired(o)
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.upload(o.object_id, DATA)


async def until_expired(info: ObjectInfo) -> None:
    """Wait for the wall clock to pass the object's expiry (the condition under test)."""
    while now_ms() <= info.expires_at:
        await asyncio.sleep(0.02)


def object_record(info: ObjectInfo, **fields) -> dict:
    """The record a bare commit of ``info`` appends (same fingerprint)."""
    return {
        "type": "object.committed",
        "payload": {"object": object_reference(info)},
        "idempotency_key": f"object:{info.object_id}",
        **fields,
    }


async def test_a_record_holding_the_object_key_does_not_commit_the_object(y, tenant):
    """The squat: a record with the object's key (and the very body a commit
    would append) that did not commit the object. Users cannot write such a
    key any more (reserved_idempotency_key); should one exist, commit must
    not report its offset as success while the object stays uncommitted."""
    s = y.stream("/squat", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="sq", sha256=DIGEST, size=len(DATA))
    with pytest.raises(errors.ReservedIdempotencyKey):
        await s.append(object_record(o))
    squat = (await s._append([object_record(o)], trusted=False, kernel_key=True))[0]  # no object binding
    await s.objects.upload(o.object_id, DATA)
    with pytest.raises(errors.ObjectStateConflict) as exc:
        await s.objects.commit(o.object_id)
    assert exc.value.code == "object_state" and exc.value.details["state"] == "uploaded"
    info = await s.objects.info(o.object_id)
    assert (info.state, info.committed_offset) == ("uploaded", None)
    assert [e.offset for e in await s.read()] == [squat.offset]
    # The store itself refuses the duplicate: the record its key found did not commit the object.
    event = prepare(object_record(o), kernel_key=True)
    event.object_id = o.object_id
    result = await y.store.commit(tenant, "/squat", [event], [0], now_ms(), new_stream_id())
    assert [x.status for x in result.outcomes] == ["object"]


async def test_the_append_binds_only_an_unexpired_uploaded_object(y, tenant):
    """The store checks expiry with the commit's own clock, in the append transaction."""
    s = y.stream("/bind", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="b", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(o.object_id, DATA)
    event = prepare(object_record(o), kernel_key=True)
    event.object_id = o.object_id
    late = await y.store.commit(tenant, "/bind", [event], [0], o.expires_at + 1, new_stream_id())
    assert [x.status for x in late.outcomes] == ["object"] and late.head == 0
    on_time = await y.store.commit(tenant, "/bind", [event], [0], o.expires_at, new_stream_id())
    assert [(x.status, x.offset) for x in on_time.outcomes] == [("ok", 1)]
    info = await y.store.object_info(tenant, "/bind", o.object_id)
    assert (info.state, info.committed_offset) == ("committed", 1)
    # Now a duplicate: it counts, because this record committed the object.
    again = await y.store.commit(tenant, "/bind", [event], [0], o.expires_at + 1, new_stream_id())
    assert [(x.status, x.offset) for x in again.outcomes] == [("duplicate", 1)]


async def test_bytes_are_served_only_after_commit(y, tenant):
    s = y.stream("/bytes", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="d", sha256=DIGEST, size=len(DATA))
    for state in ("prepared", "uploaded"):
        if state == "uploaded":
            await s.objects.upload(o.object_id, DATA)
        with pytest.raises(errors.ObjectNotCommitted) as exc:
            await s.objects.data(o.object_id)
        assert (exc.value.code, exc.value.http_status) == ("object_not_committed", 409)
        assert exc.value.details["state"] == state
        assert await y.store.object_data(tenant, "/bytes", o.object_id) is None
    await s.objects.commit(o.object_id)
    assert await s.objects.data(o.object_id) == DATA


async def test_duplicate_commit_returns_the_original_whatever_its_body(y, tenant):
    s = y.stream("/dup", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="c", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(o.object_id, DATA)
    first = await s.objects.commit(o.object_id, type="doc.ready", payload={"name": "a.pdf"})
    assert await s.objects.commit(o.object_id) == first  # no body
    assert await s.objects.commit(o.object_id, type="doc.ready", payload={"name": "a.pdf"}) == first
    assert await s.objects.commit(o.object_id, type="other", metadata={"m": 1}) == first
    with pytest.raises(errors.InvalidInput):  # invalid input is still invalid
        await s.objects.commit(o.object_id, payload=[1])
    # A retry on the stream once closed still gets the original.
    await s.close()
    assert await s.objects.commit(o.object_id) == first
    records = await s.read()
    assert [(e.offset, e.type, e.payload["name"]) for e in records] == [(first.offset, "doc.ready", "a.pdf")]


async def test_concurrent_commits_with_different_bodies_share_one_record(y, tenant):
    s = y.stream("/race", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="r", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(o.object_id, DATA)
    results = await asyncio.gather(*(s.objects.commit(o.object_id, payload={"n": i}) for i in range(5)))
    assert len(set(results)) == 1
    assert [e.offset for e in await s.read()] == [results[0].offset]


async def test_an_object_is_never_born_expired(y, tenant):
    s = y.stream("/born", tenant=tenant)
    for too_short in (0, 1e-300, 0.5, -1):
        with pytest.raises(errors.InvalidInput) as exc:
            await s.objects.prepare(idempotency_key="k", sha256=DIGEST, size=len(DATA), expires_in_s=too_short)
        assert exc.value.details["field"] == "expires_in_s"


async def test_an_expired_prepared_object_reports_expired(y, tenant):
    s = y.stream("/expiry", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="e", sha256=DIGEST, size=len(DATA), expires_in_s=1)
    await until_expired(o)
    assert (await s.objects.info(o.object_id)).state == "expired"
    # The same key finds the same, expired object (a new upload needs a new key).
    again = await s.objects.prepare(idempotency_key="e", sha256=DIGEST, size=len(DATA))
    assert (again.object_id, again.state) == (o.object_id, "expired")
    with pytest.raises(errors.ObjectStateConflict) as exc:
        await s.objects.commit(o.object_id)
    assert exc.value.details["state"] == "expired"


async def test_an_expired_object_cannot_be_committed_even_under_legal_hold(y, tenant):
    s = y.stream("/held", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="h", sha256=DIGEST, size=len(DATA), expires_in_s=1)
    await s.set_legal_hold(True)
    assert (await s.objects.upload(o.object_id, DATA)).state == "uploaded"
    await until_expired(o)
    assert (await s.objects.info(o.object_id)).state == "expired"
    for step in (s.objects.commit(o.object_id), s.objects.upload(o.object_id, DATA)):
        with pytest.raises(errors.ObjectStateConflict) as exc:
            await step
        assert (exc.value.code, exc.value.details["state"]) == ("object_state", "expired")
    with pytest.raises(errors.ObjectNotCommitted):
        await s.objects.data(o.object_id)
    assert await s.read() == []
    # The hold only stops the cleanup from deleting it.
    await y.store.cleanup_objects(now_ms())
    assert (await s.objects.info(o.object_id)).state == "expired"
    await s.set_legal_hold(False)
    await y.store.cleanup_objects(now_ms())
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.info(o.object_id)


async def test_a_closed_stream_refuses_prepare_and_upload(y, tenant):
    s = y.stream("/closing", tenant=tenant)
    pending = await s.objects.prepare(idempotency_key="p", sha256=DIGEST, size=len(DATA))
    done = await s.objects.prepare(idempotency_key="d", sha256=DIGEST, size=len(DATA))
    await s.objects.upload(done.object_id, DATA)
    committed = await s.objects.commit(done.object_id)
    await s.close()
    with pytest.raises(errors.StreamClosed) as exc:
        await s.objects.prepare(idempotency_key="new", sha256=DIGEST, size=len(DATA))
    assert (exc.value.code, exc.value.http_status) == ("stream_closed", 409)
    with pytest.raises(errors.StreamClosed):
        await s.objects.upload(pending.object_id, DATA)
    assert (await s.objects.info(pending.object_id)).state == "prepared"
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.commit(pending.object_id)  # never uploaded
    # Retries of a finished flow get what they got before.
    assert (await s.objects.prepare(idempotency_key="d", sha256=DIGEST, size=len(DATA))).object_id == done.object_id
    assert (await s.objects.upload(done.object_id, DATA)).state == "committed"
    assert await s.objects.commit(done.object_id) == committed
