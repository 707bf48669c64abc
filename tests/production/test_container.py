"""Yoke's container image (Containerfile, docs/production/deploy.md), built
and run with podman as an operator would: on a base made here from Debian's
packages (the public base images cannot be pulled on this machine), the
wheel and its dependencies installed offline from a folder of wheels
(`make image` makes the same folder). It serves as a non-root user, keeps
its SQLite data in a volume (a new container on the volume has the events),
takes YOKE_* settings (PostgreSQL, two server processes), and drains on
SIGTERM: a run in progress finishes, an SSE tail ends, the exit is clean.

podman, runc and mmdebstrap come from Debian (`make podman`, part of
`make test`); without them the tests are skipped, saying so. podman runs
with runc and explicit ulimits: crun refuses this machine's hybrid cgroups,
and runc cannot raise a limit above the caller's."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.http.conftest import free_port
from tests.production.building import building_the_checkout

ROOT = Path(__file__).resolve().parents[2]
APP_DIR = Path(__file__).parent / "container"
BASE = "localhost/yoke-test-base:bookworm"
RUN = ["--runtime", "runc", "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=1024:1024"]

pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("podman", "runc", "mmdebstrap")),
    reason="needs podman, runc and mmdebstrap (Debian packages; make test installs them)",
)


def podman(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Yoke's image on a base of Debian bookworm's python3 (made once per machine)."""
    work = tmp_path_factory.mktemp("image")
    if podman("image", "exists", BASE, check=False).returncode != 0:
        rootfs = work / "rootfs.tar"
        subprocess.run(["mmdebstrap", "--variant=minbase", "--include=python3,python3-venv", "bookworm", str(rootfs)],
                       check=True, capture_output=True, timeout=900)
        podman("import", str(rootfs), BASE)
        rootfs.unlink()
    wheels = work / "wheels"
    with building_the_checkout():
        subprocess.run(["make", "-s", "-C", str(ROOT), "wheels", f"WHEELS={wheels}", f"PY={sys.executable}"],
                       check=True, capture_output=True, timeout=900)
    tag = f"localhost/yoke-test:{uuid.uuid4().hex[:8]}"
    podman("build", *RUN, "--build-arg", f"BASE={BASE}", "-t", tag, "-f", str(ROOT / "Containerfile"), str(wheels))
    yield tag
    podman("rmi", "-f", tag, check=False)


class Container:
    def __init__(self, image: str, *, volume: str, port: int, env: dict[str, str], args: tuple[str, ...] = (),
                 mounts: tuple[str, ...] = ()) -> None:
        settings = [x for k, v in {"YOKE_PORT": str(port), **env}.items() for x in ("-e", f"{k}={v}")]
        mounted = [x for m in mounts for x in ("-v", m)]
        self.id = podman("run", "-d", *RUN, "--network", "host", "-v", f"{volume}:/var/lib/yoke", *mounted,
                         *settings, image, *args).stdout.strip()
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            state = podman("inspect", self.id, "--format", "{{.State.Status}}").stdout.strip()
            assert state == "running" and time.monotonic() < deadline, self.logs()
            time.sleep(0.1)

    def exec(self, *args: str) -> str:
        return podman("exec", self.id, *args).stdout

    def token(self) -> str:
        return self.exec("cat", f"/var/lib/yoke/.yoke/token-{self.port}").strip()

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token()}"}, timeout=30)

    def logs(self) -> str:
        return podman("logs", self.id, check=False).stdout + podman("logs", self.id, check=False).stderr

    def stop(self, grace_s: int = 30) -> int:
        podman("stop", "-t", str(grace_s), self.id, timeout=grace_s + 30)
        return int(podman("inspect", self.id, "--format", "{{.State.ExitCode}}").stdout.strip())

    def remove(self) -> None:
        podman("rm", "-f", "-v", self.id, check=False)  # with its anonymous volumes


@pytest.fixture
def volume() -> Iterator[str]:
    name = f"yoke-test-{uuid.uuid4().hex[:8]}"
    podman("volume", "create", name)
    yield name
    podman("volume", "rm", "-f", name, check=False)


def test_the_image_serves_keeps_its_data_in_the_volume_and_drains_on_sigterm(image: str, volume: str) -> None:
    size = int(podman("image", "inspect", image, "--format", "{{.Size}}").stdout)
    print(f"image size: {size / 1e6:.0f} MB")  # reported in docs/production/deploy.md
    port = free_port()
    app = ("-v", f"{APP_DIR}:/app:ro")
    env = {"PYTHONPATH": "/app", "YOKE_SHUTDOWN_TIMEOUT_S": "20"}
    first = Container(image, volume=volume, port=port, env=env, args=("serve", "--app", "slow_app:app"), mounts=(app[1],))
    try:
        assert first.exec("id", "-u").strip() == "10001"  # not root
        with first.client() as http:
            assert http.get("/healthz").status_code == 200
            assert http.post("/v1/streams/jobs/-/events", json={"type": "job", "payload": {"n": 1}}).status_code == 201
            # The run is under way when the stop comes.
            deadline = time.monotonic() + 30
            while not [e for e in http.get("/v1/streams/progress/-/events").json().get("events", [])
                       if e["type"] == "job.started"]:
                assert time.monotonic() < deadline, first.logs()
                time.sleep(0.05)
            with httpx.Client(base_url=first.url, headers=http.headers, timeout=30) as tailer, \
                    tailer.stream("GET", "/v1/streams/jobs/-/tail") as tail:
                assert tail.status_code == 200
                stopped = time.monotonic()
                assert first.stop() == 0, first.logs()
                assert time.monotonic() - stopped < 20
                for _ in tail.iter_bytes():  # the tail ends with the server, without an error
                    pass
                assert tail.is_stream_consumed
        logs = podman("logs", first.id).stdout  # the log lines, on stdout, one JSON object each
        assert "Application shutdown complete" in logs
        lines = [orjson.loads(line) for line in logs.splitlines()]
        assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    finally:
        first.remove()
    # A new container on the same volume: the data, the token and the drained run are there.
    second = Container(image, volume=volume, port=port, env=env, args=("serve", "--app", "slow_app:app"),
                       mounts=(app[1],))
    try:
        with second.client() as http:
            progress = [e["type"] for e in http.get("/v1/streams/progress/-/events").json()["events"]]
            assert progress.count("job.finished") == 1 and progress.count("job.started") == 1
        assert second.stop() == 0
    finally:
        second.remove()


def test_the_image_takes_postgresql_and_server_processes_from_yoke_variables(
    image: str, volume: str, pg_url: str
) -> None:
    port = free_port()
    container = Container(image, volume=volume, port=port,
                          env={"YOKE_DATABASE_URL": pg_url, "YOKE_WORKERS": "2"})
    try:
        path = f"/container-{uuid.uuid4().hex[:8]}"  # the session's database: a stream of this test's own
        with container.client() as http:
            assert http.post(f"/v1/streams{path}/-/events", json={"type": "x"}).status_code == 201
            assert [e["type"] for e in http.get(f"/v1/streams{path}/-/events").json()["events"]] == ["x"]
        servers = container.exec("python3", "-c", "import os; print(sum(b'yoke' in open(f'/proc/{p}/cmdline', 'rb').read()"
                                 " for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()))")
        assert int(servers) == 2  # yoke serve and the server process it forked
        assert container.stop() == 0
    finally:
        container.remove()


@pytest.fixture(scope="module")
def postgres_image() -> str:
    """PostgreSQL from Debian's package, taking what compose.yaml gives the official image
    (tagged by its files' contents: a change to them builds it again)."""
    files = sorted((APP_DIR / "postgres").iterdir())
    tag = "localhost/yoke-test-postgres:" + hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]
    if podman("image", "exists", tag, check=False).returncode == 0:
        return tag
    base = "localhost/yoke-test-postgres-base:bookworm"
    if podman("image", "exists", base, check=False).returncode != 0:
        with tempfile.TemporaryDirectory() as work:
            rootfs = Path(work) / "rootfs.tar"
            subprocess.run(["mmdebstrap", "--variant=minbase", "--include=postgresql", "bookworm", str(rootfs)],
                           check=True, capture_output=True, timeout=900)
            podman("import", str(rootfs), base)
    podman("build", *RUN, "--build-arg", f"BASE={base}", "-t", tag, str(APP_DIR / "postgres"))
    return tag


def test_compose_runs_yoke_on_postgresql_and_a_worker_takes_over(
    image: str, postgres_image: str, tmp_path: Path
) -> None:
    """compose.yaml as it is: PostgreSQL, the API, two workers. An event is
    processed on a worker; that worker's container is killed and the other
    takes its instances over; down and up again, the events are there."""
    conf = tmp_path / "containers.conf"  # runc and the ulimits, for every container compose starts
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=20000:20000", "nproc=1024:1024"]\n'
                    '[engine]\nruntime = "runc"\n')
    (tmp_path / "owner.txt").write_text(uuid.uuid4().hex)
    (tmp_path / "runtime.txt").write_text(uuid.uuid4().hex)
    port = free_port()
    project = f"yoketest{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "CONTAINERS_CONF": str(conf), "YOKE_IMAGE": image, "POSTGRES_IMAGE": postgres_image,
           "YOKE_APP_DIR": str(APP_DIR), "YOKE_APP": "slow_app:app", "YOKE_PORT": str(port),
           "YOKE_WORKER_STALE_S": "4", "POSTGRES_PASSWORD_FILE": str(tmp_path / "owner.txt"),
           "YOKE_RUNTIME_PASSWORD_FILE": str(tmp_path / "runtime.txt")}
    url = f"http://127.0.0.1:{port}"

    def compose(*args: str, check: bool = True) -> None:
        subprocess.run([sys.executable, "-m", "podman_compose", "-f", str(ROOT / "compose.yaml"), "-p", project, *args],
                       env=env, check=check, capture_output=True, timeout=300)

    def containers(*, stopped: bool = False) -> dict[str, str]:
        """service name -> container id, of this project's running containers (``stopped``: all)"""
        out = podman("ps", *(["-a"] if stopped else []), "--filter", f"label=io.podman.compose.project={project}",
                     "--format", '{{.ID}} {{index .Labels "io.podman.compose.service"}}').stdout
        return {service: cid for cid, service in (line.split() for line in out.splitlines())}

    def client() -> httpx.Client:
        deadline = time.monotonic() + 120
        while True:  # the API answers once PostgreSQL is up and the schema migrated
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, state()
            time.sleep(0.2)
        token = podman("exec", containers()["api"], "cat", "/var/lib/yoke/.yoke/token-8080").stdout.strip()
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)

    def state() -> dict[str, str]:
        """every container of the project, stopped too, with its status, restarts and last log lines
        (the image logs to stdout): what a failed wait reports"""
        report = {"ps -a": podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}",
                                  "--format", "{{.Names}} {{.Status}}", check=False).stdout}
        for service, cid in containers(stopped=True).items():
            logs = podman("logs", cid, check=False)
            restarts = podman("inspect", cid, "--format", "{{.RestartCount}}", check=False).stdout.strip()
            report[service] = f"restarts={restarts} " + (logs.stdout + logs.stderr)[-1500:]
        return report

    def workers_started() -> dict[str, str]:
        """service -> hostname of the two workers, once both run and have said so in their logs
        (compose's `up -d` returns when they were started, not when they joined)"""
        deadline = time.monotonic() + 120
        while True:
            running = {s: c for s, c in containers().items() if s.startswith("worker")}
            if len(running) == 2 and all(
                "yoke worker wrk_" in podman("logs", c, check=False).stdout for c in running.values()
            ):
                return {s: podman("inspect", c, "--format", "{{.Config.Hostname}}").stdout.strip()
                        for s, c in running.items()}
            assert time.monotonic() < deadline, state()
            time.sleep(0.2)

    def seen(http: httpx.Client, n: int) -> dict:
        deadline = time.monotonic() + 60
        while True:
            found = [e["payload"] for e in http.get("/v1/streams/seen/-/events").json().get("events", [])
                     if e["payload"].get("n") == n]
            if found:
                return found[0]
            assert time.monotonic() < deadline, state()
            time.sleep(0.1)

    anonymous: set[str] = set()  # the image's VOLUME, made for each container compose starts

    def note_volumes() -> None:
        for cid in containers(stopped=True).values():
            mounts = podman("inspect", cid, "--format", "{{range .Mounts}}{{.Name}} {{end}}", check=False).stdout.split()
            anonymous.update(m for m in mounts if not m.startswith(project))

    compose("up", "-d")
    try:
        with client() as http:
            hosts = workers_started()
            assert http.post("/v1/streams/who/-/events", json={"type": "who", "payload": {"n": 1}}).status_code == 201
            first = seen(http, 1)["host"]
            assert first in hosts.values(), (first, hosts, state())
            (ran,) = [s for s, h in hosts.items() if h == first]
            note_volumes()
            podman("kill", containers()[ran])  # no goodbye: its lease must run out
            podman("rm", "-f", containers().get(ran, ran), check=False)  # and no restart
            assert http.post("/v1/streams/who/-/events", json={"type": "who", "payload": {"n": 2}}).status_code == 201
            second = seen(http, 2)["host"]
            assert second != first and second in hosts.values(), (first, second, hosts, state())
        compose("down")  # the volumes stay
        compose("up", "-d")
        with client() as http:
            kept = [e["payload"]["n"] for e in http.get("/v1/streams/who/-/events").json()["events"]]
            assert kept == [1, 2]
    finally:
        note_volumes()
        compose("down", "-v", check=False)
        for name in anonymous:
            podman("volume", "rm", "-f", name, check=False)
