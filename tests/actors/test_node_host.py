"""The Node host (yoke/hosts/node/): actors written in TypeScript or
JavaScript run behind the same op protocol as the Python host; the kernel
routes, queues and retries their events as for any actor."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import yoke
from examples import orders_node
from yoke.examples import orders
from tests.actors import node_app
from tests.actors.test_isolation import WAIT_S, alive, eventually
from yoke import PortalRequest
from yoke.actors.portals import handle_request
from yoke.hosts import wire as p
from yoke.hosts.languages import NODE_HOST

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (make test has it)")


@pytest.fixture(scope="module", autouse=True)
def compiled_example() -> None:
    if not orders_node.SCRIPT.is_file():
        pytest.fail("examples/node/dist/payments.js is missing: run `make npm` (compiles examples/node)")


def open_runtime(url: str, tmp_path, app=node_app.app, **settings):
    settings.setdefault("host_processes", 2)
    return yoke.open(url, app=app, data_dir=str(tmp_path), shutdown_timeout_s=2, **settings)


async def test_the_typescript_payments_desk_runs_in_the_order_pipeline(fresh_url: str, tmp_path, monkeypatch) -> None:
    """examples/orders_node.py: orders.py with its payments desk compiled
    from examples/node/payments.ts; the order is placed, paid (by Node) and
    shipped, and the desk's state and SQLite table are its books."""
    monkeypatch.setattr(orders, "SHIP_AFTER_S", 0.05)
    app = orders_node.app
    async with open_runtime(fresh_url, tmp_path, app=app, schedule_poll_s=0.02) as y:
        body = b'{"order_id": "A-1", "items": ["tea"], "total": 42}'
        for _ in range(2):  # a resubmitted order is placed once
            status, answer = await handle_request(
                y.actor_kernel, app, "shop", PortalRequest("POST", "/orders", body=body), worker_id=y.worker_id
            )
            assert (status, answer) == (202, {"order_id": "A-1", "offset": 1})
        stream = y.stream("/orders/A-1")

        async def shipped():
            await y.wait_idle(timeout_s=WAIT_S)
            return "order.shipped" in [e.type for e in await stream.read(after=0)]

        await eventually(shipped)
        events = await stream.read(after=0)
        assert [e.type for e in events] == ["order.placed", "payment.captured", "order.shipped"]
        (desk,) = [i for i in await y.instances().list() if i.actor == "payments"]
        assert events[1].source == {"actor": "payments", "instance": desk.instance_id}
        assert events[1].payload == {"order_id": "A-1", "amount": 42}
        assert (await y.instances().state(desk.instance_id))[0] == {"paid": {"A-1": 42}, "total": 42}
        charges = await y.instances().query(desk.instance_id, "SELECT order_id, amount FROM charges")
        assert charges.rows == [["A-1", 42]]
        order = await y.instances().find("order", "A-1")
        assert (await y.instances().state(order.instance_id))[0] == {"status": "shipped", "total": 42}
        pool = y.executor.pools["node"]
        assert pool.launch.language == "node" and pool.started >= 1
        assert y.executor.hosts is None  # no isolated Python actor: no Python hosts


async def test_ctx_in_node(fresh_url: str, tmp_path) -> None:
    async with open_runtime(fresh_url, tmp_path) as y:
        instances = y.instances("acme")
        inst = await instances.create("js", key="k", config={"c": 1}, filter={"types": ["node.go"]})
        appended = await y.stream("/", "acme").append({"type": "node.go", "payload": {"what": "surface"}})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["n"] == 4  # set 1, then three concurrent updates
        assert state["before"] == {"n": 1} and state["version"] >= 1
        assert state["rowcount"] == 1 and state["rows"] == [{"offset_": appended.offset, "type": "node.go"}]
        assert state["attempt"] == 1 and state["tenant"] == "acme" and state["frozen"] is True
        assert state["instance"]["instance_id"] == inst.instance_id and state["instance"]["config"] == {"c": 1}
        assert state["event"]["offset"] == appended.offset and state["event"]["payload"] == {"what": "surface"}
        assert state["pid"] != os.getpid()
        out = await y.stream("/out", "acme").read(after=0)
        assert [(e.type, e.payload, e.source) for e in out] == [
            ("node.did", {"key": "k"}, {"actor": "js", "instance": inst.instance_id}),
        ]
        assert state["appended"] == {"offset": out[0].offset, "id": out[0].id}
        host_pid = state["pid"]
        assert alive(host_pid)
    assert not alive(host_pid)  # closing the runtime ends its hosts


async def test_a_refused_op_is_a_yoke_error_with_its_code(fresh_url: str, tmp_path) -> None:
    async with open_runtime(fresh_url, tmp_path) as y:
        inst = await y.instances("acme").create("js", key="k", filter={"types": ["node.go"]})
        await y.stream("/", "acme").append({"type": "node.go", "payload": {"what": "op-error"}})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await y.instances("acme").state(inst.instance_id)
        try:
            await y.stream("/", "acme").append({"type": ""})
        except yoke.errors.YokeError as exc:
            expected = exc.code
        assert state["caught"]["name"] == "YokeError" and state["caught"]["code"] == expected


REASONS = {
    "raise": "TypeError: asked to fail",
    "exit": "host failure: its host exited with status 7",
    "kill": "host failure: its host died of SIGKILL",
    "spin": "process() timed out after 3s; its host was killed",
    "allocate": "host failure: its host died of SIGABRT",  # V8 at --max-old-space-size
}


@pytest.mark.parametrize("what", list(REASONS))
async def test_a_failing_node_run_is_retried_and_recorded(fresh_url: str, tmp_path, what: str) -> None:
    """As for a Python host (test_isolation.py): the row is tried
    max_attempts (2) times, the reason recorded, the host replaced unless
    the handler only threw; another instance's events go on meanwhile."""
    async with open_runtime(fresh_url, tmp_path, host_memory_mb=64) as y:
        instances = y.instances("acme")
        bad = await instances.create("js", key="bad", filter={"types": ["bad"]})
        good = await instances.create("js", key="good", filter={"types": ["good"]})
        pool = y.executor.pools["node"]
        await y.stream("/", "acme").append({"type": "bad", "payload": {"what": what}})
        for _ in range(5):
            await y.stream("/", "acme").append({"type": "good", "payload": {}})
        dead = await eventually(lambda: instances.dead(bad.instance_id))
        assert dead[0].attempts == 2
        assert dead[0].last_error.startswith(REASONS[what]), dead[0].last_error
        if what == "raise":
            assert "worker.mjs" in dead[0].last_traceback  # the host's JavaScript stack
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(good.instance_id)
        assert state["done"] == 5
        replaced = 0 if what == "raise" else 2
        assert pool.started >= 1 + replaced
        if what != "raise":
            assert pool.started - len(pool.hosts) >= replaced


async def test_a_thrown_first_attempt_is_retried(fresh_url: str, tmp_path) -> None:
    from yoke.actors.journal import run_idempotency_key

    async with open_runtime(fresh_url, tmp_path) as y:
        rows: list[int] = []
        y.executor.scheduler.on_run = lambda row, *_: rows.append(row.qid)
        instances = y.instances("acme")
        inst = await instances.create("js", key="k", filter={"types": ["node.go"]})
        await y.stream("/", "acme").append({"type": "node.go", "payload": {"what": "flaky"}})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        assert state["done"] == 1 and state["attempt"] == 2
        # ctx.idempotencyKey: the same on the retry, and the key Python derives.
        assert state["firstKey"] == state["key"] == run_idempotency_key("acme", inst.instance_id, rows[0], "pay")
        assert (await instances.depth(inst.instance_id)).dead == 0


async def test_an_atomic_node_run_leaves_nothing_of_its_failed_attempt(fresh_url: str, tmp_path) -> None:
    async with open_runtime(fresh_url, tmp_path) as y:
        instances = y.instances("acme")
        inst = await instances.create("js_atomic", key="k", filter={"types": ["node.go"]})
        await y.stream("/", "acme").append({"type": "node.go", "payload": {"what": "flaky"}})
        await y.wait_idle(timeout_s=WAIT_S)
        state, _ = await instances.state(inst.instance_id)
        # The first attempt's ctx.state.set (firstKey) went with its failure.
        assert state["done"] == 1 and state["attempt"] == 2 and "firstKey" not in state


async def test_a_script_without_process_fails_its_runs_with_the_reason(fresh_url: str, tmp_path) -> None:
    app = yoke.App()
    app.node_actor("empty", node_app.HERE / "empty.mjs", max_attempts=1)
    async with open_runtime(fresh_url, tmp_path, app=app) as y:
        inst = await y.instances("acme").create("empty", key="k", filter={"types": ["go"]})
        await y.stream("/", "acme").append({"type": "go"})
        dead = await eventually(lambda: y.instances("acme").dead(inst.instance_id))
        assert "exports no process(ctx, event) function" in dead[0].last_error, dead[0].last_error


async def test_a_script_that_throws_at_import_is_not_started_again_and_again(fresh_url: str, tmp_path) -> None:
    """A host that cannot start is not replaced at once (it was: a start a
    few times a second, for ever); the next start backs off, and runs
    asking meanwhile fail at once with the reason."""
    script = tmp_path / "broken.mjs"
    script.write_text('throw new Error("broken at import");\nexport async function process() {}\n')
    app = yoke.App()
    app.node_actor("broken", script, max_attempts=3, retry_base_s=0.05, retry_max_s=0.1)
    async with open_runtime(fresh_url, tmp_path, app=app, host_processes=1) as y:
        inst = await y.instances("acme").create("broken", key="k", filter={"types": ["go"]})
        await y.stream("/", "acme").append({"type": "go"})
        dead = await eventually(lambda: y.instances("acme").dead(inst.instance_id))
        assert "broken at import" in dead[0].last_error and "the next start is in" in dead[0].last_error
        pool = y.executor.pools["node"]
        # Three attempts within the first start's backoff: one start.
        assert pool.started == 1 and pool.failed_starts == 1 and not pool.warming


async def test_a_failing_typescript_handlers_stack_names_its_ts_lines(fresh_url: str, tmp_path) -> None:
    """Source maps are on in the Node host: the recorded stack points at the
    TypeScript the user wrote, not at the compiled JavaScript."""
    (tmp_path / "thrower.ts").write_text(
        "export async function process(ctx: unknown, event: unknown): Promise<void> {\n"
        "  const reason: string = 'declined';\n"
        "  throw new Error(`card ${reason}`);\n"
        "}\n"
    )
    tsc = Path(orders_node.SCRIPT).parents[1] / "node_modules" / ".bin" / "tsc"
    subprocess.run([str(tsc), "--sourceMap", "--target", "es2022", "--module", "es2022", "--outDir",
                    str(tmp_path / "dist"), str(tmp_path / "thrower.ts")], check=True, timeout=120)
    app = yoke.App()
    app.node_actor("thrower", tmp_path / "dist" / "thrower.js", max_attempts=1)
    async with open_runtime(fresh_url, tmp_path, app=app) as y:
        inst = await y.instances("acme").create("thrower", key="k", filter={"types": ["go"]})
        await y.stream("/", "acme").append({"type": "go"})
        [dead] = await eventually(lambda: y.instances("acme").dead(inst.instance_id))
        assert "card declined" in dead.last_error
        assert "thrower.ts:3" in dead.last_traceback, dead.last_traceback


async def test_a_node_actor_needs_its_script(tmp_path) -> None:
    app = yoke.App()
    app.node_actor("gone", tmp_path / "missing.js")
    with pytest.raises(yoke.errors.InvalidInput, match="missing.js does not exist"):
        async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=app, data_dir=str(tmp_path)):
            pass
    with pytest.raises(yoke.errors.InvalidInput):
        app.node_actor("gone", tmp_path / "other.js")  # the name is taken


# --- the protocol, spoken to the Node host directly -----------------------------


class Speaker:
    """The kernel's end of a socket to one Node host, by hand."""

    async def __aenter__(self) -> Speaker:
        ours, theirs = socket.socketpair()
        self.proc = await asyncio.create_subprocess_exec(
            "node", str(NODE_HOST), str(theirs.fileno()), pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.reader, self.writer = await asyncio.open_unix_connection(sock=ours)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()
        await asyncio.wait_for(self.proc.wait(), WAIT_S)  # end of file ends the host

    async def send(self, line: bytes) -> dict:
        self.writer.write(line)
        return orjson.loads(await asyncio.wait_for(self.reader.readline(), WAIT_S))

    async def call(self, id_: int, method: str, params) -> dict:
        return await self.send(p.encode(p.request(id_, method, params)))


async def test_the_node_host_speaks_the_protocol() -> None:
    async with Speaker() as host:
        refused = await host.call(1, "host.init", {"protocol": 99, "actors": {}})
        assert refused["id"] == 1 and refused["error"]["code"] == p.VERSION_MISMATCH
        assert refused["error"]["data"] == {"supported": [p.PROTOCOL_VERSION]}
        assert (await host.send(b"[1, 2]\n"))["error"]["code"] == p.PARSE_ERROR
        assert (await host.send(b"{nope\n"))["error"]["code"] == p.PARSE_ERROR
        unknown = await host.call(2, "host.dance", {})
        assert unknown["id"] == 2 and unknown["error"]["code"] == p.METHOD_NOT_FOUND
        script = str(node_app.HERE / "worker.mjs")
        ready = await host.call(3, "host.init", {"protocol": p.PROTOCOL_VERSION, "actors": {"js": script}})
        assert ready["result"]["protocol"] == p.PROTOCOL_VERSION and ready["result"]["language"] == "node"
        assert ready["result"]["actors"] == ["js"] and ready["result"]["pid"] == host.proc.pid
        nobody = await host.call(4, "actor.process", {"run": 1, "actor": "nobody", "instance": {"instance_id": "i"},
                                                      "event": {}, "attempt": 1})
        assert nobody["error"]["code"] == p.INVALID_PARAMS
        # A run: the host sends ops, naming the run, and answers once they are answered.
        instance = {"instance_id": "inst_1", "tenant": "t", "actor": "js", "key": "k", "config": {}}
        event = {"offset": 3, "type": "go", "payload": {}}
        host.writer.write(p.encode(p.request(5, "actor.process", {
            "run": 17, "actor": "js", "tenant": "t", "instance": instance, "event": event, "attempt": 1,
            "queue_row": 42,
        })))
        get = orjson.loads(await host.reader.readline())
        assert (get["method"], get["params"], get["run"]) == ("state_get", {}, 17)
        host.writer.write(p.encode(p.result(get["id"], {"value": None, "version": 0})))
        cas = orjson.loads(await host.reader.readline())
        assert cas["method"] == "state_cas" and cas["params"]["expected"] == 0
        assert cas["params"]["value"]["done"] == 1
        host.writer.write(p.encode(p.error(cas["id"], p.OP_FAILED, "no", {"code": "invalid_input"})))
        failed = orjson.loads(await host.reader.readline())  # the handler did not catch it
        assert failed["id"] == 5 and failed["error"]["code"] == p.HANDLER_FAILED
        assert failed["error"]["message"] == "YokeError: no"


async def test_a_node_host_dies_with_its_kernel(tmp_path) -> None:
    """The launcher asks Linux to kill Node when the kernel's process dies:
    a host spinning on the CPU does not outlive it."""
    kernel = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KERNEL, str(node_app.HERE / "worker.mjs"), stdout=asyncio.subprocess.PIPE,
    )
    pid = int(await asyncio.wait_for(kernel.stdout.readline(), WAIT_S))
    assert alive(pid)
    kernel.kill()
    await kernel.wait()

    async def gone():
        return not alive(pid) or _zombie(pid)

    await eventually(gone)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except OSError:
        return True


# A kernel in miniature: starts a Node host through the launcher, makes it
# spin, prints its pid and waits to be killed.
KERNEL = """
import asyncio, sys
from yoke.hosts.languages import node_launch
from yoke.hosts.pool import HostPool

async def main():
    pool = HostPool(node_launch({"js": sys.argv[1]}), size=1)
    host = await pool.acquire()
    host.outbox.send({"jsonrpc": "2.0", "id": 99, "method": "actor.process", "params": {
        "run": 1, "actor": "js", "tenant": "t", "instance": {"instance_id": "i"},
        "event": {"payload": {"what": "spin"}}, "attempt": 1}})
    print(host.pid, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def test_idempotency_key_without_a_queue_row_is_refused() -> None:
    """A context without a queue row has no idempotency key: an error, not
    one key shared by every row (Node's Context; Python's is in
    tests/actors/test_effects_journal.py)."""
    sdk = Path(yoke.__file__).parent / "hosts" / "node" / "yoke.js"
    script = f"""
import {{ Context }} from {orjson.dumps(sdk.as_uri()).decode()};
const base = {{ tenant: "acme", instance: {{ instance_id: "i1" }}, event: {{}}, attempt: 1 }};
const out = {{ key: new Context(null, null, {{ ...base, queueRow: 7 }}).idempotencyKey("pay") }};
try {{ new Context(null, null, base).idempotencyKey("pay"); }}
catch (e) {{ out.error = {{ name: e.name, code: e.code, field: e.details.field }}; }}
console.log(JSON.stringify(out));
"""
    done = subprocess.run(["node", "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    out = orjson.loads(done.stdout)
    from yoke.actors.journal import run_idempotency_key

    assert out["key"] == run_idempotency_key("acme", "i1", 7, "pay")
    assert out["error"] == {"name": "YokeError", "code": "invalid_input", "field": "queue_row"}
