"""``yoke check-deploy``: fork a sample of live instances under candidate
code and report where they diverge (docs/advanced/forks.md#the-deploy-check).
On the database, like ``migrate``; exit 0 when nothing diverges, 1 when
something does, 2 on an error: a CI job can gate a deploy on it."""

from __future__ import annotations

from typing import Any

import click

from .common import DB_OPTION, JSON_OPTION, command, emit, fail

ERROR = 2


def report_lines(report: dict[str, Any]) -> str:
    out = []
    for tenant in report["tenants"]:
        for actor, entry in tenant["actors"].items():
            head = f"{tenant['tenant']} {actor}: {entry['checked']} of {entry['instances']} instances checked"
            out.append(head + (f", {len(entry['diverged'])} diverge" if entry["diverged"] else ", none diverges"))
            for d in entry["diverged"]:
                where = (f"first at input {d['first_input']}" if d["first_input"] is not None
                         else "its state or tables at the end")
                out.append(f"  {actor}/{d['key']} ({d['instance_id']}): diverges, {where} of {d['inputs']}")
            for e in entry["errors"]:
                out.append(f"  {e['instance_id']}: not checked: {e['code']}: {e['message']}")
    verdict = (f"{report['diverged']} instance(s) diverge" if report["diverged"]
               else "no instance diverges") + f" ({report['checked']} checked)"
    return "\n".join([*out, verdict])


@command(short_help="Fork a sample of live instances under new code: exit 1 where they diverge.")
@DB_OPTION
@click.option("--app", "app_spec", required=True, metavar="MODULE:APP", help="The candidate code.")
@click.option("--current", "current_spec", default=None, metavar="MODULE:APP",
              help="The deployed code to compare with (default: the live instances, which it made).")
@click.option("--actor", "actors", multiple=True, metavar="NAME", help="Only this actor (repeatable; default: all).")
@click.option("--instances", "sample", default=100, show_default=True, type=click.IntRange(1, 10_000), metavar="N",
              help="Instances of each actor, drawn at random.")
@click.option("--inputs", default=1000, show_default=True, type=click.IntRange(1), metavar="K",
              help="Runs compared: each instance's last K inputs (its state and tables at the end).")
@click.option("--tenant", "tenants", multiple=True, metavar="TENANT", help="Only this tenant (repeatable).")
@JSON_OPTION
def check_deploy(database_url: str | None, app_spec: str, current_spec: str | None, actors: tuple[str, ...],
                 sample: int, inputs: int, tenants: tuple[str, ...], as_json: bool) -> None:
    """Fork a sample of each actor's live instances under the candidate code
    (--app), replaying their kept inputs in a sandbox, and compare with
    the current code: report every instance whose state, tables or effects
    diverge, with the first input where they differ. Nothing live changes.
    Exit 0: nothing diverges; 1: something does; 2: an error."""
    import asyncio

    from ..errors import YokeError
    from ..runtime import open as open_runtime
    from .server import redact, settings_or_fail

    settings = settings_or_fail("check-deploy", database_url=database_url)

    async def run() -> dict[str, Any]:
        async with open_runtime(settings=settings, executor=False) as y:
            return await y.check_deploy(app_spec, current=current_spec, actors=actors or None, instances=sample,
                                        inputs=inputs, tenants=tenants or None)

    try:
        report = asyncio.run(run())
    except YokeError as exc:
        fail(f"{exc.code}: {exc.message}", ERROR)
    except Exception as exc:  # an unreachable database, an application that does not load
        fail(f"{redact(settings.database_url)}: {type(exc).__name__}: {exc}", ERROR)
    emit(report, as_json, report_lines)
    if report["errors"]:
        raise SystemExit(ERROR)
    if report["diverged"]:
        raise SystemExit(1)
