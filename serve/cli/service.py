"""`ctx up` / `ctx down` and the service lines of `ctx status`: the resident service's lifecycle."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlake.errors import InputError, LakeError
from ctxlake.serve.service import lifecycle
from ctxlake.serve.service.paths import service_paths
from ctxlake.serve.service.protocol import SILENT_SERVICE_ENV

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def service_status() -> dict[str, Any]:
    """What `ctx status` shows about the service: up/down, pid, uptime, RSS, projects, schedules."""
    paths = service_paths()
    # A listening service answers even when loaded; only a missing socket means down.
    silent = os.environ.get(SILENT_SERVICE_ENV) == "1"  # it just left this command unanswered
    info = None if silent else lifecycle.ping(paths, timeout=1.0, reply_timeout=15.0)
    if info is None:
        if lifecycle.lock_is_held(paths):  # alive (holds its lock) but did not answer in time
            return {"up": True, "answering": False, "socket": str(paths.socket)}
        return {"up": False, "socket": str(paths.socket)}
    info.pop("op", None)
    return {"up": True, **info}


def print_service_status() -> None:
    st = service_status()
    if not st["up"]:
        typer.echo("Service: down (commands run in-process; `ctx up` starts it)")
        return
    if st.get("answering") is False:
        typer.echo(f"Service: up, but it did not answer in time (stopped or busy; see {service_paths().log})")
        return
    mib = st.get("rss_bytes", 0) / 2**20
    typer.echo(f"Service: up, pid {st['pid']}, uptime {_duration(st.get('uptime_s', 0))}, RSS {mib:.0f} MiB, "
               f"socket {st['socket']}")
    watching = st.get("watching") or []
    typer.echo(f"  watching {len(watching)} project(s)" + (": " + ", ".join(watching) if watching else ""))
    typer.echo(f"  orchestrator: {st.get('orchestrator')}")
    if st.get("ui_url"):
        typer.echo(f"  UI: {st['ui_url']}")
    for sched in st.get("schedules") or []:
        last = sched.get("last_run") or {}
        typer.echo(f"  schedule {sched.get('name')}: {sched.get('kind')} {sched.get('spec')}"
                   f"{' (paused)' if sched.get('paused') else ''}, next {sched.get('next_run') or '-'}, "
                   f"last {last.get('state') or '-'}{' (as last read: Prefect is slow to answer)' if sched.get('stale') else ''}")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def up(
    foreground: Annotated[bool, typer.Option("--foreground", help="run in this terminal until Ctrl-C")] = False,
    watch: Annotated[list[Path] | None, typer.Option("--watch", help="also watch this project (repeatable)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Start the ctxlake service (idempotent): warm engine, watchers, schedules, on a 0600 Unix socket."""
    folders = [f.resolve() for f in (watch or [])]
    for folder in folders:
        if not folder.is_dir():
            raise InputError(f"not a folder: {folder}")
    paths = service_paths()
    try:
        paths.ensure_dir()
    except OSError as exc:
        raise LakeError(f"cannot create the service folder {paths.dir}: {exc.strerror}") from exc
    if foreground:
        if as_json:
            raise InputError("--json and --foreground do not go together", hint="the foreground service prints a log")
        if lifecycle.ping(paths) is not None:
            typer.echo(f"The service already runs (socket {paths.socket}); not starting another.")
            return
        argv = [a for f in folders for a in ("--watch", str(f))]
        typer.echo(f"ctx service: listening on {paths.socket} (Ctrl-C stops it)", err=True)
        # This process becomes the daemon (exec): the CLI never imports the daemon, which hosts the CLI.
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "ctxlake.serve.service.daemon", *argv])
    before = lifecycle.ping(paths)
    info = lifecycle.start_detached(paths, watch=folders)
    if info is None:
        tail = _tail(paths.log)
        if tail.strip() and tail != "(no log)":
            raise LakeError(f"the service did not start; last lines of {paths.log}:\n{tail}")
        # Nothing in the log: most often it could not be written at all.
        raise LakeError(f"the service did not start, and {paths.log} says nothing" + _disk_note(paths.dir),
                        hint="run `ctx up --foreground` to see its errors in this terminal")
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"started": before is None, "pid": info["pid"], "socket": info["socket"],
                    "ui_url": info.get("ui_url"), "log": str(paths.log)})
        return
    started = "already running" if before is not None else "started"
    typer.echo(f"Service {started}: pid {info['pid']}, listening on {info['socket']}")
    if info.get("ui_url"):
        typer.echo(f"UI: {info['ui_url']}")


def _disk_note(folder: Path) -> str:
    """'; the disk holding FOLDER is full' when it is (under 1 MiB free), else ''."""
    import shutil

    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    return f": the disk holding {folder} is full ({free:,} bytes free)" if free < 1 << 20 else ""


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def down(as_json: JsonOpt = False) -> None:
    """Stop the service: its watchers, flows and the Prefect server it started."""
    paths = service_paths()
    started = time.monotonic()
    pid = lifecycle.stop(paths)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"stopped": pid is not None, "pid": pid, "seconds": round(time.monotonic() - started, 2)})
        return
    if pid is None:
        typer.echo("The service is not running.")
        return
    typer.echo(f"Service stopped (pid {pid}, {time.monotonic() - started:.1f} s).")


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)


def info_json() -> str:
    return json.dumps(service_status(), default=str)


__all__ = ["down", "info_json", "print_service_status", "register", "service_status", "up"]
