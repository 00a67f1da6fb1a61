"""`ctx ui`: print (and open) the web UI's address; starts the service for it, or serves the UI here
in the foreground when the service cannot run."""

from __future__ import annotations

import contextlib
from typing import Annotated

import typer

from ctxlake.serve.service import lifecycle
from ctxlake.serve.service.paths import service_paths


def ui(
    no_open: Annotated[bool, typer.Option("--no-open", help="print the address, do not open a browser")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
    standalone: Annotated[bool, typer.Option("--standalone", help="serve this project here, without the service")] = False,
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535, help="port for --standalone (default \\[ui] port)")] = None,
) -> None:
    """The web UI: overview, search, sessions, knowledge, sources and settings, on 127.0.0.1."""
    paths = service_paths()
    info = None if standalone else (lifecycle.ping(paths) or lifecycle.start_detached(paths, quiet=True))
    url = info.get("ui_url") if info else None
    if url:
        _show(str(url), "service", no_open, as_json)
        return
    from ctxlake.schemas.config import load_settings
    from ctxlake.schemas.roots import resolve_root
    from ctxlake.serve.web.server import standalone as make

    root = resolve_root(None, for_write=False)
    settings = load_settings(root)
    if info is not None and not standalone:
        typer.echo(f"ctx: the service runs without its UI ({info.get('ui') or 'off'}); serving this project here.",
                   err=True)
    server = make(root, settings.ui.port if port is None else port)
    _show(server.url, "standalone", no_open, as_json)
    typer.echo("Serving until Ctrl-C.", err=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve()


def _show(url: str, mode: str, no_open: bool, as_json: bool) -> None:
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"url": url, "mode": mode}, indent=None)  # one line: a script reads it while the UI serves
    else:
        typer.echo(f"UI: {url}")
    if not no_open:
        import webbrowser

        webbrowser.open(url)


def register(app: typer.Typer) -> None:
    app.command("ui")(ui)
