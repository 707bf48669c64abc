"""A real highly available PostgreSQL on 127.0.0.1: etcd, and two PostgreSQL
15 nodes run by Patroni (Debian's packages, installed by ``make test``), a
primary and a synchronous standby, as teams run it in production.

Everything lives in one temporary directory and is torn down with it. The
nodes run as ``postgres`` when the tests run as root (PostgreSQL refuses
root). Timings are Patroni's own settings, chosen small for a test and
reported with the figures (docs/production/high-availability.md)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.http.conftest import free_port

PATRONI = "/usr/bin/patroni"
PATRONICTL = "/usr/bin/patronictl"
ETCD = "/usr/bin/etcd"
PG_BIN = "/usr/lib/postgresql/15/bin"

# Patroni's timings for the cluster (its DCS settings). ttl: how long the
# leader key lives without renewal; loop_wait: the pause between Patroni's
# checks; retry_timeout: how long DCS and PostgreSQL calls are retried.
# Patroni requires loop_wait + 2 * retry_timeout <= ttl.
TIMINGS = {"ttl": 10, "loop_wait": 1, "retry_timeout": 4}


def installed() -> bool:
    return all(os.path.exists(p) for p in (PATRONI, PATRONICTL, ETCD, f"{PG_BIN}/postgres"))


def _as_postgres(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.getuid() == 0 else command


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    config: Path
    log: Path
    process: subprocess.Popen | None = None

    def status(self) -> dict:
        """Patroni's REST view of this node ({} when it does not answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.api_port}/patroni", timeout=2) as r:
                return json.loads(r.read())
        except OSError as exc:  # urllib raises HTTPError (a 503 from a replica is still JSON)
            body = getattr(exc, "read", None)
            if body is not None:
                try:
                    return json.loads(body())
                except ValueError:
                    return {}
            return {}

    @property
    def data_dir(self) -> Path:
        return self.config.parent / "data"

    def postmaster_pid(self) -> int | None:
        """From PostgreSQL's own pid file (its first line)."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


@dataclass
class Cluster:
    """``scope`` names the cluster in etcd; ``nodes`` in start order."""

    root: Path
    scope: str
    etcd_port: int
    synchronous: bool = True
    nodes: list[Node] = field(default_factory=list)
    etcd: subprocess.Popen | None = None

    # --- addresses ---------------------------------------------------------

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        """The multi-host URL a Yoke process is given: whichever node is the
        writable primary takes its connections."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://{user}@{hosts}/{database}?target_session_attrs=read-write"

    def node_url(self, node: Node, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{node.pg_port}/{database}"

    # --- roles ---------------------------------------------------------------

    def roles(self) -> dict[str, str]:
        """Each answering node's role: ``primary`` (Patroni 3 says "master"
        or "primary"), ``replica``, or what Patroni says."""
        out = {}
        for node in self.nodes:
            role = node.status().get("role")
            if role:
                out[node.name] = "primary" if role in ("master", "primary") else role
        return out

    def primary(self) -> Node | None:
        for node in self.nodes:
            status = node.status()
            if status.get("role") in ("master", "primary") and status.get("state") == "running":
                return node
        return None

    def sync_standby(self) -> str | None:
        """The node etcd names as synchronous standby (Patroni's /cluster);
        in an asynchronous cluster, the streaming replica."""
        for node in self.nodes:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{node.api_port}/cluster", timeout=2) as r:
                    members = json.loads(r.read()).get("members", [])
            except OSError:
                continue
            role = "sync_standby" if self.synchronous else "replica"
            for m in members:
                if m.get("role") == role and m.get("state") in ("running", "streaming"):
                    return m["name"]
            return None
        return None

    def wait_for(self, what: str, check, timeout_s: float = 90.0):
        """Poll ``check`` (a condition on the cluster's state, which changes
        on its own) until it gives a true value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout_s} s; roles {self.roles()}; logs:\n{self.logs()}")
            time.sleep(0.1)

    def wait_healthy(self, timeout_s: float = 120.0) -> Node:
        """A running primary and a streaming synchronous standby."""
        self.wait_for("a primary and a synchronous standby",
                      lambda: self.primary() and self.sync_standby(), timeout_s)
        primary = self.primary()
        assert primary is not None
        return primary

    def logs(self, tail: int = 30) -> str:
        out = []
        for node in self.nodes:
            if node.log.exists():
                lines = node.log.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {node.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # --- life ----------------------------------------------------------------

    def start_node(self, node: Node) -> None:
        handle = open(node.log, "a")  # noqa: SIM115 - the process writes to it
        node.process = subprocess.Popen(
            _as_postgres([PATRONI, str(node.config)]), stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
            # Its own directory: the tests' may be closed to postgres (a
            # checkout under a private temporary directory), and Patroni's
            # helper processes start by changing into their parent's.
            cwd=node.config.parent,
        )
        handle.close()

    def kill_postmaster(self, node: Node) -> int:
        """kill -9 the node's PostgreSQL (Patroni on it stays up, as after
        an out-of-memory kill or a crash of the server alone): its pid."""
        pid = node.postmaster_pid()
        assert pid, f"{node.name} has no running PostgreSQL"
        os.kill(pid, signal.SIGKILL)
        return pid

    def node_pids(self, node: Node) -> list[int]:
        """Patroni's processes on ``node``, its postmaster and the
        postmaster's children (each PostgreSQL process has a session of its
        own, so no one process group holds them)."""
        assert node.process is not None
        pids = [node.process.pid]
        postmaster = node.postmaster_pid()
        parents = {node.process.pid, *([postmaster] if postmaster else [])}
        if postmaster:
            pids.append(postmaster)
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue  # gone meanwhile
            if int(fields[1]) in parents:  # its parent pid
                pids.append(int(stat.parent.name))
        return pids

    def freeze(self, node: Node) -> list[int]:
        """Stop every process of ``node`` (SIGSTOP): to its clients and to
        etcd the node is there but answers nothing, as a hung machine or a
        network partition looks (connections open, no RST). The pids, for thaw()."""
        pids = self.node_pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def switchover(self, to: Node) -> None:
        """A planned switchover, as an operator runs it."""
        current = self.primary()
        assert current is not None
        subprocess.run(
            _as_postgres([PATRONICTL, "-c", str(to.config), "switchover", self.scope,
                          "--leader", current.name, "--candidate", to.name, "--force"]),
            check=True, capture_output=True, text=True, timeout=60, cwd=self.root,
        )

    def stop(self) -> None:
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(node.process.pid, signal.SIGKILL)
                    node.process.wait(10)
        # A postmaster whose Patroni was killed would outlive it: its pid file says.
        for node in self.nodes:
            pid = node.postmaster_pid()
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        if self.etcd is not None and self.etcd.poll() is None:
            self.etcd.terminate()
            self.etcd.wait(20)
        if not os.environ.get("YOKE_HA_KEEP"):  # for a look at the logs after a failure
            shutil.rmtree(self.root, ignore_errors=True)


def node_config(
    root: Path, scope: str, name: str, pg_port: int, api_port: int, etcd_port: int, *, synchronous: bool = True,
) -> dict:
    data = root / name / "data"
    return {
        "scope": scope,
        "name": name,
        "log": {"level": "INFO"},
        "restapi": {"listen": f"127.0.0.1:{api_port}", "connect_address": f"127.0.0.1:{api_port}"},
        "etcd3": {"hosts": [f"127.0.0.1:{etcd_port}"]},
        "bootstrap": {
            "dcs": {
                **TIMINGS,
                "maximum_lag_on_failover": 1048576,
                # Commits wait for the standby, and only a synchronous
                # standby is promoted: an acknowledged append survives.
                # (synchronous=False: asynchronous streaming replication,
                # what bench/failover.py --async measures the cost of.)
                "synchronous_mode": synchronous,
                # A crashed primary fails over at once rather than being
                # restarted in place first (Patroni's default waits 300 s).
                "master_start_timeout": 0,
                "postgresql": {
                    "use_pg_rewind": True,
                    "parameters": {
                        "wal_level": "replica", "hot_standby": "on", "wal_log_hints": "on",
                        "max_wal_senders": 10, "max_replication_slots": 10,
                        "max_connections": 200,
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
            "pg_hba": [
                "local all all trust",
                "host replication all 127.0.0.1/32 trust",
                "host all all 127.0.0.1/32 trust",
            ],
        },
        "postgresql": {
            "listen": f"127.0.0.1:{pg_port}",
            "connect_address": f"127.0.0.1:{pg_port}",
            "data_dir": str(data),
            "bin_dir": PG_BIN,
            "pgpass": str(root / name / "pgpass"),
            "authentication": {
                # No passwords: pg_hba trusts 127.0.0.1 (a test cluster).
                "superuser": {"username": "postgres"},
                "replication": {"username": "postgres"},
                "rewind": {"username": "postgres"},
            },
            "parameters": {"unix_socket_directories": str(root / name)},
        },
    }


def start_cluster(scope: str = "yoke", *, synchronous: bool = True) -> Cluster:
    """etcd and two Patroni nodes; returns once one is primary and the
    other its streaming (synchronous) standby."""
    root = Path(tempfile.mkdtemp(prefix="yoke-ha-"))
    root.chmod(0o777)
    cluster = Cluster(root=root, scope=scope, etcd_port=free_port(), synchronous=synchronous)
    try:
        peer_port = free_port()
        etcd_log = open(root / "etcd.log", "w")  # noqa: SIM115
        cluster.etcd = subprocess.Popen(
            [ETCD, "--name", "etcd0", "--data-dir", str(root / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{cluster.etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{cluster.etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
             "--initial-cluster", f"etcd0=http://127.0.0.1:{peer_port}"],
            stdout=etcd_log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        etcd_log.close()
        for i in (1, 2):
            name = f"node{i}"
            (root / name).mkdir()
            (root / name).chmod(0o777)
            pg_port, api_port = free_port(), free_port()
            config = root / name / "patroni.yml"
            # JSON is YAML: Patroni reads it as its configuration file.
            config.write_text(json.dumps(node_config(
                root, scope, name, pg_port, api_port, cluster.etcd_port, synchronous=synchronous,
            )))
            config.chmod(0o644)
            node = Node(name, pg_port, api_port, config, root / name / "patroni.log")
            cluster.nodes.append(node)
            cluster.start_node(node)
            if i == 1:  # the first bootstraps; the second then clones it
                cluster.wait_for("node1 to bootstrap as primary", cluster.primary, 90)
        cluster.wait_healthy()
        return cluster
    except BaseException:
        cluster.stop()
        raise
