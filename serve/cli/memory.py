"""`ctx run ingest`, `ctx sessions`, `ctx session show`, `ctx context search`, `ctx knowledge`, `ctx remember`: parse, call serve/api/memory_sessions.py or context_search.py or the flow, render."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ctxlake.errors import InputError
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.schemas.roots import find_root, git_toplevel
from ctxlake.serve.cli.base import MAX_LIMIT, group_with_default

if TYPE_CHECKING:
    from ctxlake.serve.api.memory_lake import MemoryLake

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
ToolOpt = Annotated[list[str] | None, typer.Option("--tool", help="only this agent tool (repeatable): claude, codex, ...")]
AllOpt = Annotated[bool, typer.Option("--all-projects", help="every project's sessions, not just this one's")]

session_app = typer.Typer(help="One agent session (`ctx session REF` shows it).", no_args_is_help=True,
                          cls=group_with_default("show"))
context_app = typer.Typer(help="Search what agents said and decided (`ctx context QUERY` searches).",
                          no_args_is_help=True, cls=group_with_default("search"))


def _settings() -> Settings:
    """This project's settings; outside any project, the current folder (or its git work tree) is the scope."""
    cwd = Path.cwd()
    return load_settings(find_root(cwd) or git_toplevel(cwd) or cwd.resolve())


def _lake() -> tuple[Settings, MemoryLake]:
    from ctxlake.serve.api.memory_lake import MemoryLake

    settings = _settings()
    return settings, MemoryLake(settings)


def _print_json(data: Any) -> None:
    from ctxlake.serve.cli.render import print_json

    print_json(data)


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json")


# -- ctx run ingest ------------------------------------------------------------------------------


def run_ingest(
    sources: Annotated[list[str] | None, typer.Option("--from", help="read TOOL's logs from PATH (repeatable): --from claude=~/backup/claude")] = None,
    tools: ToolOpt = None,
    no_embed: Annotated[bool, typer.Option("--no-embed", help="store and keyword-index only")] = False,
    force: Annotated[bool, typer.Option("--force", help="run even when nothing changed, and compact the tables")] = False,
    wait: Annotated[float, typer.Option("--wait", min=0, help="seconds to wait for another writer")] = 0.0,
    as_json: JsonOpt = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="show Prefect's logs")] = False,
) -> None:
    """Ingest every agent tool's conversation logs (incremental) and this project's knowledge files."""
    started = time.perf_counter()
    from ctxlake.schemas.roots import CTX_DIR, resolve_root
    from ctxlake.serve.cli.base import ensure_project

    root = resolve_root(None, for_write=True)
    if ensure_project(root):
        typer.echo(f"Created {root / CTX_DIR}/ (config.toml, knowledge/; the lake is gitignored).", err=True)
    overrides = {"memory": {"tools": list(tools)}} if tools else None
    settings = load_settings(root, overrides)
    from ctxlake.tasks import memory_state
    from ctxlake.tasks.lake import WriterLock
    from ctxlake.tasks.scrape import parse_from, resolve_roots

    roots = resolve_roots(settings.memory, Path.home(), parse_from(sources or []))
    model_id = memory_state.configured_model_id(settings)
    memory_lock = WriterLock(settings.memory_dir, purpose="ctx run ingest").acquire(wait_s=wait)
    try:
        project_lock = WriterLock(settings.lake_dir, purpose="ctx run ingest").acquire(wait_s=wait)
        try:
            if force:
                report = _run_flow(settings, roots, embed=not no_embed, optimize=force, verbose=verbose)
            else:
                # Decided before Prefect starts (its temporary server costs seconds): a no-op run returns at once.
                fresh = memory_state.check(settings, roots, model_id)
                if fresh.up_to_date and not (no_embed is False and _pending(settings)):
                    took = time.perf_counter() - started
                    if as_json:
                        _print_json({"up_to_date": True, "files_seen": fresh.plan.store_files, "seconds": round(took, 3)})
                    else:
                        typer.echo(f"Up to date: {fresh.plan.store_files:,} log files unchanged (checked in {took:.2f} s).")
                    return
                with memory_state.planned(fresh, roots):  # the run uses this check's plan
                    report = _run_flow(settings, roots, embed=not no_embed, optimize=force, verbose=verbose)
        finally:
            project_lock.release()
    finally:
        memory_lock.release()
    if as_json:
        _print_json(report.as_dict())
        return
    _print_ingest(report)


def _pending(settings: Settings) -> bool:
    from ctxlake.tasks.lake import IndexState

    state = IndexState.read(settings.memory_dir)
    return bool(state and state.pending_vectors)


def _run_flow(settings: Settings, roots: dict[str, list[Path]], *, embed: bool, optimize: bool, verbose: bool) -> Any:
    from ctxlake.serve.cli.base import (
        _prefect_quietly,
        bound_writer_heap,
        start_prefect_shielded,
        without_heartbeats,
    )
    from ctxlake.serve.cli.render import stage_reporter
    from ctxlake.tasks.progress import use_reporter

    _prefect_quietly(verbose)
    bound_writer_heap()
    with stage_reporter() as rich, use_reporter(rich):
        rich.start("prefect", None, "starting")
        from ctxlake.flows.ingest_conversations import ingest_conversations

        start_prefect_shielded()
        rich.finish("prefect")
        with without_heartbeats():
            return ingest_conversations(settings, roots, embed=embed, optimize=optimize)


def _print_ingest(report: Any) -> None:
    typer.echo(f"Read {report.files_changed:,} changed log file(s) of {report.files_seen:,} "
               f"({report.bytes_read / 1e6:.1f} MB): {report.messages_inserted:,} new messages, "
               f"{report.messages_updated:,} updated, {report.duplicates:,} duplicates skipped.")
    for name, c in sorted(report.tools.items()):
        bad = sum(c["malformed"].values())
        unknown = sum(c["unknown"].values())
        typer.echo(f"  {name:<15} {c['files']:>5} files  {c['messages']:>7,} messages"
                   + (f"  {bad} malformed" if bad else "") + (f"  {unknown} unknown records" if unknown else ""))
    typer.echo(f"Sessions updated: {report.sessions_written:,}; secrets redacted: {report.redacted:,}.")
    if report.knowledge_rows is not None:
        typer.echo(f"Knowledge: {report.knowledge_rows} record(s) ingested.")
    if report.candidates:
        typer.echo("Knowledge candidates in .ctx/knowledge/inbox/: "
                   + ", ".join(f"{n} {status}" for status, n in sorted(report.candidates.items())) + ".")
    typer.echo(f"Done in {report.seconds:.1f} s.")
    for problem in report.knowledge_problems[:10]:
        typer.echo(f"warning: {problem}", err=True)
    for warning in report.warnings[:10]:
        typer.echo(f"warning: {warning}", err=True)
    if report.malformed_records or report.unknown_records:
        typer.echo(f"note: {report.malformed_records} malformed and {report.unknown_records} unknown record(s) "
                   "were skipped (see --json)", err=True)


# -- read commands -------------------------------------------------------------------------------


def sessions(
    tools: ToolOpt = None,
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, max=MAX_LIMIT, help="number of sessions")] = 20,
    all_projects: AllOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Agent sessions of this project, most recently active first."""
    from ctxlake.serve.api.memory_sessions import list_sessions

    _, lake = _lake()
    found = list_sessions(lake, limit=limit, tools=tools, all_projects=all_projects)
    if as_json:
        _print_json([_dump(s) for s in found])
        return
    if not found:
        typer.echo("No sessions" + ("" if all_projects else " for this project (try --all-projects)") + ".")
    for s in found:
        when = f"~{s.last_active:%Y-%m-%d %H:%M}" if s.time_estimated else f"{s.last_active:%Y-%m-%d %H:%M} "
        typer.echo(f"{when} {s.session_ref}  ({s.n_messages} messages"
                   + (", time from the file: the log has none" if s.time_estimated else "") + ")")
        typer.echo(f"    {s.title}")
        for task in s.open_tasks[-2:]:
            typer.echo(f"    open: {task}")


@session_app.command("show")
def session_show(
    ref: Annotated[str, typer.Argument(help="session ref (tool:id\\[#n]) or a unique prefix of it or of the id")],
    offset: Annotated[int, typer.Option("--offset", min=0, help="first message to show")] = 0,
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, max=100_000, help="messages per page")] = 50,
    as_json: JsonOpt = False,
) -> None:
    """A session's summary and its messages."""
    from ctxlake.serve.api.memory_sessions import session_detail

    _, lake = _lake()
    detail = session_detail(lake, ref, offset=offset, limit=limit)
    if as_json:
        _print_json(_dump(detail))
        return
    s = detail.session
    typer.echo(f"{s.session_ref}  {s.tool}  {s.project_path or '(unknown project)'}")
    typer.echo(s.summary)
    typer.echo("")
    for m in detail.messages:
        calls = " ".join(f"[{c.name}{' ✗' if c.is_error else ''}] {c.input}".rstrip() for c in m.tool_calls)
        text = " ".join(m.text.split())
        typer.echo(f"{m.timestamp:%H:%M:%S} {m.role:<9} {(text[:300] + ('…' if len(text) > 300 else '')) or calls}")
        if text and calls and m.role == "assistant":
            typer.echo(f"{'':>19}{calls[:200]}")
    if detail.next_offset is not None:
        typer.echo(f"… {detail.total - detail.next_offset} more (--offset {detail.next_offset})")


@context_app.command("search")
def context_search(
    query: Annotated[str, typer.Argument(help="what to look for in conversations and knowledge")],
    mode: Annotated[str, typer.Option("--mode", help="hybrid | keyword | semantic")] = "hybrid",
    types: Annotated[list[str] | None, typer.Option("--type", help="message, session, decision, error, insight, knowledge (repeatable)")] = None,
    tools: ToolOpt = None,
    after: Annotated[str | None, typer.Option("--after", help="only after this date/time or age (2025-12-01, 7d)")] = None,
    before: Annotated[str | None, typer.Option("--before", help="only before this date/time or age")] = None,
    depth: Annotated[str, typer.Option("--depth", help="summary | detail | raw")] = "summary",
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, max=MAX_LIMIT, help="number of results")] = 10,
    all_projects: AllOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Search messages, session summaries and knowledge."""
    from ctxlake.serve.api.context_search import search_context
    from ctxlake.serve.api.memory_lake import parse_when

    _, lake = _lake()
    result = search_context(lake, query, mode=mode, depth=depth, types=types, tools=tools,  # type: ignore[arg-type]
                            after=parse_when(after, "--after"), before=parse_when(before, "--before"),
                            limit=limit, all_projects=all_projects)
    if as_json:
        _print_json(_dump(result))
        return
    if not result.hits:
        typer.echo(f"No results for {query!r}.")
    for i, h in enumerate(result.hits, start=1):
        where = h.session_ref or h.ref
        typer.echo(f"{i:>2}. [{h.type}] {h.timestamp:%Y-%m-%d %H:%M}  {where}  {h.title}".rstrip())
        for line in h.text.splitlines()[:8]:
            typer.echo(f"      {line}")
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)


def knowledge(
    kind: Annotated[str | None, typer.Option("--type", help="decision | error | insight")] = None,
    query: Annotated[str | None, typer.Option("--query", "-q", help="best matches for this text")] = None,
    include_superseded: Annotated[bool, typer.Option("--all", help="include superseded records")] = False,
    limit: Annotated[int, typer.Option("-n", "--limit", min=1, max=MAX_LIMIT)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """This project's decisions, error solutions and insights (.ctx/knowledge/)."""
    from ctxlake.serve.api.context_search import project_knowledge

    _, lake = _lake()
    found = project_knowledge(lake, kind, query, limit=limit, include_superseded=include_superseded)
    if as_json:
        _print_json(_dump(found))
        return
    if not found.records:
        typer.echo("No knowledge records yet (`ctx remember decision \"...\"`, then `ctx run ingest`).")
    for r in found.records:
        chain = f"  (supersedes {r.supersedes})" if r.supersedes else ""
        typer.echo(f"{r.created_at:%Y-%m-%d}  {r.type:<8} {r.title}{chain}")
        typer.echo(f"          {r.path}")
    if found.inbox:
        typer.echo(f"{found.inbox} candidate(s) await review in .ctx/knowledge/inbox/ (move a file into "
                   "decisions/, errors/ or insights/ to accept it).")
    for warning in found.warnings:
        typer.echo(f"warning: {warning}", err=True)


def remember(
    kind: Annotated[str, typer.Argument(help="decision | error | insight")],
    text: Annotated[str, typer.Argument(help="first line is the title, the rest the body; '-' reads stdin")],
    title: Annotated[str | None, typer.Option("--title", help="title (then TEXT is the body)")] = None,
    files: Annotated[list[str] | None, typer.Option(
        "--file", help="a file it concerns, relative to the current folder (repeatable)")] = None,
    tags: Annotated[list[str] | None, typer.Option("--tag", help="a tag (repeatable)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a knowledge record to .ctx/knowledge/ (rejected as a duplicate when one says the same)."""
    from ctxlake.serve.api.context_search import remember as write

    if kind not in ("decision", "error", "insight"):
        raise InputError(f"unknown knowledge type {kind!r}", hint="decision, error or insight")
    body = sys.stdin.read() if text == "-" else text
    if title is None:
        first, _, rest = body.strip().partition("\n")
        title, body = first, rest
    from ctxlake.schemas.roots import resolve_root

    settings = load_settings(resolve_root(None, for_write=False))
    result = write(settings, kind, title, body, files=files or [], tags=tags or [], files_from=Path.cwd())
    if as_json:
        _print_json(_dump(result))
        return
    if result.status == "duplicate":
        typer.echo(f"Not written: {result.id} already says this (similarity {result.similarity:.2f}).")
    elif result.status == "superseded":
        typer.echo(f"Wrote {result.path}; it supersedes {result.similar_to} (similarity {result.similarity:.2f}).")
    else:
        typer.echo(f"Wrote {result.path}.")
    typer.echo("Run `ctx run ingest` to make it searchable.", err=True)


def register(app: typer.Typer, run_app: typer.Typer) -> None:
    """Add the memory commands to the `ctx` app."""
    run_app.command("ingest")(run_ingest)
    app.command("sessions")(sessions)
    app.add_typer(session_app, name="session")
    app.add_typer(context_app, name="context")
    app.command("knowledge")(knowledge)
    app.command("remember")(remember)
