"""How each language's host is started (pool.py runs them).

The Python host imports the application by its ``module:attribute``; the
Node host imports the script of each Node actor (``app.node_actor``). A
host of any other language is a command that takes the socket's descriptor
number as its last argument and speaks docs/advanced/hosts.md#the-protocol.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .. import errors
from .pool import Launch

NODE_HOST = Path(__file__).parent / "node" / "host.js"

# Node cannot ask Linux to kill it when the kernel's process dies (the Python
# host does, with prctl), and a handler spinning on the CPU would never see
# the socket close: this launcher asks for it, then becomes Node (the
# setting survives exec).
EXEC_WITH_PARENT_DEATH = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, signal.SIGKILL)\n"  # PR_SET_PDEATHSIG
    "if os.getppid() == 1: sys.exit(0)\n"  # the kernel is already gone
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


def python_launch(app_spec: str) -> Launch:
    return Launch("python", (sys.executable, "-m", "yoke.hosts.python"),
                  {"app": app_spec, "sys_path": list(sys.path)})


def node_launch(
    scripts: dict[str, str], memory_limit_mb: int = 0, portals: dict[str, str] | None = None,
    receivers: dict[str, str] | None = None,
) -> Launch:
    """``scripts``: actor name -> its JavaScript module. The memory limit
    is V8's heap limit (``--max-old-space-size``): RLIMIT_AS does not suit
    V8, which reserves far more address space than it uses."""
    node = shutil.which("node")
    if node is None:
        raise errors.InvalidInput(
            f"actor {min(scripts)!r} runs on Node.js, and there is no node on PATH", field="script",
        )
    for actor, script in sorted(scripts.items()):
        if not os.path.isfile(script):
            raise errors.InvalidInput(f"actor {actor!r}: its script {script} does not exist", field="script")
    # Source maps on: a stack from compiled TypeScript names the .ts lines.
    flags = ["--enable-source-maps", *([f"--max-old-space-size={memory_limit_mb}"] if memory_limit_mb > 0 else [])]
    command = (sys.executable, "-I", "-S", "-c", EXEC_WITH_PARENT_DEATH, node, *flags, str(NODE_HOST))
    return Launch("node", command, {"actors": scripts, "portals": portals or {}, "receivers": receivers or {}})
