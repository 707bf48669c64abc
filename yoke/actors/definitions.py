"""``python -m yoke.actors.definitions MODULE:ATTRIBUTE``: load the
application afresh and print what it declares (``App.definitions``) as one
JSON line. ``--reload`` runs it in a process of its own (hosts/reload.py),
so the changed code is imported without touching the running kernel's."""

from __future__ import annotations

import sys

import orjson

from .app import load_app


def main() -> None:
    print(orjson.dumps(load_app(sys.argv[1]).definitions()).decode())


if __name__ == "__main__":
    main()
