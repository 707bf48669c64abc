"""The ``yoke`` command line, one module per command group:

    server.py         serve, worker, migrate            (the database)
    backup.py         backup, restore                   (SQLite files)
    tokens.py         tokens create|list|revoke         (the database)
    streams.py        append, read, tail, streams, stream info|close|retention|hold
    subscriptions.py  subscriptions list|show|add|remove|resume|cursor|wait
    actors.py         instances list|create|show|inputs, dlq list|redrive|drop
    forks.py          instances fork, forks list|show|runs|state|sql|diff|discard
    failures.py       failures list|show|replay|discard
    deploy_check.py   check-deploy                      (the database)
    demo.py           demo                              (in-process, no server)
    common.py         click classes, output helpers, http_command

Stream, subscription and actor commands talk HTTP to ``--url`` with the
token of ``--token``, else ``YOKE_TOKEN``, else ``.yoke/token-<port>`` that
``yoke serve`` wrote for the port of ``--url``. Every module imports only
click and the standard library at the top; the runtime, the HTTP stack and
the database drivers are imported inside the commands that use them, so
that ``yoke --help`` and ``yoke read`` start fast.
"""

from __future__ import annotations

import click

from .. import build
from .actors import dlq, instances
from .backup import backup, restore
from .common import Group
from .demo import demo
from .deploy_check import check_deploy
from .failures import failures
from .forks import forks
from .server import migrate, serve, worker
from .sql import sql
from .streams import append, read, stream, streams, tail
from .subscriptions import subscriptions
from .tokens import tokens

SECTIONS = [
    ("Start here", [demo, serve]),
    ("Streams (over HTTP)", [append, read, tail, streams, stream]),
    ("Subscriptions and actors (over HTTP)", [subscriptions, instances, dlq, forks, failures, sql]),
    ("Operations (on the database)", [worker, migrate, tokens, backup, restore, check_deploy]),
]


class Main(Group):
    """``yoke --help`` lists the commands in sections, first things first."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        for title, commands in SECTIONS:
            rows = [(c.name or "", c.get_short_help_str(limit=90)) for c in commands]
            with formatter.section(title):
                formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    # Asked only here: the commit costs a git call, which no other command pays.
    if value and not ctx.resilient_parsing:
        click.echo(f"yoke {build.build()}")
        ctx.exit()


@click.group(cls=Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--version", "-V", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
    help="Show the version (with the git commit when run from a checkout) and exit.",
)
def main() -> None:
    """Yoke: durable event streams and actors.

    \b
    New here?
      yoke demo                      append, read and tail a stream in-process (no server)
      make run                       serve the example app on http://127.0.0.1:8080
      yoke append /demo hello '{"n": 1}'
      yoke read /demo                then: yoke streams, yoke tail /demo, yoke instances list

    Commands over HTTP talk to --url (default http://127.0.0.1:8080, or
    YOKE_URL) with the token of the server on that port (.yoke/token-PORT,
    written by `yoke serve` in this directory), or --token / YOKE_TOKEN.
    Every command takes --json and --help.
    """


for _, _commands in SECTIONS:
    for _command in _commands:
        main.add_command(_command)

__all__ = ["main"]
