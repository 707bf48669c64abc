"""Large objects: prepare, upload, commit (one record), abort, cleanup."""

from __future__ import annotations

import hashlib

import pytest

from yoke import errors
from yoke.events import now_ms

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
    assert (await s.objects.info(o.object_id)).state == "prepared"
    await s.set_legal_hold(False)
    await y.store.cleanup_objects(now_ms() + 5_000)
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.info(o.object_id)


async def test_expired_object_cannot_be_uploaded(y, tenant):
    s = y.stream("/files", tenant=tenant)
    o = await s.objects.prepare(idempotency_key="late", sha256=DIGEST, size=len(DATA), expires_in_s=0.001)
    while now_ms() <= o.expires_at:
        pass
    with pytest.raises(errors.ObjectStateConflict):
        await s.objects.upload(o.object_id, DATA)
