"""`ctx search`, `ctx status`, `ctx clean` (serve stage; CHUNKS, FILES and the run state through serve/api): the project's lake."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ctxlake.errors import InputError, NotIndexedError
from ctxlake.schemas.config import load_settings
from ctxlake.schemas.roots import resolve_root
from ctxlake.serve.cli.base import MAX_LIMIT
from ctxlake.serve.cli.service import print_service_status, service_status

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def search(
    query: Annotated[str, typer.Argument(help="what to look for: words, identifiers, a question")],
    limit: Annotated[int | None, typer.Option("-n", "--limit", min=1, max=MAX_LIMIT, help="number of results")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="hybrid | keyword | semantic | fuzzy")] = None,
    path_glob: Annotated[str | None, typer.Option("--path", help="only paths matching this glob, e.g. 'src/**/*.py'")] = None,
    lang: Annotated[str | None, typer.Option("--lang", help="only this language, e.g. python")] = None,
    sources: Annotated[str | None, typer.Option("--sources", help="comma-separated source names")] = None,
    bm25_weight: Annotated[float | None, typer.Option("--bm25-weight", min=0.0, max=1.0, help="keyword share in hybrid, 0..1")] = None,
    budget: Annotated[int | None, typer.Option("--budget", min=1, help="at most this many tokens of hits (est. 4 chars/token)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the project's index."""
    from ctxlake.serve.api.models import SEARCH_MODES

    if mode is not None and mode not in SEARCH_MODES:
        raise InputError(f"unknown --mode {mode!r}", hint=", ".join(SEARCH_MODES))
    settings = load_settings(resolve_root(None, for_write=False))
    from ctxlake.serve.api import code_search
    from ctxlake.serve.api.source_queries import check_names, parse_names
    from ctxlake.serve.service.engine import open_lake

    lake = open_lake(settings)  # the service's warm lake when run there, else a fresh one

    names = parse_names(sources)
    check_names(settings, names)
    result = code_search.search(
        lake, query, mode=mode, limit=limit, path_glob=path_glob, lang=lang,
        sources=names,
        bm25_weight=bm25_weight, budget_tokens=budget,
    )
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(result.model_dump())
        return
    from ctxlake.serve.cli.render import print_search, stdout_console

    print_search(result, stdout_console())
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if result.stale:
        shown = ", ".join(result.stale_paths[:5]) + (" …" if len(result.stale_paths) > 5 else "")
        typer.echo(f"warning: {len(result.stale_paths)} file(s) changed since the last index "
                   f"(run `ctx run index`): {shown}", err=True)


def status(
    as_json: JsonOpt = False,
    skipped: Annotated[bool, typer.Option(
        "--skipped", help="list the files the last run saw but did not index, and why")] = False,
) -> None:
    """Files, chunks, languages, model, last run, stale files, lake size."""
    if skipped:
        from ctxlake.serve.api import index_status
        from ctxlake.serve.cli.render import print_not_indexed

        settings = load_settings(resolve_root(None, for_write=False))
        print_not_indexed(settings.root, index_status.not_indexed_files(settings), as_json)
        return
    try:
        root = resolve_root(None, for_write=False)
    except NotIndexedError:
        # Outside any project the service's state is still worth showing; the exit stays 4.
        if as_json:
            from ctxlake.serve.cli.render import print_json

            print_json({"indexed": False, "service": service_status()})
        else:
            print_service_status()
        raise
    settings = load_settings(root)
    from ctxlake.serve.api import index_status

    st = index_status.status(settings)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({**st.model_dump(), "service": service_status()})
    else:
        from ctxlake.serve.cli.render import print_status, stdout_console

        print_status(st, stdout_console())
        print_service_status()
    if not st.indexed:
        # Exit 4 as documented for `.ctx/` without a lake, after the report (memory, a running indexer).
        raise typer.Exit(4)


def clean(yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False, as_json: JsonOpt = False) -> None:
    """Remove this project's lake (.ctx/lake); config.toml and knowledge/ stay."""
    import shutil

    from ctxlake.serve.cli.render import human_bytes, print_json

    settings = load_settings(resolve_root(None, for_write=False))
    lake = settings.lake_dir
    if not lake.exists():
        if as_json:
            print_json({"removed": False, "lake": str(lake), "bytes": 0})
            return
        typer.echo(f"Nothing to remove: {lake} does not exist.")
        return
    from ctxlake.tasks.lake import WriterLock, reset_lake
    from ctxlake.tasks.run_log import folder_bytes

    size = folder_bytes(lake)
    if not yes:
        if as_json:  # the question would land in the JSON document
            raise InputError("--json needs --yes", hint=f"`ctx clean --yes --json` removes {lake}")
        if not sys.stdin.isatty():
            raise InputError(f"refusing to remove {lake} without --yes (no terminal to ask)")
        if not typer.confirm(f"Remove the index at {lake} ({human_bytes(size)})?", default=False):
            typer.echo("Kept.")
            return
    lock = WriterLock(lake, purpose="ctx clean").acquire()
    try:
        reset_lake(lake)
    finally:
        lock.release()
    shutil.rmtree(lake, ignore_errors=True)
    if as_json:
        print_json({"removed": True, "lake": str(lake), "bytes": size})
        return
    typer.echo(f"Removed {lake} ({human_bytes(size)}).")


def register(app: typer.Typer) -> None:
    """Add `ctx search`, `ctx status` and `ctx clean` to the CLI."""
    app.command("search")(search)
    app.command("status")(status)
    app.command("clean")(clean)
