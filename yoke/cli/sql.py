"""``yoke sql``: one read-only query across every actor instance's tables
and Yoke's records, over HTTP (docs/advanced/sql.md)."""

from __future__ import annotations

import click

from .actors import sql_lines
from .common import Remote, argument, command, dumps, fail, http_command, parse_json


@command("sql")
@argument("query", "one read-only statement, like 'SELECT status, count(*) FROM \"order\".orders GROUP BY status'",
          required=False)
@click.option("--params", "params_json", default=None, metavar="JSON", help="Values for its ? marks, a JSON list.")
@click.option("--max-rows", default=None, type=click.IntRange(1, 100_000), metavar="N",
              help="At most N rows (default: the server's sql_max_rows, 10000).")
@click.option("--timeout", "timeout_s", default=None, type=click.FloatRange(0, 300, min_open=True), metavar="S",
              help="At most S seconds (default: the server's sql_timeout_s, 10).")
@click.option("--tables", is_flag=True, help="List what a query can name instead (QUERY is then not given).")
@http_command
def sql(client: Remote, as_json: bool, query: str | None, params_json: str | None, max_rows: int | None,
        timeout_s: float | None, tables: bool) -> None:
    """A read-only SQL query across every actor instance: actor tables as
    ACTOR.TABLE, their ctx.state as ACTOR.yoke_state, Yoke's records as
    yoke.instances, yoke.streams, yoke.queue, yoke.schedules,
    yoke.subscriptions, yoke.failures and yoke.events. --json prints one
    JSON object per row."""
    if tables:
        listed = client.sql_tables()["tables"]
        if as_json:
            for t in listed:
                click.echo(dumps(t))
            return
        for t in listed:
            columns = ", ".join(c["name"] for c in t["columns"])
            click.echo(f"{t['schema']}.{t['name']}" + (f" ({columns})" if columns else ""))
        return
    if not query:
        fail("give a QUERY (or --tables)")
    params = parse_json(params_json, "--params") if params_json is not None else None
    if params is not None and not isinstance(params, list):
        fail("--params is a JSON list, like '[\"a\", 2]'")
    result = client.sql(query, params, max_rows, timeout_s)
    if as_json:
        for row in result["rows"]:
            click.echo(dumps(dict(zip(result["columns"], row))))
        if result.get("truncated"):
            click.echo(f"(the first {len(result['rows'])} rows: --max-rows for more)", err=True)
        return
    click.echo(sql_lines(result))
