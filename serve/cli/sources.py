"""`ctx add / add-docs / update / list / remove / ask / chat`: parse, call the sources flow or serve/api/source_queries.py, render."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ctxlake.errors import AgentError, CtxError, InputError, LockBusyError, SourceError
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.schemas.roots import resolve_root
from ctxlake.schemas.sources import (
    SourceSpec,
    drop_source,
    load_registry,
    registry_path,
    save_source,
    trust_sources,
    validate_name,
)
from ctxlake.schemas.trust import revoke_sources

if TYPE_CHECKING:
    from ctxlake.serve.api.models_sources import SourceList
    from ctxlake.tasks.source_store import SyncReport

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
WaitOpt = Annotated[float, typer.Option("--wait", min=0, help="seconds to wait for another indexer")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="show Prefect's logs")]
RefOpt = Annotated[str | None, typer.Option("--ref", help="git branch, tag or full commit sha (default: the default branch)")]
PathsOpt = Annotated[list[str] | None, typer.Option("--paths", help="only these folders/files (repeat or comma-separate)")]
ExcludeOpt = Annotated[list[str] | None, typer.Option("--exclude", help="globs to skip, e.g. 'tests/**' (repeat or comma-separate)")]
TypeOpt = Annotated[str | None, typer.Option("--type", help="git | local | web (default: guessed from ORIGIN)")]
SourcesOpt = Annotated[str | None, typer.Option("-s", "--sources", help="comma-separated source names (default: all)")]
AgentOpt = Annotated[str | None, typer.Option("--agent", help="claude-code, gemini, opencode, codex, or one from config")]


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _sync(settings: Settings, specs: list[SourceSpec], wait: float, verbose: bool) -> list[SyncReport]:
    """Run the sync-sources flow under the lake's writer lock."""
    from ctxlake.serve.cli.base import _prefect_quietly, start_prefect_shielded
    from ctxlake.serve.cli.render import stage_reporter
    from ctxlake.tasks.lake import WriterLock
    from ctxlake.tasks.progress import use_reporter

    lock = WriterLock(settings.lake_dir, purpose="ctx update").acquire(wait_s=wait)
    try:
        _prefect_quietly(verbose)
        # A source that fails is reported once, by us; Prefect's console handler would add its
        # traceback. And a busy 2-core machine can need more than Prefect's 20 s to start its
        # temporary server. (setdefault: a user's own settings win.)
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "CRITICAL")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
        with stage_reporter() as rich, use_reporter(rich):
            rich.start("prefect", None, "starting")
            from ctxlake.flows.sync_sources import sync_sources

            start_prefect_shielded()
            rich.finish("prefect")
            return sync_sources(settings, specs)
    finally:
        lock.release()


def _update(settings: Settings, specs: list[SourceSpec], wait: float, verbose: bool) -> list[SyncReport]:
    """Sync the sources that may have changed; the rest are reported up to date, and the ones this
    project may not read (untrusted, a system folder) refused, without a flow."""
    from ctxlake.tasks.lake import WriterLock
    from ctxlake.tasks.source_store import SyncReport, read_sources, record_failure
    from ctxlake.tasks.sources import check_access, is_current, source_root

    rows = read_sources(settings.lake_dir)
    current: dict[str, SyncReport] = {}
    refused: dict[str, tuple[SourceSpec, CtxError]] = {}
    for spec in specs:
        row = rows.get(spec.name, {})
        try:
            check_access(spec, settings.root, settings.home)
        except CtxError as exc:
            refused[spec.name] = (spec, exc)  # not even a freshness scan, and no Prefect start for it
            continue
        root = source_root(settings, spec)
        if is_current(spec, root, settings.lake_dir, spec.index_settings(settings.index), row.get("status"),
                      float(settings.sources.git_timeout_s)):
            current[spec.name] = SyncReport(spec.name, spec.type, spec.origin, "ok", resolved=row.get("resolved"),
                                            ref_kind=row.get("ref_kind"), root=str(root))
    if refused:  # recorded as a sync would record them, so `ctx list` says the same
        lock = WriterLock(settings.lake_dir, purpose="ctx update").acquire(wait_s=wait)
        try:
            for name, (refused_spec, why) in refused.items():
                current[name] = record_failure(settings.lake_dir, refused_spec, rows.get(name), why)
        finally:
            lock.release()
    todo = [spec for spec in specs if spec.name not in current]
    synced = {r.name: r for r in _sync(settings, todo, wait, verbose)} if todo else {}
    return [current.get(spec.name) or synced[spec.name] for spec in specs]


def _forget(settings: Settings, name: str, spec: SourceSpec | None, wait: float) -> dict[str, Any]:
    """Delete a source's rows, snapshot and (unless another project uses it) its clone or pages."""
    from ctxlake.tasks.lake import WriterLock
    from ctxlake.tasks.source_store import forget_source
    from ctxlake.tasks.sources import release_storage, storage_dir

    lock = WriterLock(settings.lake_dir, purpose="ctx remove").acquire(wait_s=wait)
    try:
        chunks, files = forget_source(settings.lake_dir, name)
    finally:
        lock.release()
    storage: str | None = None
    if spec is not None and spec.type != "local":
        folder = storage_dir(settings.home, spec)
        # Two sources of one project with the same origin share the clone (its users are projects).
        sharing = [n for n, other in load_registry(settings.root).items()
                   if n != name and other.type == spec.type and storage_dir(settings.home, other) == folder]
        if sharing:
            storage = f"kept (source {sharing[0]} uses it)"
        else:
            storage = "deleted" if release_storage(folder, settings.root) else (
                "kept (another project uses it)" if folder.exists() else None)
    declared = drop_source(settings.root, name)
    revoke_sources(registry_path(settings.root), settings.home, name)
    return {"name": name, "chunks": chunks, "files": files, "storage": storage, "declared": declared}


def _print_reports(reports: list[SyncReport]) -> None:
    for r in reports:
        version = f" @ {r.resolved[:12]}" if r.resolved else ""
        if r.status == "failed":
            typer.echo(f"{r.name}: failed: {r.message}" + (f" ({r.hint})" if r.hint else ""), err=True)
            continue
        if r.index is None:
            line = f"{r.name}: up to date{version}"
        else:
            ix = r.index
            line = (f"{r.name}: synced{version}: +{ix['added']} ~{ix['modified']} -{ix['removed']} files, "
                    f"{ix['chunks_inserted']:,} chunks written, {ix['embedded']:,} embedded "
                    f"({ix['vectors_from_cache']:,} from cache) in {r.seconds:.1f} s")
        typer.echo(line)
        if r.status == "partial":
            typer.echo(f"{r.name}: partial: {r.message}", err=True)


def _outcome(reports: list[SyncReport], as_json: bool) -> None:
    """Render the reports; any failed or partial source makes the command fail (exit 9)."""
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"sources": [r.as_dict() for r in reports]})
    else:
        _print_reports(reports)
    bad = [r for r in reports if r.status != "ok"]
    if bad:
        what = ", ".join(f"{r.name} ({r.status})" for r in bad)
        raise SourceError(f"not every source synced: {what}", hint="see the messages above; `ctx list` shows each source's status")


def _print_sources(result: SourceList) -> None:
    if not result.sources:
        typer.echo("No sources yet: `ctx add NAME ORIGIN` adds a repository, a folder or web docs.")
        return
    rows = [("NAME", "TYPE", "ORIGIN", "REF -> RESOLVED", "FILES", "CHUNKS", "UPDATED", "STATUS")]
    for s in result.sources:
        ref = s.ref or ("default" if s.type == "git" else "-")
        resolved = f"{ref} -> {s.resolved[:12]}" if s.resolved else ref
        rows.append((s.name, (s.type or "-") + (" docs" if s.docs else ""), s.origin or "-", resolved, f"{s.files:,}",
                     f"{s.chunks:,}", (s.updated_at or "never")[:19].replace("T", " "), s.status or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for s in result.sources:
        if s.message:
            typer.echo(f"{s.name}: {s.message}", err=True)


def _add(name: str, origin: str | None, ref: str | None, paths: list[str] | None, exclude: list[str] | None,
         type_: str | None, docs: bool, wait: float, as_json: bool, verbose: bool) -> None:
    from ctxlake.serve.cli.base import ensure_project
    from ctxlake.tasks.sources import (
        classify_origin,
        name_for,
        overlap_with_project,
        refuse_system_folder,
    )

    root = resolve_root(None, for_write=True)
    named = origin is not None
    if origin is None:  # `ctx add ORIGIN`: the name comes from the origin, once it is classified
        origin = name
    else:
        validate_name(name)
    kind, normalised = classify_origin(origin, docs)
    if type_ is not None:
        if type_ not in ("git", "local", "web"):
            raise InputError(f"unknown --type {type_!r}", hint="git, local or web")
        kind = type_
        if kind == "local":
            normalised = str(Path(origin).expanduser().resolve())
            refuse_system_folder(Path(normalised))
    overlap = overlap_with_project(Path(normalised), root) if kind == "local" else None
    if not named:
        name = name_for(kind, normalised, docs)
    if name in load_registry(root):
        raise InputError(f"source {name!r} already exists",
                         hint=f"`ctx update {name}`, or `ctx remove {name}` first"
                         + ("" if named else "; or give this one another name: `ctx add NAME ORIGIN`"))
    if ref and kind != "git":
        raise InputError("--ref applies to git sources only")
    if paths and kind == "web":
        raise InputError("--paths applies to git and local sources")
    spec = SourceSpec(name=name, type=kind, origin=normalised, ref=ref,
                      paths=_split(paths), exclude=_split(exclude), docs=docs)
    if ensure_project(root):
        typer.echo(f"Created {root / '.ctx'}/ (config.toml, knowledge/; the lake is gitignored).", err=True)
    settings = load_settings(root)
    save_source(root, spec)
    # The user named this folder: theirs to read, unlike one a cloned sources.toml declares.
    trust_sources(root, settings.home, [spec])
    typer.echo(f"Adding {name} ({kind}: {normalised}{' @ ' + ref if ref else ''}) …", err=True)
    if overlap:
        typer.echo(f"warning: {overlap}", err=True)
    try:
        reports = _sync(settings, [spec], wait, verbose)
    except LockBusyError:
        drop_source(root, name)  # nothing was fetched or written yet
        revoke_sources(registry_path(root), settings.home, name)
        raise
    except BaseException:
        _forget(settings, name, spec, wait=30)
        raise
    first = reports[0]
    if first.status == "failed":
        # Nothing usable was fetched: leave no half-added source behind.
        _forget(settings, name, spec, wait=30)
        # Keep the failure's own kind: a bad --ref is bad input (2), an unreachable remote is not (9).
        kinds = {cls.exit_code: cls for cls in CtxError.__subclasses__()}
        raise kinds.get(first.exit_code or 0, SourceError)(f"cannot add {name}: {first.message}", hint=first.hint)
    _outcome(reports, as_json)


def register(app: typer.Typer) -> None:
    """Add the sources and subagent commands to the `ctx` app."""

    @app.command("add")
    def add(
        name: Annotated[str, typer.Argument(help=(
            "a short name for the source, e.g. langgraph; alone, it is the ORIGIN and the name is "
            "taken from it (the repository's or folder's name, a site's host)"))],
        origin: Annotated[str | None, typer.Argument(help="git URL, folder, or llms.txt / llms-full.txt URL")] = None,
        ref: RefOpt = None, paths: PathsOpt = None, exclude: ExcludeOpt = None, type_: TypeOpt = None,
        wait: WaitOpt = 0.0, as_json: JsonOpt = False, verbose: VerboseOpt = False,
    ) -> None:
        """Add a source (a repository, a folder, or web docs), fetch it and index it: `ctx add [NAME] ORIGIN`."""
        _add(name, origin, ref, paths, exclude, type_, False, wait, as_json, verbose)

    @app.command("add-docs")
    def add_docs(
        name: Annotated[str, typer.Argument(help=(
            "a short name for the docs, e.g. fastapi-docs; alone, it is the ORIGIN and the name is "
            "taken from it, with -docs after it"))],
        origin: Annotated[str | None, typer.Argument(
            help="a docs folder, a docs page URL, an llms.txt URL, or a git URL")] = None,
        ref: RefOpt = None, paths: PathsOpt = None, exclude: ExcludeOpt = None, type_: TypeOpt = None,
        wait: WaitOpt = 0.0, as_json: JsonOpt = False, verbose: VerboseOpt = False,
    ) -> None:
        """Add documentation: a folder or repository (only .md/.rst/.txt/... files) or web pages."""
        _add(name, origin, ref, paths, exclude, type_, True, wait, as_json, verbose)

    @app.command("update")
    def update(
        name: Annotated[str | None, typer.Argument(help="one source (default: all)")] = None,
        wait: WaitOpt = 0.0, as_json: JsonOpt = False, verbose: VerboseOpt = False,
    ) -> None:
        """Fetch sources again (git: shallow fetch; web: ETag/Last-Modified) and re-index what changed."""
        root = resolve_root(None, for_write=False)
        settings = load_settings(root)
        registry = load_registry(root)
        if name is not None and name not in registry:
            raise InputError(f"unknown source {name!r}", hint=f"known: {', '.join(sorted(registry)) or 'none'}")
        specs = [registry[name]] if name else list(registry.values())
        if not specs:
            typer.echo("No sources to update (add one with `ctx add NAME ORIGIN`).", err=True)
            if as_json:
                from ctxlake.serve.cli.render import print_json

                print_json({"sources": []})
            return
        _outcome(_update(settings, specs, wait, verbose), as_json)

    @app.command("list")
    def list_(as_json: JsonOpt = False) -> None:
        """Sources: type, origin, ref -> resolved version, files, chunks, last update, status."""
        from ctxlake.errors import NotIndexedError
        from ctxlake.serve.api.source_queries import list_sources
        from ctxlake.serve.service.engine import open_lake

        settings = load_settings(resolve_root(None, for_write=False))
        try:
            lake = open_lake(settings)  # the index's figures: embedded chunks, languages, last indexing
        except NotIndexedError:
            lake = None  # sources declared, none synced yet
        result = list_sources(settings, lake, with_project=False)
        if as_json:
            from ctxlake.serve.cli.render import print_json

            print_json(result.model_dump())
            return
        _print_sources(result)

    @app.command("remove")
    def remove(
        name: Annotated[str, typer.Argument(help="the source to remove")],
        wait: WaitOpt = 0.0, as_json: JsonOpt = False,
    ) -> None:
        """Remove a source: its rows in the index, its clone or pages (unless shared), its declaration."""
        from ctxlake.tasks.source_store import read_sources

        settings = load_settings(resolve_root(None, for_write=False))
        spec = load_registry(settings.root).get(name)
        row = read_sources(settings.lake_dir).get(name)
        if spec is None and row is None:
            raise InputError(f"unknown source {name!r}", hint="`ctx list` shows the sources")
        if spec is None and row is not None:
            spec = SourceSpec(name=name, type=row["type"], origin=row["origin"], ref=row.get("ref"),
                              paths=list(row.get("paths") or []), exclude=list(row.get("excludes") or []))
        done = _forget(settings, name, spec, wait)
        if as_json:
            from ctxlake.serve.cli.render import print_json

            print_json(done)
            return
        storage = f"; clone/pages {done['storage']}" if done["storage"] else ""
        typer.echo(f"Removed {name}: {done['chunks']:,} chunks, {done['files']:,} files{storage}.")

    @app.command("ask")
    def ask(
        typed: Annotated[str | None, typer.Argument(metavar="QUESTION", help="what to ask (or -q)")] = None,
        option: Annotated[str | None, typer.Option("-q", "--question", help="what to ask")] = None,
        sources: SourcesOpt = None, agent: AgentOpt = None,
        timeout: Annotated[float | None, typer.Option("--timeout", min=1, help="seconds before the agent is stopped")] = None,
        as_json: JsonOpt = False,
    ) -> None:
        """Ask a coding agent about some sources, run in a scratch folder that links only them (it runs as you: not a security sandbox)."""
        from ctxlake.serve.api import source_queries

        if (typed is None) == (option is None):
            raise InputError("give the question once: `ctx ask \"QUESTION\"` or `ctx ask -q \"QUESTION\"`")
        question = typed if typed is not None else option
        assert question is not None
        settings = load_settings(resolve_root(None, for_write=False))
        names = source_queries.parse_names(sources)
        source_queries.check_names(settings, names)
        typer.echo(f"Asking {agent or settings.agents.default_agent} (up to "
                   f"{timeout or settings.agents.timeout_s:.0f} s) …", err=True)
        result = source_queries.ask(settings, names, question, agent, timeout)
        if as_json:
            from ctxlake.serve.cli.render import print_json

            print_json(result.model_dump())
        else:
            hits = (f"{result.hits_in_prompt} search hits in its prompt" if result.indexed else
                    "no search hits in its prompt: this project has no index yet; `ctx run index` builds one")
            typer.echo(f"{result.agent} on {', '.join(result.sources)} ({hits})", err=True)
            typer.echo(result.answer, nl=not result.answer.endswith("\n"))
            if result.truncated:
                typer.echo("warning: the agent's output went over [agents] max_output_bytes and was cut", err=True)
        if result.exit_code != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["no stderr"]
            raise AgentError(f"agent {result.agent!r} exited with {result.exit_code}: {tail[0]}")

    @app.command("chat")
    def chat(sources: SourcesOpt = None, agent: AgentOpt = None) -> None:
        """Open an interactive agent session in a scratch folder linking the given sources (it runs as you: not a security sandbox)."""
        from ctxlake.serve.api import source_queries
        from ctxlake.tasks.agents import chat_agent

        settings = load_settings(resolve_root(None, for_write=False))
        names = source_queries.parse_names(sources)
        source_queries.check_names(settings, names)
        links = source_queries.resolve_links(settings, names)
        code = chat_agent(links, settings.agents, agent)
        if code != 0:
            raise AgentError(f"agent {agent or settings.agents.default_agent!r} exited with {code}")

