"""The `ctx` command: parses arguments, calls serve/queries.py or starts a flow, renders the answer."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlake import __version__
from ctxlake.errors import CtxError, InputError
from ctxlake.schemas.config import (
    CTX_DIR,
    Settings,
    default_config_toml,
    load_settings,
    resolve_root,
)
from ctxlake.serve import cli_eval, cli_handoff, cli_mcp, cli_memory
from ctxlake.serve.cli_sources import register as register_sources

app = typer.Typer(
    name="ctx",
    help="ctxlake: a local context lake for AI coding agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
run_app = typer.Typer(help="Run a pipeline (a Prefect flow).", no_args_is_help=True)
app.add_typer(run_app, name="run")
cli_mcp.register(app)
register_sources(app)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


WATCH_PURPOSE = "ctx run index --watch"


def _overrides(**sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {k: v for k, v in values.items() if v is not None} for name, values in sections.items()}


def ensure_project(root: Path) -> bool:
    """Create .ctx/ with a commented config and a .gitignore for the lake; True when created now."""
    ctx_dir = root / CTX_DIR
    created = not ctx_dir.exists()
    (ctx_dir / "knowledge").mkdir(parents=True, exist_ok=True)
    config = ctx_dir / "config.toml"
    if not config.exists():
        config.write_text(default_config_toml(), encoding="utf-8")
    ignore = ctx_dir / ".gitignore"
    if not ignore.exists():
        # The lake is a build artefact; config.toml and knowledge/ are meant to be committed.
        ignore.write_text("lake/\n", encoding="utf-8")
    return created


def _prefect_quietly(verbose: bool) -> None:
    """Prefect reads these at import: keep its INFO chatter and analytics off unless asked."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    # Only the terminal handler: a failed stage is one `ctx: error:` line here (a bug still
    # prints its traceback), while a Prefect server a user runs still receives the logs.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT", "false")
    # The first run in a new PREFECT_HOME migrates its database; on a busy 2-core machine the
    # temporary server's start then overruns Prefect's 20 s default and the run fails.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


@run_app.command("index")
def run_index(
    path: Annotated[Path | None, typer.Argument(help="project folder (default: this project)")] = None,
    force: Annotated[bool, typer.Option("--force", help="rebuild and re-embed everything")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="after indexing, keep the index fresh until Ctrl-C")] = False,
    wait: Annotated[float, typer.Option("--wait", help="seconds to wait for another indexer")] = 0.0,
    no_embed: Annotated[bool, typer.Option("--no-embed", help="chunk and keyword-index only")] = False,
    model: Annotated[str | None, typer.Option("--model", help="embedding profile or model")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="local, openai, gemini")] = None,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="show Prefect's logs")] = False,
) -> None:
    """Index the project (incremental: only changed files are chunked and embedded)."""
    started = time.perf_counter()
    root = resolve_root(path, for_write=True)
    if ensure_project(root):
        typer.echo(f"Created {root / CTX_DIR}/ (config.toml, knowledge/; the lake is gitignored).", err=True)
    settings = load_settings(root, _overrides(embed={"model": model, "provider": provider}))
    from ctxlake.schemas.tables import PROJECT_SOURCE
    from ctxlake.tasks import freshness
    from ctxlake.tasks.embedders import make_embedder
    from ctxlake.tasks.lake import IndexState, WriterLock

    lock = WriterLock(settings.lake_dir, purpose=WATCH_PURPOSE if watch else "ctx run index")
    watcher = lock.held_by_other()
    if watcher and watcher.get("purpose") == WATCH_PURPOSE and not (force or watch):
        typer.echo(f"A watcher (pid {watcher.get('pid')}) keeps {root} up to date; nothing to do.")
        return
    lock.acquire(wait_s=wait)
    try:
        if lock.took_over_from:
            typer.echo(f"Took over the lock of a finished indexer (pid {lock.took_over_from}).", err=True)
        if watch:
            import signal

            # A shell starts background jobs with SIGINT ignored and Python keeps that; a watcher
            # must still stop on Ctrl-C or `kill -INT`, whoever started it.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose, watch=True)
        elif not force:
            # Decided before Prefect starts (its temporary server costs ~10 s): a no-op run
            # must return at once.
            fresh = freshness.check(settings.lake_dir, PROJECT_SOURCE, root, settings.index)
            state = IndexState.read(settings.lake_dir)
            same_model = state is not None and state.model_id == make_embedder(
                settings.embed, settings.models_dir).model_id
            # With --no-embed, chunks waiting for vectors are expected, not work to do.
            only_vectors_pending = no_embed and fresh.reason.endswith("still to embed")
            from ctxlake.tasks.store import FTS_TAG

            fts_current = state is not None and state.fts == FTS_TAG  # else the BM25 index needs a rebuild
            if same_model and fts_current and (fresh.up_to_date or only_vectors_pending):
                took = time.perf_counter() - started
                if as_json:
                    from ctxlake.serve.render import print_json

                    print_json({"up_to_date": True, "root": str(root), "seconds": round(took, 3)})
                else:
                    typer.echo(f"Up to date: nothing changed in {root} (checked in {took:.2f} s).")
                return
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose)
        else:
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose)
    finally:
        lock.release()
    if as_json:
        from ctxlake.serve.render import print_json

        print_json(report.as_dict())
        return
    if watch:
        typer.echo(f"Watched {report.root} for {report.seconds:.0f} s: +{report.added} new, ~{report.modified} "
                   f"changed, -{report.removed} removed files; {report.embedded:,} chunks embedded.")
        return
    _print_report(report)


def _run_flow(settings: Settings, *, force: bool, embed: bool, verbose: bool, watch: bool = False) -> Any:
    _prefect_quietly(verbose)
    from ctxlake.serve.render import RichReporter
    from ctxlake.tasks.progress import use_reporter

    with RichReporter() as rich, use_reporter(rich):
        rich.start("prefect", None, "starting")
        from ctxlake.flows.index_code import index_code

        rich.finish("prefect")
        if watch:
            from ctxlake.flows.watch_code import watch_code

            return watch_code(settings)
        return index_code(settings, force=force, embed=embed)


def _print_report(report: Any) -> None:
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
    typer.echo(
        f"Indexed {report.root}: {report.files_seen:,} files seen "
        f"(+{report.added} new, ~{report.modified} changed, -{report.removed} removed; skipped: {skipped})."
    )
    typer.echo(
        f"Chunks: {report.chunks_inserted:,} written, {report.chunks_deleted:,} removed; vectors: "
        f"{report.embedded:,} embedded, {report.vectors_from_cache:,} from cache."
    )
    typer.echo(f"Keyword search ready after {report.keyword_ready_s:.1f} s; done in {report.seconds:.1f} s.")
    for warning in report.warnings[:10]:
        typer.echo(f"warning: {warning}", err=True)
    if len(report.warnings) > 10:
        typer.echo(f"warning: … and {len(report.warnings) - 10} more (see `ctx status --json`)", err=True)


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="what to look for: words, identifiers, a question")],
    limit: Annotated[int | None, typer.Option("-n", "--limit", help="number of results")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="hybrid | keyword | semantic | fuzzy")] = None,
    path_glob: Annotated[str | None, typer.Option("--path", help="only paths matching this glob, e.g. 'src/**/*.py'")] = None,
    lang: Annotated[str | None, typer.Option("--lang", help="only this language, e.g. python")] = None,
    sources: Annotated[str | None, typer.Option("--sources", help="comma-separated source names")] = None,
    bm25_weight: Annotated[float | None, typer.Option("--bm25-weight", help="keyword share in hybrid, 0..1")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Search the project's index."""
    if mode is not None and mode not in ("hybrid", "keyword", "semantic", "fuzzy"):
        raise InputError(f"unknown --mode {mode!r}", hint="hybrid, keyword, semantic or fuzzy")
    settings = load_settings(resolve_root(None, for_write=False))
    from ctxlake.serve import queries

    lake = queries.Lake(settings)
    if sources:
        from ctxlake.serve.source_queries import check_names, parse_names

        check_names(settings, parse_names(sources))
    result = queries.search(
        lake, query, mode=mode, limit=limit, path_glob=path_glob, lang=lang,  # type: ignore[arg-type]
        sources=[s.strip() for s in sources.split(",") if s.strip()] if sources else None,
        bm25_weight=bm25_weight,
    )
    if as_json:
        from ctxlake.serve.render import print_json

        print_json(result.model_dump())
        return
    from ctxlake.serve.render import print_search, stdout_console

    print_search(result, stdout_console())
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if result.stale:
        shown = ", ".join(result.stale_paths[:5]) + (" …" if len(result.stale_paths) > 5 else "")
        typer.echo(f"warning: {len(result.stale_paths)} file(s) changed since the last index "
                   f"(run `ctx run index`): {shown}", err=True)


@app.command()
def status(as_json: JsonOpt = False) -> None:
    """Files, chunks, languages, model, last run, stale files, lake size."""
    settings = load_settings(resolve_root(None, for_write=False))
    from ctxlake.serve import queries

    st = queries.status(settings)
    if as_json:
        from ctxlake.serve.render import print_json

        print_json(st.model_dump())
        return
    from ctxlake.serve.render import print_status, stdout_console

    print_status(st, stdout_console())


@app.command()
def clean(yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False) -> None:
    """Remove this project's lake (.ctx/lake); config.toml and knowledge/ stay."""
    import shutil

    from ctxlake.serve.render import human_bytes

    settings = load_settings(resolve_root(None, for_write=False))
    lake = settings.lake_dir
    if not lake.exists():
        typer.echo(f"Nothing to remove: {lake} does not exist.")
        return
    from ctxlake.serve.queries import _folder_bytes
    from ctxlake.tasks.lake import WriterLock

    size = human_bytes(_folder_bytes(lake))
    if not yes:
        if not sys.stdin.isatty():
            raise InputError(f"refusing to remove {lake} without --yes (no terminal to ask)")
        if not typer.confirm(f"Remove the index at {lake} ({size})?", default=False):
            typer.echo("Kept.")
            return
    lock = WriterLock(lake, purpose="ctx clean").acquire()
    try:
        for child in lake.iterdir():
            if child.name != "writer.lock":
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    finally:
        lock.release()
    shutil.rmtree(lake, ignore_errors=True)
    typer.echo(f"Removed {lake} ({size}).")


cli_eval.register(app)


@app.command()
def sql(
    statement: Annotated[str, typer.Argument(help="a read-only SQL statement, e.g. \"SELECT lang, count(*) FROM files GROUP BY 1\"")],
    limit: Annotated[int, typer.Option("-n", "--limit", help="at most this many rows")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Query the lake's tables with DuckDB (files, chunks, knowledge, ...; memory's messages, sessions)."""
    settings = load_settings(resolve_root(None, for_write=False))
    from ctxlake.serve.analytics import run_sql

    result = run_sql(settings.lake_dir, statement, limit, memory_dir=settings.memory_dir)
    if as_json:
        from ctxlake.serve.render import print_json

        print_json(result)
        return
    from rich.table import Table

    from ctxlake.serve.render import stdout_console

    table = Table(*result["columns"], show_lines=False)
    for row in result["rows"]:
        table.add_row(*("" if v is None else str(v) for v in row))
    console = stdout_console()
    console.print(table)
    if result["truncated"]:
        typer.echo(f"(first {result['row_count']} rows; raise --limit for more)", err=True)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(f"ctxlake {__version__}")


cli_memory.register(app, run_app)
cli_handoff.register(app)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv`; domain errors become one stderr line and a documented exit code."""
    import click

    try:
        # Non-standalone typer returns an exit code for Exit, and turns Ctrl-C into Exit(130).
        code = app(args=argv, standalone_mode=False)
    except CtxError as exc:
        typer.echo(f"ctx: error: {exc.message}", err=True)
        if exc.hint:
            typer.echo(f"ctx: hint: {exc.hint}", err=True)
        return exc.exit_code
    except KeyboardInterrupt:
        typer.echo("ctx: interrupted; the next run picks up where this one stopped.", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        typer.echo("ctx: aborted.", err=True)
        return 130
    except click.exceptions.ClickException as exc:
        exc.show()
        return exc.exit_code
    if code == 130:
        typer.echo("ctx: interrupted; the next run picks up where this one stopped.", err=True)
    return code if isinstance(code, int) else 0


def main() -> None:
    """Console entry point (`ctx`)."""
    sys.exit(run())
