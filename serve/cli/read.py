"""`ctx show` (get_file_context) and `ctx docs` (docs_index / docs_content): the CLI's file readers.

They call the same serve/api functions as the MCP tools, so the same rules hold: a path is opened
inside its root without following a link out (tasks/safe_io.py), only regular files are read, and
reads are bounded.
"""

from __future__ import annotations

import re
from typing import Annotated

import typer

from ctxlake.errors import UnknownFileError
from ctxlake.schemas.config import load_settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import resolve_root
from ctxlake.serve.cli.base import typed_path_read

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def show(
    filepath: Annotated[str, typer.Argument(help="an indexed file, relative to the current folder (or to the "
                                                 "project root), or absolute inside the project; with --source, "
                                                 "relative to that source's root")],
    start: Annotated[int | None, typer.Option("--start", min=1, help="first line (default 1)")] = None,
    end: Annotated[int | None, typer.Option("--end", min=1, help="last line (default: 400 lines on)")] = None,
    source: Annotated[str, typer.Option("--source", help="a file of this source (see `ctx list`), "
                                        "relative to its root")] = PROJECT_SOURCE,
    as_json: JsonOpt = False,
) -> None:
    """Print lines of an indexed file as it is on disk now (what get_file_context returns)."""
    from ctxlake.serve.api.explore import file_context
    from ctxlake.serve.api.source_queries import check_names
    from ctxlake.serve.service.engine import open_lake

    settings = load_settings(resolve_root(None, for_write=False))
    check_names(settings, [source])
    lake = open_lake(settings)
    try:
        context = typed_path_read(filepath, settings.root,
                                  lambda p: file_context(lake, p, start, end, source=source), source)
    except UnknownFileError:
        # `path:12-30` as `ctx search` prints a hit (lines 12-30), `path:12` as `ctx refs` does (from
        # line 12 on, like --start 12); a file whose name ends so is found first, above.
        place = re.fullmatch(r"(.+):(\d+)(?:-(\d+))?", filepath.strip())
        if place is None or start is not None or end is not None:
            raise
        first, last = int(place[2]), int(place[3]) if place[3] else None
        context = typed_path_read(place[1], settings.root,
                                  lambda p: file_context(lake, p, first, last, source=source), source)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(context.model_dump())
        return
    typer.echo(context.content, nl=not context.content.endswith("\n") and bool(context.content))
    for warning in context.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if context.next_start_line:
        typer.echo(f"(lines {context.start_line}-{context.end_line} of {context.total_lines}; "
                   f"more with --start {context.next_start_line})", err=True)


def docs(
    path: Annotated[str | None, typer.Argument(help="a document from the listing (default: list them)")] = None,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="which chunk of the document, 1-based")] = 1,
    source: Annotated[str | None, typer.Option("--source", help="list one docs folder ('.' = top-level files)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the project's documentation (\\[docs] paths plus top-level README, CHANGES ...), or read one."""
    from ctxlake.serve.api.docs import DocsReader
    from ctxlake.serve.cli.render import print_json

    settings = load_settings(resolve_root(None, for_write=True))
    reader = DocsReader(settings.root, settings.docs, settings.mcp.max_response_chars, lister="`ctx docs`")
    if path is None:
        pages, cursor = [], None
        while True:
            page = reader.index(source, cursor)
            pages.append(page)
            cursor = page.next_cursor
            if cursor is None:
                break
        documents = [d for p in pages for d in p.documents]
        if as_json:
            print_json({"sources": pages[0].sources, "documents": [d.model_dump() for d in documents],
                        "total": len(documents), "warnings": pages[0].warnings})
            return
        for d in documents:
            typer.echo(f"{d.path}\t{d.sizeBytes}")
        for warning in pages[0].warnings:
            typer.echo(f"warning: {warning}", err=True)
        if not documents:
            where = f"in {source!r}" if source else "in the [docs] paths or at the top level (README, CHANGES ...)"
            typer.echo(f"No documentation found {where}.", err=True)
        return
    content = reader.content(path, chunk)
    if as_json:
        print_json(content.model_dump())
        return
    typer.echo(content.content, nl=not content.content.endswith("\n") and bool(content.content))
    for warning in content.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if content.chunk < content.totalChunks:
        typer.echo(f"(chunk {content.chunk} of {content.totalChunks}; next: --chunk {content.chunk + 1})", err=True)


def register(app: typer.Typer) -> None:
    """Add `ctx show` and `ctx docs` to the CLI."""
    app.command("show")(show)
    app.command("docs")(docs)
