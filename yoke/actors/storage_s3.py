"""``YOKE_STORAGE=s3``: per-instance SQLite databases kept in an S3 bucket.

The object ``<YOKE_S3_PREFIX><tenant>/<instance_id>.db`` is the durable
copy. SQLite runs on a local cache file (``<data dir>/s3-cache/``) that is
only for execution: opening an instance always downloads the object (or
starts empty when there is none), so a stale cache is never trusted.

Uploads are consistent snapshots: a separate read connection copies the
committed database with the backup API and the serialized image is put as
one object; a concurrent write is never half-uploaded, and an uncommitted
transaction of the instance's own connection is not included.

``YOKE_S3_SYNC``:

- ``lazy`` (default): a write marks the instance dirty and schedules a
  background upload. Uploads coalesce: at most one in flight per instance,
  and one more after it when writes happened meanwhile. A failed upload is
  retried with backoff; ``close()`` (runtime shutdown) flushes every dirty
  instance. A crash before the upload loses those writes.
- ``strict``: after each write, the local file is fsynced and then uploaded
  before the write returns; a failed upload fails the write
  (``StorageUnavailable``) and the instance stays dirty, so the next write
  or shutdown uploads it.

Credentials come from the usual AWS sources (environment, profile, role);
``YOKE_S3_ENDPOINT_URL`` points at an S3-compatible service (MinIO, moto).
Lazy mode assumes one worker writes an instance at a time and gives no
protection against a moved instance's last unflushed writes: use strict
mode when instances move between workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import importlib.util
import shutil
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import errors
from ..files import open_private, private_dir, private_file
from .state import _configure, _safe

log = logging.getLogger("yoke.actors.storage_s3")

Key = tuple[str, str]  # (tenant, instance_id)

SYNC_MODES = ("lazy", "strict")
# Lazy mode: backoff between retries of a failed background upload.
RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0
# How long open() waits for this process's previous connection to the same
# cache file to close (the instance was forgotten and is being reopened).
REOPEN_WAIT_S = 30.0
_SIDE_FILES = ("-wal", "-shm", "-journal")


class StorageUnavailable(errors.YokeError):
    """The state storage (S3) could not be read or written."""

    code = "storage_unavailable"
    http_status = 503


class _CacheConnection(sqlite3.Connection):
    """A connection that tells when it is closed, so the cache file is never
    replaced under a connection that still has it (and its WAL) open."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.closed = threading.Event()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.closed.set()


class S3Storage:
    in_store = False

    def __init__(self, settings: Any, cache_dir: Path) -> None:
        if importlib.util.find_spec("boto3") is None:  # imported when first used
            raise errors.InvalidInput(
                "YOKE_STORAGE=s3 needs boto3: pip install 'yoke[s3]'", field="storage"
            )
        if not settings.s3_bucket:
            raise errors.InvalidInput("YOKE_STORAGE=s3 needs YOKE_S3_BUCKET", field="s3_bucket")
        if settings.s3_sync not in SYNC_MODES:
            raise errors.InvalidInput(
                f"YOKE_S3_SYNC must be lazy or strict, not {settings.s3_sync!r}", field="s3_sync"
            )
        self.bucket: str = settings.s3_bucket
        self.endpoint_url: str = settings.s3_endpoint_url or ""
        self.prefix: str = settings.s3_prefix or ""
        self.strict = settings.s3_sync == "strict"
        self.cache_dir = cache_dir
        self._loop = asyncio.get_running_loop()
        self._client: Any = None
        self._client_lock = threading.Lock()
        self._conns: dict[Key, _CacheConnection] = {}
        self._conns_lock = threading.Lock()
        # Event-loop state: instances with writes not yet in S3, the
        # background upload of each (lazy), retry timers and per-instance
        # upload locks (one upload at a time, so the last put is the newest).
        self._dirty: set[Key] = set()
        self._inflight: dict[Key, asyncio.Task[None]] = {}
        self._retry: dict[Key, asyncio.TimerHandle] = {}
        self._failures: dict[Key, int] = {}
        self._upload_locks: dict[Key, asyncio.Lock] = {}
        self._closing = False

    # --- names -----------------------------------------------------------------

    def object_key(self, tenant: str, instance_id: str) -> str:
        return f"{self.prefix}{tenant}/{instance_id}.db"

    def cache_path(self, tenant: str, instance_id: str) -> Path:
        return self.cache_dir / _safe(tenant) / f"{_safe(instance_id)}.db"

    # --- StateStorage ------------------------------------------------------------

    def open(self, tenant: str, instance_id: str) -> sqlite3.Connection:
        key = (tenant, instance_id)
        self._wait_previous_closed(key)
        if key in self._dirty or key in self._inflight:
            # Writes of an earlier connection not in S3 yet: upload them
            # before the download below replaces the cache file.
            asyncio.run_coroutine_threadsafe(self._upload_dirty(key), self._loop).result()
        path = self.cache_path(tenant, instance_id)
        self._download(key, path)
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, factory=_CacheConnection)
        try:
            # WAL: the upload's read connection takes its snapshot while
            # the instance keeps writing. In lazy mode the local file is not
            # the durable copy, so commits need not be synced.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={'FULL' if self.strict else 'NORMAL'}")
            _configure(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StorageUnavailable(
                f"s3://{self.bucket}/{self.object_key(*key)} is not a usable SQLite database: {exc}"
            ) from None
        with self._conns_lock:
            self._conns[key] = conn
        return conn

    def persist(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> Callable[[], Any]:
        key = (tenant, instance_id)
        if self.strict:
            _fsync_database(self.cache_path(tenant, instance_id))

            async def upload_now() -> None:
                self._dirty.add(key)
                await self._upload_dirty(key)

            return upload_now

        async def mark_dirty() -> None:
            self._dirty.add(key)
            if self._closing:
                await self._upload_dirty(key)
            else:
                self._schedule(key)

        return mark_dirty

    def durable(self, tenant: str, instance_id: str, conn: sqlite3.Connection) -> Callable[[], Any]:
        """An atomic run's commit is uploaded before its store transaction,
        whatever the sync mode (a failed upload fails the commit)."""
        key = (tenant, instance_id)

        async def upload_now() -> None:
            self._dirty.add(key)
            await self._upload_dirty(key)

        return upload_now

    async def flush_all(self) -> None:
        """Upload every instance with writes not yet in S3; ``StorageUnavailable``
        names how many could not be uploaded (they stay dirty)."""
        for timer in self._retry.values():
            timer.cancel()
        self._retry.clear()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        keys = sorted(self._dirty)
        results = await asyncio.gather(*(self._upload_dirty(k) for k in keys), return_exceptions=True)
        failed = [(k, r) for k, r in zip(keys, results) if isinstance(r, BaseException)]
        if failed:
            (tenant, instance_id), first = failed[0]
            raise StorageUnavailable(
                f"{len(failed)} instance database(s) could not be uploaded to s3://{self.bucket}"
                f" (first: {tenant}/{instance_id}: {first})"
            )

    async def close(self) -> None:
        self._closing = True
        try:
            await self.flush_all()
        except StorageUnavailable as exc:
            log.error("state not saved on shutdown, those writes are lost: %s", exc)
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            with contextlib.suppress(Exception):
                client.close()
        # The cache is for execution only (and this process's own).
        await asyncio.to_thread(shutil.rmtree, self.cache_dir, True)

    # --- uploads (event loop) --------------------------------------------------

    def _schedule(self, key: Key) -> None:
        """Start the background upload of ``key`` unless one is running."""
        timer = self._retry.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._inflight or self._closing:
            return
        self._inflight[key] = self._loop.create_task(self._drain(key), name="yoke-s3-upload")

    async def _drain(self, key: Key) -> None:
        try:
            while key in self._dirty:
                try:
                    await self._upload_dirty(key)
                except Exception as exc:
                    failures = self._failures[key] = self._failures.get(key, 0) + 1
                    delay = min(RETRY_MAX_S, RETRY_MIN_S * 2 ** (failures - 1))
                    log.warning("upload of %s/%s failed (retry in %.1fs): %s", *key, delay, exc)
                    if not self._closing:
                        self._retry[key] = self._loop.call_later(delay, self._schedule, key)
                    return
                self._failures.pop(key, None)
        finally:
            self._inflight.pop(key, None)

    async def _upload_dirty(self, key: Key) -> None:
        """Upload ``key`` if dirty; one upload at a time per instance."""
        lock = self._upload_locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self._dirty:
                return
            # Cleared before the snapshot: a write landing after this point
            # marks the instance dirty again and gets an upload of its own.
            self._dirty.discard(key)
            try:
                await asyncio.to_thread(self._upload, key)
            except BaseException:
                self._dirty.add(key)
                raise

    # --- S3 and files (threads) --------------------------------------------------

    def _s3(self) -> Any:
        with self._client_lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                config = Config(
                    retries={"max_attempts": 3, "mode": "standard"},
                    connect_timeout=10,
                    read_timeout=60,
                    # S3-compatible services (MinIO, moto) want path-style URLs.
                    s3={"addressing_style": "path"} if self.endpoint_url else None,
                )
                self._client = boto3.session.Session().client(
                    "s3", endpoint_url=self.endpoint_url or None, config=config
                )
            return self._client

    def _upload(self, key: Key) -> None:
        data = _snapshot(self.cache_path(*key))
        object_key = self.object_key(*key)
        try:
            self._s3().put_object(Bucket=self.bucket, Key=object_key, Body=data)
        except Exception as exc:
            raise self._error(exc, "upload", object_key) from None

    def _download(self, key: Key, path: Path) -> None:
        """Replace the cache file with the object, or remove it when there is none."""
        object_key = self.object_key(*key)
        try:
            try:
                response = self._s3().get_object(Bucket=self.bucket, Key=object_key)
                data = response["Body"].read()
            except Exception as exc:
                if _error_code(exc) in ("NoSuchKey", "404"):
                    data = None
                else:
                    raise
        except Exception as exc:
            raise self._error(exc, "download", object_key) from None
        private_dir(path.parent)
        for suffix in _SIDE_FILES:
            _unlink(Path(f"{path}{suffix}"))
        if data is None:
            _unlink(path)
            private_file(path)  # a new database: 0600, and so its -wal and -shm
            return
        tmp = path.with_name(path.name + ".download")
        with open_private(tmp) as f:
            f.write(data)
            if self.strict:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if self.strict:
            _fsync_dir(path.parent)

    def _wait_previous_closed(self, key: Key) -> None:
        with self._conns_lock:
            previous = self._conns.pop(key, None)
        if previous is not None and not previous.closed.wait(REOPEN_WAIT_S):
            raise StorageUnavailable(
                f"the previous connection to {key[0]}/{key[1]} was not closed after {REOPEN_WAIT_S}s"
            )

    def _error(self, exc: Exception, action: str, object_key: str) -> StorageUnavailable:
        where = f"s3://{self.bucket}/{object_key}"
        code = _error_code(exc)
        name = type(exc).__name__
        if code == "NoSuchBucket":
            message = f"S3 bucket {self.bucket!r} does not exist (YOKE_S3_BUCKET)"
        elif code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
            message = f"S3 {action} of {where} was denied ({code}): check the AWS credentials"
        elif name in ("NoCredentialsError", "PartialCredentialsError"):
            message = f"S3 {action} of {where}: no AWS credentials ({exc})"
        elif name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError"):
            message = f"S3 {action} of {where}: cannot reach S3 ({exc})"
        else:
            message = f"S3 {action} of {where} failed: {code or name}: {exc}"
        return StorageUnavailable(message)


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _snapshot(path: Path) -> bytes:
    """The committed database as one image: the backup API on a connection
    of its own (a consistent read, whatever the writer is doing)."""
    src = sqlite3.connect(path, check_same_thread=False)
    try:
        dst = sqlite3.connect(":memory:")
        try:
            src.backup(dst)
            return dst.serialize()
        finally:
            dst.close()
    finally:
        src.close()


def _fsync_database(path: Path) -> None:
    """Make the committed state of the local file durable (the database and,
    in WAL mode, the log that holds the latest commits)."""
    for p in (path, Path(f"{path}-wal")):
        try:
            fd = os.open(p, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_dir(path: Path) -> None:
    if os.name != "posix":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
