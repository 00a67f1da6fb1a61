"""The `ctx` command (serve stage): the app its command modules register on, `ctx run index`, `ctx sql`, `ctx trust` and the entry point."""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlake import __version__
from ctxlake.errors import (
    ConfigError,
    CtxError,
    InputError,
    asks_json,
    error_document,
)
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import CTX_DIR, resolve_root
from ctxlake.serve.cli import eval as cli_eval
from ctxlake.serve.cli import graph as cli_graph
from ctxlake.serve.cli import handoff as cli_handoff
from ctxlake.serve.cli import hooks as cli_hooks
from ctxlake.serve.cli import lake as cli_lake
from ctxlake.serve.cli import mcp as cli_mcp
from ctxlake.serve.cli import memory as cli_memory
from ctxlake.serve.cli import read as cli_read
from ctxlake.serve.cli import registry as cli_registry
from ctxlake.serve.cli import stats as cli_stats
from ctxlake.serve.cli.base import (
    _prefect_quietly,
    bound_writer_heap,
    ensure_project,
    start_prefect_shielded,
    without_heartbeats,
)
from ctxlake.serve.cli.schedule import schedule_app
from ctxlake.serve.cli.service import register as register_service
from ctxlake.serve.cli.sources import register as register_sources
from ctxlake.serve.cli.ui import register as register_ui

# When this command started (epoch seconds); run() sets it, main() moves it to the process start.
_started_at = time.time()

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
app.add_typer(schedule_app, name="schedule")
register_service(app)
register_ui(app)

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"ctxlake {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", "-V", is_eager=True, callback=_print_version,
                                          help="print the version and exit")] = False,
) -> None:
    """ctxlake: a local context lake for AI coding agents."""


WATCH_PURPOSE = "ctx run index --watch"


def _overrides(**sections: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {k: v for k, v in values.items() if v is not None} for name, values in sections.items()}


@run_app.command("index")
def run_index(
    path: Annotated[Path | None, typer.Argument(help="project folder (default: this project)")] = None,
    force: Annotated[bool, typer.Option("--force", help="rebuild and re-embed everything")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="after indexing, keep the index fresh until Ctrl-C")] = False,
    wait: Annotated[float, typer.Option("--wait", min=0, help="seconds to wait for another indexer")] = 0.0,
    no_embed: Annotated[bool, typer.Option("--no-embed", help="chunk and keyword-index only")] = False,
    model: Annotated[str | None, typer.Option("--model", help="embedding profile or model")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="local, openai, gemini")] = None,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="show Prefect's logs")] = False,
    allow_home: Annotated[bool, typer.Option(
        "--allow-home", help="index even when the folder is your home folder or a filesystem root")] = False,
) -> None:
    """Index the project (incremental: only changed files are chunked and embedded)."""
    started = time.perf_counter()
    root = resolve_root(path, for_write=True, allow_home=allow_home)
    if ensure_project(root):
        typer.echo(f"Created {root / CTX_DIR}/ (config.toml, knowledge/; the lake is gitignored).", err=True)
    settings = load_settings(root, _overrides(embed={"model": model, "provider": provider}))
    from ctxlake.serve.api.watched import project_freshness
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
            typer.echo(f"Took over the lock of an indexer that ended without releasing it (pid {lock.took_over_from}: killed or crashed).", err=True)
        if watch:
            import signal

            from ctxlake.tasks.watching import stop_on_interrupt

            # A shell starts background jobs with SIGINT ignored and Python keeps that; a watcher
            # must still stop on Ctrl-C or `kill -INT`, whoever started it.
            signal.signal(signal.SIGINT, stop_on_interrupt)
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose, watch=True)
        elif not force:
            # Decided before Prefect starts (its temporary server costs ~10 s): a no-op run
            # must return at once.
            # In the service a watched project's answer comes from its watcher, without a walk.
            fresh = project_freshness(settings)
            state = IndexState.read(settings.lake_dir)
            same_model = state is not None and state.model_id == make_embedder(
                settings.embed, settings.models_dir).model_id
            # With --no-embed, chunks waiting for vectors are expected, not work to do.
            only_vectors_pending = no_embed and fresh.reason.endswith("still to embed")
            from ctxlake.tasks.lake import missing_tables
            from ctxlake.tasks.store import FTS_TAG

            fts_current = state is not None and state.fts == FTS_TAG  # else the BM25 index needs a rebuild
            # A table deleted from the lake is not "up to date", whatever the files say.
            whole = not missing_tables(settings.lake_dir, settings.index.graph)
            if same_model and fts_current and whole and (fresh.up_to_date or only_vectors_pending):
                if fresh.tree is not None and state is not None and state.clean:
                    from ctxlake.tasks.freshness import follow_unindexed_changes

                    follow_unindexed_changes(settings.lake_dir, PROJECT_SOURCE, fresh.tree, state)
                took = time.perf_counter() - started
                if as_json:
                    from ctxlake.serve.cli.render import print_json

                    print_json({"up_to_date": True, "root": str(root), "seconds": round(took, 3)})
                else:
                    typer.echo(f"Up to date: nothing changed in {root} (checked in {took:.2f} s).")
                return
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose)
        else:
            report = _run_flow(settings, force=force, embed=not no_embed, verbose=verbose)
    finally:
        lock.release()
    wall = _since_process_start()
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({**report.as_dict(), "wall_seconds": round(wall, 3),
                    "startup_seconds": round(_startup(report, wall), 3)})
        return
    if watch:
        typer.echo(f"Watched {report.root} for {report.seconds:.0f} s: +{report.added} new, ~{report.modified} "
                   f"changed, -{report.removed} removed files; {report.embedded:,} chunks embedded.")
        return
    _print_report(report, wall)


def _since_process_start() -> float:
    """Wall time since `ctx` started (for the console script: the process, interpreter start and
    imports included): what a user waited, unlike the flow's own clock."""
    return max(0.0, time.time() - _started_at)


def _startup(report: Any, wall: float) -> float:
    """What the run's own clock did not see: Python and Prefect starting, the lock, the scan
    before the flow; the one-time model distillation is reported on its own."""
    return max(0.0, wall - report.seconds - report.model_setup_s)


def _run_flow(settings: Settings, *, force: bool, embed: bool, verbose: bool, watch: bool = False) -> Any:
    _prefect_quietly(verbose)
    from ctxlake.serve.cli.render import stage_reporter
    from ctxlake.tasks.progress import use_reporter

    bound_writer_heap()
    with stage_reporter() as rich, use_reporter(rich):
        rich.start("prefect", None, "starting")
        from ctxlake.flows.index_code import index_code

        start_prefect_shielded()
        rich.finish("prefect")
        if watch:
            from ctxlake.flows.watch_code import watch_code

            return watch_code(settings)
        with without_heartbeats():
            return index_code(settings, force=force, embed=embed)


def _on_device(report: Any) -> str:
    device, batch = getattr(report, "embed_device", ""), getattr(report, "embed_batch", 0)
    return f" (on {device}, {batch} per batch)" if device and batch else ""


def _print_report(report: Any, wall: float) -> None:
    skipped = ", ".join(f"{n} {why}" for why, n in sorted(report.skipped.items())) or "none"
    typer.echo(
        f"Indexed {report.root}: {report.files_seen:,} files seen "
        f"(+{report.added} new, ~{report.modified} changed, -{report.removed} removed; skipped: {skipped})."
    )
    typer.echo(
        f"Chunks: {report.chunks_inserted:,} written, {report.chunks_deleted:,} removed; vectors: "
        f"{report.embedded:,} embedded{_on_device(report)}, {report.vectors_from_cache:,} from cache"
        + (f", {report.vectors_unchanged:,} rows' vectors unchanged (not rewritten)." if report.vectors_unchanged
           else ".")
    )
    setup = f", {report.model_setup_s:.1f} s distilling the static model once" if report.model_setup_s >= 0.05 else ""
    typer.echo(f"Done in {wall:.1f} s: {report.seconds:.1f} s indexing (keyword search ready after "
               f"{report.keyword_ready_s:.1f} s), {_startup(report, wall):.1f} s starting Python and Prefect{setup}.")
    if report.executor != "local":
        typer.echo(f"Ran on {report.executor}.")
    secret_files = report.skipped.get("secret", 0)
    if secret_files or report.secrets_masked:
        typer.echo(f"Secrets: {secret_files:,} file(s) skipped by name (.env*, keys, credentials; "
                   f"[index] secret_files = \"mask\" indexes them masked), "
                   f"{report.secrets_masked:,} value(s) masked in the files indexed.")
    for warning in report.warnings[:10]:
        typer.echo(f"warning: {warning}", err=True)
    if len(report.warnings) > 10:
        typer.echo(f"warning: … and {len(report.warnings) - 10} more (see `ctx status --json`)", err=True)


cli_lake.register(app)
cli_eval.register(app)
cli_read.register(app)
cli_stats.register(app)
cli_graph.register(app)


@app.command()
def sql(
    statement: Annotated[str, typer.Argument(help="a read-only SQL statement, e.g. \"SELECT lang, count(*) FROM files GROUP BY 1\"")],
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, help="at most this many rows (capped by sql.max_rows)")] = 1000,
    timeout: Annotated[float | None, typer.Option(
        "--timeout", min=0.001, help="seconds before the statement is stopped (default: sql.timeout_s, 60)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Query the lake's tables with DuckDB (files, chunks, knowledge, ...; memory's messages, sessions)."""
    settings = load_settings(resolve_root(None, for_write=False), _overrides(sql={"timeout_s": timeout}))
    from ctxlake.serve.api.analytics import run_sql

    result = run_sql(settings.lake_dir, statement, limit, memory_dir=settings.memory_dir, bounds=settings.sql)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(result)
        return
    from rich.table import Table

    from ctxlake.serve.cli.render import plain, stdout_console

    table = Table(show_lines=False)
    for column in result["columns"]:
        table.add_column(plain(column))
    for row in result["rows"]:
        table.add_row(*(plain(v) for v in row))
    console = stdout_console()
    console.print(table)
    if result["capped"]:
        typer.echo(f"(first {result['row_count']:,} rows: [sql] max_rows caps a result; aggregate or "
                   "filter in SQL instead)", err=True)
    elif result["truncated"]:
        typer.echo(f"(first {result['row_count']:,} rows; raise --limit for more)", err=True)


@app.command()
def trust(
    show: Annotated[bool, typer.Option("--show", help="say whether the config is trusted; change nothing")] = False,
    revoke: Annotated[bool, typer.Option("--revoke", help="stop trusting it")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Trust this project's .ctx/config.toml as it is now, so its commands may run (like direnv allow),
    and the sources in .ctx/sources.toml that read folders outside the project."""
    from ctxlake.schemas import trust as trust_store
    from ctxlake.schemas.config import read_config_bytes, read_project_config
    from ctxlake.schemas.roots import check_ctx_links, default_home
    from ctxlake.schemas.sources import (
        load_registry,
        registry_path,
        trust_sources,
        untrusted_sources,
    )

    if show and revoke:
        raise InputError("--show and --revoke cannot be used together")
    root = resolve_root(None, for_write=False)
    check_ctx_links(root)  # trusting a file a clone linked in from elsewhere would trust that file
    home = default_home()
    path = root / CTX_DIR / "config.toml"
    registry = registry_path(root)
    if not path.is_file() and not registry.is_file():
        raise ConfigError(f"no config file at {path}", hint="`ctx run index` writes one")
    import tomllib

    content = read_config_bytes(path) if path.is_file() else b""  # one read: the bytes shown and hashed are the same
    try:
        parsed = tomllib.loads(content.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError):
        read_project_config(root, home)  # raises the loader's one-line parse error
        raise
    sources = load_registry(root)
    message = ""
    if revoke:
        message = "Revoked" if trust_store.revoke(path, home) else "Was not trusted"
        message += f": {path}; its command settings are ignored."
        if trust_store.revoke_sources(registry, home):
            message += f" Sources in {registry} that read outside the project are no longer read."
    elif not show:
        messages = []
        if path.is_file():
            # A file that cannot load is not left recorded as reviewed.
            digest = trust_store.trust(path, home, content)
            try:
                load_settings(root)
            except CtxError:
                trust_store.revoke(path, home)
                raise
            messages.append(f"Trusted {path} (sha256 {digest[:12]}); any change to the file untrusts it.")
        outside = untrusted_sources(root, home)
        if outside:
            trust_sources(root, home, outside)
            messages.append(f"Trusted source(s) {', '.join(s.name for s in outside)} of {registry} to read "
                            "outside the project; a changed origin untrusts it.")
        message = "\n".join(messages)
    if message and not as_json:
        typer.echo(message)
    st = trust_store.state(path, parsed, home)
    st.untrusted_sources = [s.name for s in untrusted_sources(root, home)]
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(st.as_dict())
    elif show:
        typer.echo(f"{path}: {st.summary}")
        for key in st.gated_keys:
            section, name = key.split(".", 1)
            typer.echo(f"  {key} = {parsed[section][name]!r}")
        for name in st.untrusted_sources:
            typer.echo(f"  sources.{name}: {sources[name].type} origin = {sources[name].origin!r}")


@app.command()
def version(as_json: JsonOpt = False) -> None:
    """Print the version."""
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"version": __version__})
        return
    typer.echo(f"ctxlake {__version__}")


cli_memory.register(app, run_app)
cli_handoff.register(app)
cli_hooks.register(app)
cli_registry.register(app)


@functools.cache
def _command() -> Any:
    """The click command typer builds from `app`: built once per process. typer builds it on every
    call, 60 ms of each command the service answers."""
    return typer.main.get_command(app)


class _Failure:
    """Renders a failed command, the one place that does: `ctx: error:` and `ctx: hint:` on stderr
    and, when the command was given `--json` and printed no document, the same as one JSON object
    on stdout, so a script reading stdout never gets nothing."""

    def __init__(self, argv: list[str]) -> None:
        self.printed: int | None = None
        if asks_json(argv):
            from ctxlake.serve.cli.render import json_documents

            self.printed = json_documents()

    def report(self, message: str, hint: str | None, code: int) -> int:
        typer.echo(f"ctx: error: {message}", err=True)
        if hint:
            typer.echo(f"ctx: hint: {hint}", err=True)
        self.document(message, hint, code)
        return code

    def interrupted(self) -> int:
        typer.echo("ctx: interrupted; the next run picks up where this one stopped.", err=True)
        self.document("interrupted", "the next run picks up where this one stopped", 130)
        return 130

    def document(self, message: str, hint: str | None, code: int) -> None:
        """The error as JSON on stdout, for a `--json` command that has printed nothing there."""
        if self.printed is None:
            return
        from ctxlake.serve.cli.render import json_documents, print_json

        if json_documents() == self.printed:
            with contextlib.suppress(OSError):  # stdout's reader is gone: nobody to tell
                print_json(error_document(message, hint, code))


def run(argv: list[str] | None = None, started_at: float | None = None, reuse: bool = False) -> int:
    """Run the CLI on `argv`; domain errors become one stderr line and a documented exit code
    (and, with `--json`, one JSON object on stdout). `reuse`: a long-lived process (the service)
    keeps the built command between calls."""
    global _started_at
    _started_at = time.time() if started_at is None else started_at
    failure = _Failure(sys.argv[1:] if argv is None else argv)
    try:
        return _run(argv, reuse, failure)
    except Exception as exc:  # a bug: the traceback follows on stderr, the script still gets its object
        failure.document(f"unexpected {exc.__class__.__name__}: {exc}",
                         "a bug: please report it with the traceback printed on stderr", 1)
        raise


def _run(argv: list[str] | None, reuse: bool, failure: _Failure) -> int:
    import click

    try:
        # Non-standalone typer returns an exit code for Exit, and turns Ctrl-C into Exit(130).
        # prog_name: in the service, argv[0] is the daemon's module, and help and usage errors named it.
        code = (_command()(args=argv, prog_name="ctx", standalone_mode=False) if reuse
                else app(args=argv, prog_name="ctx", standalone_mode=False))
    except CtxError as exc:
        return failure.report(exc.message, exc.hint, exc.exit_code)
    except KeyboardInterrupt:
        return failure.interrupted()
    except (click.exceptions.Exit, typer.Exit) as exc:
        return exc.exit_code
    except (click.exceptions.Abort, typer.Abort):
        typer.echo("ctx: aborted.", err=True)
        failure.document("aborted", None, 130)
        return 130
    except (click.exceptions.ClickException, typer.TyperException) as exc:
        # typer vendors its own click: its usage errors (unknown option or command, missing or
        # out-of-range argument) derive from TyperException, not from click's ClickException.
        show = getattr(exc, "show", None)
        if callable(show):
            show()
        else:
            typer.echo(f"ctx: error: {exc}", err=True)
        code = int(getattr(exc, "exit_code", 2))
        where = getattr(exc, "ctx", None)  # the command a usage error belongs to
        failure.document(exc.format_message(), f"see `{where.command_path if where else 'ctx'} --help`", code)
        return code
    except (OSError, RuntimeError, ValueError) as exc:
        from ctxlake.tasks.lake import lake_failure

        lake_error = lake_failure(exc)
        if lake_error is None or (argv is not None and ("-v" in argv or "--verbose" in argv)):
            raise  # not a storage failure: a bug, keep its traceback (or -v asked for it)
        return failure.report(lake_error.message, lake_error.hint, lake_error.exit_code)
    if code == 130:
        return failure.interrupted()
    return code if isinstance(code, int) else 0


def main() -> None:
    """Console entry point (`ctx`)."""
    import psutil

    try:
        started = psutil.Process().create_time()
    except psutil.Error:
        started = None
    sys.exit(run(started_at=started))
