"""Help on every command, option and argument; missing arguments named with
what is expected; `yoke demo` where a newcomer looks; the CLI's module
imports stay light (the start-up figures are measured by
bench/cli_startup.py, not here)."""

from __future__ import annotations

import json
import subprocess
import sys

import click
from click.testing import CliRunner

from yoke.cli import main
from yoke.cli.common import Arg

from .conftest import clean_env, yoke


def commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            found += commands(sub, (*path, name))
    return found


def test_every_command_option_and_argument_has_help():
    undocumented = []
    for path, command in commands(main):
        name = " ".join(("yoke", *path))
        if not (command.help or "").strip():
            undocumented.append(name)
        for param in command.params:
            if isinstance(param, click.Option) and not (param.help or "").strip():
                undocumented.append(f"{name} {param.opts[0]}")
            if isinstance(param, click.Argument):
                if not isinstance(param, Arg) or not param.help:
                    undocumented.append(f"{name} {param.name}")
                metavar = (param.metavar or "").strip("[]")
                assert metavar.isupper() and not metavar.endswith("_"), (name, param.metavar)  # not TYPE_
        if isinstance(command, click.Group):
            assert command.commands, name
    assert undocumented == []


def test_every_help_page_renders():
    runner = CliRunner()
    for path, _ in commands(main):
        result = runner.invoke(main, [*path, "--help"], prog_name="yoke")
        assert result.exit_code == 0, (path, result.output)
        assert result.output.startswith(f"Usage: yoke {' '.join(path)}".rstrip()), path
        assert "TYPE_" not in result.output


def test_main_help_starts_with_the_demo(tmp_path):
    shown = yoke("--help", cwd=tmp_path).stdout
    assert "yoke demo" in shown and "make run" in shown
    sections = [line for line in shown.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert sections[:3] == ["Options:", "Start here:", "Streams (over HTTP):"]
    assert yoke("-h", cwd=tmp_path).stdout == shown


def test_missing_arguments_say_what_is_expected(tmp_path):
    done = yoke("append", "/orders", cwd=tmp_path, check=False)
    assert done.returncode == 2
    assert "Usage: yoke append [OPTIONS] PATH TYPE [PAYLOAD]" in done.stderr
    assert "Error: Missing argument 'TYPE'. Expected the event type, like order.placed." in done.stderr
    done = yoke("read", cwd=tmp_path, check=False)
    assert "Error: Missing argument 'PATH'. Expected a stream path, like /orders" in done.stderr
    done = yoke("stream", "hold", "/orders", cwd=tmp_path, check=False)
    assert done.returncode == 2 and "Missing argument 'STATE'" in done.stderr and "on" in done.stderr
    done = yoke("tokens", "revoke", cwd=tmp_path, check=False)
    assert "Missing argument 'TOKEN_ID'. Expected the id of a token, like tok_" in done.stderr


def test_the_cli_imports_no_heavy_module_until_a_command_needs_it():
    code = (
        "import sys, json; import yoke.cli; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('httpx', 'orjson', 'fastapi', 'starlette', 'uvicorn', 'asyncpg', 'asyncio', 'pydantic') "
        "or m in ('yoke.runtime', 'yoke.config', 'yoke.store'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []
