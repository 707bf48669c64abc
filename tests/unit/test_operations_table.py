"""docs/reference/operations.md lists every operation with its Python,
HTTP, CLI and console forms: each form it claims exists (the Python method,
the route and method in the OpenAPI document, the CLI command, the label in
the console page's script)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from pathlib import Path

import click
import pytest

from yoke.actors.instances import Instances
from yoke.cli import main
from yoke.failures.inbox import Failures
from yoke.actors.app import App
from yoke.http.app import create_app
from yoke.runtime import Runtime
from yoke.streams.stream import Stream
from yoke.tokens import Tokens

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "docs" / "reference" / "operations.md"
PAGES = ROOT / "yoke" / "console" / "pages"
OWNERS = {"s": Stream, "i": Instances, "f": Failures, "y.tokens": Tokens, "y": Runtime, "app": App}


def rows() -> list[list[str]]:
    lines = [line for line in TABLE.read_text().splitlines() if line.startswith("| ") and "---" not in line]
    parsed = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    assert parsed[0] == ["operation", "Python", "HTTP", "CLI", "console"]
    return parsed[1:]


def codes(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def python_exists(name: str) -> bool:
    if name.startswith("yoke."):
        module, _, attr = name.rpartition(".")
        return hasattr(importlib.import_module(module), attr)
    owner, _, attr = name.rpartition(".")
    return callable(getattr(OWNERS[owner], attr, None))


def cli_exists(words: list[str]) -> bool:
    command: click.Command = main
    for word in words:
        if not isinstance(command, click.Group) or word not in command.commands:
            return False
        command = command.commands[word]
    return True


OPERATIONS = rows()


@functools.cache
def documented_paths() -> dict:
    return create_app(contextlib.nullcontext).openapi()["paths"]


def test_the_table_lists_operations() -> None:
    assert len(OPERATIONS) >= 40


@pytest.mark.parametrize("row", OPERATIONS, ids=[r[0] for r in OPERATIONS])
def test_each_form_exists(row: list[str]) -> None:
    _, python, http, cli, console = row
    paths = documented_paths()
    for name in codes(python):
        assert python_exists(name), f"no Python {name}"
    for route in codes(http):
        method, path = route.split(" ", 1)
        assert method.lower() in paths.get(path, {}), f"no {route} in the OpenAPI document"
    for command in codes(cli):
        words = command.split()
        assert words[0] == "yoke" and cli_exists(words[1:]), f"no CLI command {command}"
    if console:
        page, _, label = console.partition(":")
        script = (PAGES / f"{page.strip()}.js").read_text()
        [text] = codes(label)
        # A string literal of the page's script that is, or starts with, the label.
        assert re.search(r"""['"`]""" + re.escape(text), script), f"the console's {page} page shows no {text!r}"
