"""`ctx related PATH`: the files that change together with a file (serve/api/related.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from ctxlake.schemas.config import load_settings, resolve_root


def related(
    path: Annotated[str, typer.Argument(help="a file, relative to the project root")],
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, max=50, help="number of files")] = 10,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
) -> None:
    """Files most often changed in the same commits as PATH (git history; newer commits weigh more)."""
    from ctxlake.serve.api.related import related_files
    from ctxlake.serve.cli.render import print_json

    result = related_files(load_settings(resolve_root(None, for_write=False)), path, limit)
    if as_json:
        print_json(result.model_dump())
        return
    for i, r in enumerate(result.related, start=1):
        typer.echo(f"{i:>2}. {r.path}  ({r.commits} commit(s), last {r.last_change}, strength {r.strength:.2f})")
    if result.note:
        typer.echo(f"note: {result.note}", err=True)


def register(app: typer.Typer) -> None:
    """Add `ctx related` to the CLI."""
    app.command("related")(related)
