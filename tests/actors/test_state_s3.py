"""YOKE_STORAGE=s3: per-instance SQLite databases in a bucket, against moto's
standalone S3 server run as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

import yoke
from yoke import App, Filter, errors
from yoke.actors.storage_s3 import S3Storage, StorageUnavailable
from yoke.config import Settings

from tests.http.conftest import free_port

T = "acme"
PREFIX = "yoke/"


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log, stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url + "/", timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto server did not answer in 30s") from None
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def s3(moto_endpoint: str, aws_env: None):
    return boto3.client("s3", endpoint_url=moto_endpoint)


@pytest.fixture
def bucket(s3) -> str:
    name = "yoke-test-" + uuid.uuid4().hex[:12]
    s3.create_bucket(Bucket=name)
    return name


def counter_app(dumps: list[list[dict]] | None = None) -> App:
    app = App()

    @app.actor("counter", filter=Filter(types=["inc", "dump"]))
    async def counter(ctx, event):
        if event.type == "dump":
            # ctx.sqlite from inside process(): the user table as this runtime sees it.
            assert dumps is not None
            dumps.append(await ctx.sqlite.query("SELECT n, note FROM seen ORDER BY n"))
            return
        await ctx.state.update(lambda s: {**s, "n": s.get("n", 0) + 1})
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (n INTEGER PRIMARY KEY, note TEXT)")
        await ctx.sqlite.exec("INSERT INTO seen (note) VALUES (?)", [event.payload["note"]])

    return app


def s3_options(endpoint: str, bucket: str, mode: str, data_dir: Path) -> dict[str, str]:
    return {
        "storage": "s3", "s3_bucket": bucket, "s3_endpoint_url": endpoint,
        "s3_sync": mode, "data_dir": str(data_dir),
    }


def object_db(s3, bucket: str, key: str, tmp_path: Path) -> sqlite3.Connection:
    """The uploaded object, opened as a SQLite database."""
    path = tmp_path / f"object-{uuid.uuid4().hex[:8]}.db"
    path.write_bytes(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    return sqlite3.connect(path)


def object_state(s3, bucket: str, key: str, tmp_path: Path) -> tuple[str, int] | None:
    conn = object_db(s3, bucket, key, tmp_path)
    try:
        return conn.execute("SELECT value, version FROM _yoke_state").fetchone()
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["lazy", "strict"])
async def test_state_and_tables_live_in_the_bucket(
    fresh_url: str, tmp_path: Path, s3, bucket: str, moto_endpoint: str, mode: str
) -> None:
    notes = ["one", "two", "three"]
    options = s3_options(moto_endpoint, bucket, mode, tmp_path / "data")
    async with yoke.open(fresh_url, app=counter_app(), **options) as y:
        inst = await y.instances(T).create("counter", key="k")
        await y.stream("/", T).append_many([{"type": "inc", "payload": {"note": n}} for n in notes])
        await y.wait_idle(timeout_s=10)
        assert await y.instances(T).state(inst.instance_id) == ({"n": 3}, 3)
        key = f"{PREFIX}{T}/{inst.instance_id}.db"
        if mode == "strict":
            # Every write was uploaded before it returned: the object is
            # current while the runtime is still open.
            assert object_state(s3, bucket, key, tmp_path) == ('{"n":3}', 3)
    # After shutdown the object is current in either mode (lazy: flushed).
    assert object_state(s3, bucket, key, tmp_path) == ('{"n":3}', 3)
    conn = object_db(s3, bucket, key, tmp_path)
    try:
        assert conn.execute("SELECT n, note FROM seen ORDER BY n").fetchall() == [
            (1, "one"), (2, "two"), (3, "three")
        ]
    finally:
        conn.close()

    # A new runtime with an empty cache: state and user rows come from S3,
    # and the instance keeps writing on top of them.
    cold = s3_options(moto_endpoint, bucket, mode, tmp_path / "cold")
    dumps: list[list[dict]] = []
    async with yoke.open(fresh_url, app=counter_app(dumps), **cold) as y:
        assert await y.instances(T).state(inst.instance_id) == ({"n": 3}, 3)
        await y.stream("/", T).append({"type": "dump"})
        await y.wait_idle(timeout_s=10)
        assert dumps == [[{"n": 1, "note": "one"}, {"n": 2, "note": "two"}, {"n": 3, "note": "three"}]]
        await y.stream("/", T).append({"type": "inc", "payload": {"note": "four"}})
        await y.wait_idle(timeout_s=10)
        assert await y.instances(T).state(inst.instance_id) == ({"n": 4}, 4)
    conn = object_db(s3, bucket, key, tmp_path)
    try:
        assert [r[1] for r in conn.execute("SELECT n, note FROM seen ORDER BY n")] == [
            "one", "two", "three", "four"
        ]
    finally:
        conn.close()


async def test_lazy_uploads_in_the_background_before_shutdown(
    tmp_path: Path, s3, bucket: str, moto_endpoint: str
) -> None:
    """Lazy mode does not wait for shutdown: the object shows up while the
    runtime runs (polled with a deadline)."""
    options = s3_options(moto_endpoint, bucket, "lazy", tmp_path / "data")
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=counter_app(), **options) as y:
        inst = await y.instances(T).create("counter", key="k")
        await y.stream("/", T).append({"type": "inc", "payload": {"note": "one"}})
        await y.wait_idle(timeout_s=10)
        key = f"{PREFIX}{T}/{inst.instance_id}.db"
        deadline = time.monotonic() + 10
        while True:
            found = await asyncio.to_thread(s3.list_objects_v2, Bucket=bucket, Prefix=key)
            if found.get("KeyCount"):
                state = await asyncio.to_thread(object_state, s3, bucket, key, tmp_path)
                if state == ('{"n":1}', 1):
                    break
            assert time.monotonic() < deadline, "no background upload within 10s"
            await asyncio.sleep(0.05)


async def test_unknown_bucket_is_a_clear_error(tmp_path: Path, moto_endpoint: str, aws_env: None) -> None:
    options = s3_options(moto_endpoint, "no-such-bucket-" + uuid.uuid4().hex[:8], "strict", tmp_path / "data")
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=counter_app(), **options) as y:
        inst = await y.instances(T).create("counter", key="k")
        with pytest.raises(StorageUnavailable) as info:
            await y.instances(T).state(inst.instance_id)
    assert isinstance(info.value, errors.YokeError)
    assert info.value.code == "storage_unavailable"
    assert "does not exist" in info.value.message and options["s3_bucket"] in info.value.message


async def test_missing_bucket_setting_is_invalid_input(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidInput, match="YOKE_S3_BUCKET"):
        S3Storage(Settings(storage="s3"), tmp_path)
    with pytest.raises(errors.InvalidInput, match="YOKE_S3_SYNC"):
        S3Storage(Settings(storage="s3", s3_bucket="b", s3_sync="eager"), tmp_path)


# --- S3Storage directly: coalescing and ordering ------------------------------


class Recorder:
    """Wraps the boto3 client: counts puts and the most running at once."""

    def __init__(
        self, client, events: list[str], gate: threading.Event | None = None, fail: int = 0
    ) -> None:
        self._client = client
        self.events = events
        self.gate = gate
        self.fail = fail  # the first ``fail`` puts raise
        self.puts = 0
        self.running = 0
        self.max_running = 0
        self._lock = threading.Lock()

    def put_object(self, **kwargs):
        with self._lock:
            self.puts += 1
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.events.append("put")
        try:
            if self.puts <= self.fail:
                raise ConnectionError("injected upload failure")
            if self.gate is not None:
                assert self.gate.wait(10)
            return self._client.put_object(**kwargs)
        finally:
            with self._lock:
                self.running -= 1

    def __getattr__(self, name):
        return getattr(self._client, name)


def write(storage: S3Storage, conn: sqlite3.Connection, n: int):
    conn.execute("INSERT OR REPLACE INTO _yoke_state VALUES (1, ?, ?)", (f'{{"n":{n}}}', n))
    return storage.persist(T, "ins_direct", conn)


async def test_lazy_uploads_coalesce_one_at_a_time(
    tmp_path: Path, s3, bucket: str, moto_endpoint: str
) -> None:
    settings = Settings(storage="s3", s3_bucket=bucket, s3_endpoint_url=moto_endpoint, s3_sync="lazy")
    storage = S3Storage(settings, tmp_path / "cache")
    gate = threading.Event()
    recorder = Recorder(storage._s3(), [], gate)
    storage._client = recorder
    conn = await asyncio.to_thread(storage.open, T, "ins_direct")
    # The first upload is held at the gate while 50 more writes land.
    for n in range(1, 51):
        await write(storage, conn, n)()
    deadline = time.monotonic() + 10
    while recorder.puts == 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    gate.set()
    await storage.close()
    conn.close()
    assert recorder.max_running == 1
    assert 1 <= recorder.puts <= 2  # the held one, then one for everything after it
    key = f"{PREFIX}{T}/ins_direct.db"
    assert object_state(s3, bucket, key, tmp_path) == ('{"n":50}', 50)


async def test_lazy_close_flushes_what_the_background_could_not_upload(
    tmp_path: Path, s3, bucket: str, moto_endpoint: str
) -> None:
    settings = Settings(storage="s3", s3_bucket=bucket, s3_endpoint_url=moto_endpoint, s3_sync="lazy")
    storage = S3Storage(settings, tmp_path / "cache")
    recorder = Recorder(storage._s3(), [], fail=1)
    storage._client = recorder
    conn = await asyncio.to_thread(storage.open, T, "ins_direct")
    await (await asyncio.to_thread(write, storage, conn, 7))()
    deadline = time.monotonic() + 10
    while recorder.puts == 0 or storage._inflight:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    # The background upload failed and waits for its retry; shutdown does
    # not wait for the backoff, it uploads now.
    key = f"{PREFIX}{T}/ins_direct.db"
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix=key)
    await storage.close()
    conn.close()
    assert recorder.puts == 2
    assert object_state(s3, bucket, key, tmp_path) == ('{"n":7}', 7)


async def test_strict_fsyncs_before_each_upload(
    tmp_path: Path, s3, bucket: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(storage="s3", s3_bucket=bucket, s3_endpoint_url=moto_endpoint, s3_sync="strict")
    storage = S3Storage(settings, tmp_path / "cache")
    events: list[str] = []
    recorder = Recorder(storage._s3(), events)
    storage._client = recorder
    conn = await asyncio.to_thread(storage.open, T, "ins_direct")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    monkeypatch.setattr("yoke.actors.storage_s3.os.fsync", fsync)
    key = f"{PREFIX}{T}/ins_direct.db"
    for n in (1, 2):
        events.clear()
        after = await asyncio.to_thread(write, storage, conn, n)
        await after()
        # The upload is done when the write returns, after the local fsync.
        assert events and events[-1] == "put" and "fsync" in events[: events.index("put")]
        assert object_state(s3, bucket, key, tmp_path) == (f'{{"n":{n}}}', n)
    await storage.close()
    conn.close()
