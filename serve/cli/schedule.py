"""`ctx schedule list|set|pause|resume`: the service's scheduled flows, through its Prefect server."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlake.errors import CtxError
from ctxlake.schemas.roots import default_home

# Written by the service (`ctx up`); the one place the CLI learns where its Prefect server listens.
STATE_FILE = Path("service") / "service.json"
ORCHESTRATOR_WAIT_S = 90.0  # Prefect's server takes ~10-20 s to start, longer on a loaded machine

schedule_app = typer.Typer(help="The service's scheduled flows (Prefect deployments).", no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def service_api_url(home: Path | None = None, wait_s: float = ORCHESTRATOR_WAIT_S) -> str:
    """The running service's Prefect API, or a CtxError saying why there is none. Right after
    `ctx up` the service answers while its Prefect server still starts (~10-20 s): the command
    waits for it, up to `wait_s`, rather than call a service that is up "not running"."""
    from ctxlake.serve.service.lifecycle import ping
    from ctxlake.serve.service.orchestrator import healthy
    from ctxlake.serve.service.paths import ServicePaths

    home = home or default_home(dict(os.environ))
    paths = ServicePaths(home)
    deadline = time.monotonic() + wait_s
    waiting = False
    while True:
        try:
            url = json.loads((home / STATE_FILE).read_text(encoding="utf-8")).get("prefect_api_url")
        except (OSError, ValueError):
            url = None
        if url and healthy(str(url)):
            return str(url)
        info = ping(paths)
        if info is None:
            raise CtxError("the ctx service is not running", hint="start it with `ctx up` first")
        note = str(info.get("orchestrator") or "")
        # "not started" while the service warms its imports, then "starting", then "up at URL"
        # (published just before the state file names it); "off", "failed: ..." and "absent" stay.
        if not note.startswith(("not started", "starting", "up at")):
            raise CtxError(f"the service runs no schedules: its orchestrator is {note}",
                           hint="`ctx status` shows the service; `[service] schedules` in config turns them on")
        if time.monotonic() >= deadline:
            raise CtxError(f"the service's Prefect server did not answer within {wait_s:.0f} s ({note})",
                           hint=f"its log: {paths.log}; `ctx down` then `ctx up` starts it again")
        if not waiting:
            typer.echo("Waiting for the service's Prefect server to start …", err=True)
            waiting = True
        time.sleep(0.5)


def _print(rows: list[dict[str, Any]]) -> None:
    if not rows:
        typer.echo("No schedules.")
        return
    for r in rows:
        state = "paused" if r["paused"] else f"next {r['next_run'] or '-'}"
        last = r["last_run"] or {}
        line = f"{r['name']:<32} {r['kind']:<8} {r['spec']:<12} {state}"
        if last:
            line += f"  last: {last['state']} at {last['end'] or last['start']}"
            if last.get("error"):
                line += f" ({last['error']})"
        typer.echo(line)


@schedule_app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Each schedule: kind, spec, paused or the next run, and how the last run ended."""
    from ctxlake.serve.service.schedules import read_schedules

    rows = read_schedules(service_api_url())
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(rows)
    else:
        _print(rows)


@schedule_app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="schedule name (see `ctx schedule list`)")],
    every: Annotated[str | None, typer.Option("--every", help="interval of at least 1m: 90s, 10m, 2h, 1d")] = None,
    cron: Annotated[str | None, typer.Option("--cron", help='five-field cron, e.g. "0 3 * * *"')] = None,
) -> None:
    """Change a schedule on the running service (until its next start; `\\[schedule]` in config sets defaults)."""
    from ctxlake.serve.service.schedules import parse_cron, parse_every, set_schedule

    # Bad input is refused before looking for the service.
    if every is not None:
        parse_every(every)
    if cron is not None:
        parse_cron(cron)
    set_schedule(service_api_url(), name, every=every, cron=cron)
    typer.echo(f"{name}: " + (f"every {every}" if every else f"cron {cron}"))


@schedule_app.command("pause")
def pause(name: Annotated[str, typer.Argument(help="schedule name")]) -> None:
    """Stop scheduling runs of NAME (runs under way finish)."""
    from ctxlake.serve.service.schedules import pause_schedule

    pause_schedule(service_api_url(), name, paused=True)
    typer.echo(f"{name}: paused")


@schedule_app.command("resume")
def resume(name: Annotated[str, typer.Argument(help="schedule name")]) -> None:
    """Schedule runs of NAME again (also after the service paused it for failing)."""
    from ctxlake.serve.service.schedules import pause_schedule

    pause_schedule(service_api_url(), name, paused=False)
    typer.echo(f"{name}: resumed")
