"""What a handler in a host process prints (print, logging, console.*) is
logged by the kernel under the run's actor, key and attempt, not mixed
unlabelled into the server's output, and a failed run keeps it with its
failure (its traceback, shown by the console and ``yoke failures show``)."""

from __future__ import annotations

import logging
import re

import pytest
import yoke

from . import printer_app


@pytest.mark.parametrize("actor", ["py", "js"])
async def test_a_runs_output_is_logged_with_its_ids_and_kept_with_its_failure(
    actor: str, tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="yoke.hosts.output")
    async with yoke.open(f"sqlite:///{tmp_path}/y.db", app=printer_app.app, data_dir=str(tmp_path),
                         host_processes=1) as y:
        await y.stream("/").append({"type": "print", "payload": {"order": "o-1"}})
        await y.stream("/").append({"type": "print", "payload": {"order": "o-2", "fail": True}})
        await y.wait_idle(timeout_s=30)
        logged = [r.getMessage() for r in caplog.records if r.name == "yoke.hosts.output"]
        o1 = await y.instances().find(actor, "o-1")
        assert o1 is not None
        assert any(re.match(rf"{actor} o-1 {o1.instance_id} row \d+ attempt 1 stdout: charging", m) for m in logged), logged
        assert any(re.match(rf"{actor} o-2 inst_\w+ row \d+ attempt 1 stderr: attempt 1 on stderr$", m)
                   for m in logged), logged

        [failure] = await y.failures().list(actor=actor)
        assert "card declined" in failure.error
        output = failure.traceback.split("--- output of this attempt", 1)[1]
        assert "charging" in output and "o-2" in output and "attempt 1 on stderr" in output
        assert "o-1" not in output  # another run's
        if actor == "py":
            assert "a logged warning" in output and "printed by a worker thread" in output
        else:
            assert any(m.endswith("stdout: loaded printer.mjs") and m.startswith("host ") for m in logged), logged
