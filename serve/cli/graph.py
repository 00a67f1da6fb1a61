"""`ctx def`, `ctx refs`, `ctx related`, `ctx outline`: the symbol graph's readers (serve/api/graph.py).

Each reads one source, the project by default (`--source NAME` for another); lines of another
source start with `[NAME] `, as `ctx search` prints them."""

from __future__ import annotations

from typing import Annotated

import typer

from ctxlake.schemas.config import load_settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import resolve_root
from ctxlake.serve.cli.base import typed_path_read

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
LimitOpt = Annotated[int, typer.Option("-n", "--limit", min=1, max=200, help="at most this many results")]
SourceOpt = Annotated[str, typer.Option("--source", help="read this source (see `ctx list`) instead of the project")]
PATH_HELP = ("an indexed file, relative to the current folder (with --source: to that source's root), "
             "or absolute inside the project")


def _reader(source: str = PROJECT_SOURCE):  # type: ignore[no-untyped-def]
    from ctxlake.serve.api.graph import GraphReader
    from ctxlake.serve.api.source_queries import check_names

    settings = load_settings(resolve_root(None, for_write=False))
    check_names(settings, [source])
    return GraphReader(settings.lake_dir, settings.root)


def tag(source: str) -> str:
    """`[NAME] ` before a path of another source than the project, as `ctx search` shows it."""
    return "" if source == PROJECT_SOURCE else f"[{source}] "


def _json(model: object) -> None:
    from ctxlake.serve.cli.render import print_json

    print_json(model.model_dump())  # type: ignore[attr-defined]


def definition(
    symbol: Annotated[str, typer.Argument(help="a name or qualified name, e.g. Query.filter")],
    from_path: Annotated[str | None, typer.Option(
        "--from", help="the file asking, a path as for `ctx related`: its imports rank first")] = None,
    limit: LimitOpt = 10,
    source: SourceOpt = PROJECT_SOURCE,
    as_json: JsonOpt = False,
) -> None:
    """Where SYMBOL is defined, best first, with how sure the first answer is."""
    reader = _reader(source)
    # An asking file the index does not hold would change nothing, silently: it is an error.
    asking = (typed_path_read(from_path, reader.root, lambda p: reader.indexed_path(p, source), source)
              if from_path is not None else None)
    answer = reader.find_definition(symbol, asking, limit, source=source)
    if as_json:
        _json(answer)
        return
    for d in answer.definitions:
        typer.echo(f"{tag(d.source)}{d.path}:{d.start_line}\t{d.kind} {d.qualname}\t{d.signature}")
    note = "ambiguous, " if answer.ambiguous else ""
    typer.echo(f"({note}confidence {answer.confidence:.2f}: {answer.reason})", err=True)


def refs(
    symbol: Annotated[str, typer.Argument(help="a name or qualified name")],
    offset: Annotated[int, typer.Option("--offset", min=0, help="skip this many (paging)")] = 0,
    limit: LimitOpt = 20,
    no_imports: Annotated[bool, typer.Option("--no-imports", help="leave out import lines")] = False,
    source: SourceOpt = PROJECT_SOURCE,
    as_json: JsonOpt = False,
) -> None:
    """Where SYMBOL is used: path:line, the enclosing symbol and the line."""
    page = _reader(source).find_references(symbol, offset, limit, include_imports=not no_imports, source=source)
    if as_json:
        _json(page)
        return
    for r in page.references:
        mark = "" if r.resolved else "?"
        typer.echo(f"{tag(r.source)}{r.path}:{r.line}{mark}\t{r.kind}\t{r.enclosing or '-'}\t{r.snippet}")
    if page.total == 0:  # a name the index does not know at all is an error above: this one is only defined
        where = "the project" if source == PROJECT_SOURCE else f"source {source!r}"
        typer.echo(f"no references to {symbol!r} in {where}" + (" other than imports" if no_imports else "")
                   + "; `ctx def` shows where it is defined", err=True)
        return
    more = f"; next: --offset {page.next_offset}" if page.next_offset is not None else ""
    typer.echo(f"({len(page.references)} of {page.total}{more}; ? = file not linked to a definition by imports)",
               err=True)


def related(
    path: Annotated[str, typer.Argument(help=PATH_HELP)],
    limit: LimitOpt = 30,
    source: SourceOpt = PROJECT_SOURCE,
    as_json: JsonOpt = False,
) -> None:
    """Files PATH imports, files importing it, and files changed with it (when co-change is indexed)."""
    reader = _reader(source)
    answer = typed_path_read(path, reader.root, lambda p: reader.related_files(p, limit, source=source), source)
    if as_json:
        _json(answer)
        return
    for r in answer.related:
        weight = f"\t{r.weight:.3f}" if r.relation == "cochange" else ""
        typer.echo(f"{r.relation}\t{tag(answer.source)}{r.path}{weight}")
    if not answer.related:
        typer.echo(f"no related files for {tag(answer.source)}{answer.path}: no imports of indexed files, no "
                   "importers, no files changed in the same commits of the git history", err=True)
    if answer.unresolved_imports:
        typer.echo(f"(not in the index: {', '.join(answer.unresolved_imports[:10])})", err=True)


def outline(
    path: Annotated[str, typer.Argument(help=PATH_HELP)],
    limit: LimitOpt = 200,
    source: SourceOpt = PROJECT_SOURCE,
    as_json: JsonOpt = False,
) -> None:
    """The definitions of PATH as a tree, with lines and signatures."""
    reader = _reader(source)
    answer = typed_path_read(path, reader.root, lambda p: reader.file_outline(p, limit, source=source), source)
    if as_json:
        _json(answer)
        return
    for item in answer.items:
        typer.echo(f"{'  ' * item.depth}{item.start_line}-{item.end_line}\t{item.signature}")


def register(app: typer.Typer) -> None:
    """Add `ctx def`, `ctx refs`, `ctx related` and `ctx outline` to the CLI."""
    app.command("def")(definition)
    app.command("refs")(refs)
    app.command("related")(related)
    app.command("outline")(outline)
