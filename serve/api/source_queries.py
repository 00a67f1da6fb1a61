"""Read side of sources (SOURCES, FILES, CHUNKS): list them with counts, check names, and ask a subagent; shared by the CLI and MCP."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlake.errors import EmbedderError, InputError, ModelMismatchError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.sources import SourceSpec, load_registry
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.models_sources import AskResult, SourceInfo, SourceList
from ctxlake.tasks.agents import PromptHit, SourceLink, ask_agent
from ctxlake.tasks.source_store import read_sources, source_counts
from ctxlake.tasks.sources import source_root

if TYPE_CHECKING:
    from ctxlake.serve.api.queries import Lake

# A hit's text is read from the file itself (the index keeps a snippet); longer chunks are cut.
MAX_HIT_LINES = 200


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else (str(value) if value else None)


def list_sources(settings: Settings, lake: Lake | None = None) -> SourceList:
    """Every declared source with its last sync and its files/chunks in the index now: what
    `ctx list` prints. Given the open lake (the MCP server), 'project' comes first, and each
    source also gets its embedded chunks, languages and last indexing, with the index's model."""
    registry = load_registry(settings.root)
    rows = read_sources(settings.lake_dir)
    counts = source_counts(settings.lake_dir)
    out: list[SourceInfo] = [SourceInfo(name=PROJECT_SOURCE, root=str(settings.root))] if lake is not None else []
    for name in [*registry, *(n for n in rows if n not in registry)]:
        spec, row = registry.get(name), rows.get(name, {})
        files, chunks = counts.get(name, (0, 0))
        status = row.get("status") or "not synced"
        message = row.get("message")
        if spec is None:
            status, message = "undeclared", f"not in .ctx/sources.toml; `ctx remove {name}` deletes its rows"
        out.append(SourceInfo(
            name=name,
            type=spec.type if spec else row.get("type", "?"),
            origin=spec.origin if spec else row.get("origin", "?"),
            ref=spec.ref if spec else row.get("ref"),
            ref_kind=row.get("ref_kind"), resolved=row.get("resolved"),
            paths=spec.paths if spec else list(row.get("paths") or []),
            excludes=spec.exclude if spec else list(row.get("excludes") or []),
            docs=bool(spec and spec.docs), files=files, chunks=chunks,
            added_at=_iso(row.get("added_at")), updated_at=_iso(row.get("updated_at")),
            status=status, message=message,
            root=str(source_root(settings, spec)) if spec else row.get("root"),
        ))
    if lake is None:
        return SourceList(sources=out)
    return _with_index_stats(lake, out)


def _with_index_stats(lake: Lake, out: list[SourceInfo]) -> SourceList:
    """Files, chunks, embedded chunks, languages and last indexing per source, read from the
    index tables (a source indexed but neither declared nor synced is listed too)."""
    import pyarrow.compute as pc

    from ctxlake.serve.api.explore import _all_rows

    files = _all_rows(lake.files, ["source", "lang", "indexed_at"])
    chunks = _all_rows(lake.chunks, ["source", "vector"])
    embedded = pc.invert(pc.is_null(chunks.column("vector")))
    by_name = {info.name: info for info in out}
    for name in sorted(set(files.column("source").to_pylist()) | set(chunks.column("source").to_pylist())):
        info = by_name.get(name)
        if info is None:
            info = by_name[name] = SourceInfo(name=name)
            out.append(info)
        in_files = files.filter(pc.equal(files.column("source"), name))
        in_chunks = pc.equal(chunks.column("source"), name)
        langs = pc.value_counts(in_files.column("lang").fill_null("(unknown)")).to_pylist()
        newest = pc.max(in_files.column("indexed_at")).as_py() if in_files.num_rows else None
        info.files, info.chunks = in_files.num_rows, int(pc.sum(in_chunks).as_py() or 0)
        info.embedded = int(pc.sum(pc.and_(in_chunks, embedded)).as_py() or 0)
        info.languages = dict(sorted(((d["values"], d["counts"]) for d in langs), key=lambda kv: (-kv[1], kv[0])))
        info.last_indexed = newest.isoformat(timespec="seconds") if newest is not None else None
    state = lake.state
    finished = (state.last_run or {}).get("finished_at") if state is not None else None
    return SourceList(sources=out, model_id=state.model_id if state is not None else "",
                      last_run=str(finished) if finished else None)


def parse_names(text: str | None) -> list[str] | None:
    """`a,b` -> ['a', 'b']; empty -> None (all sources)."""
    names = [s.strip() for s in (text or "").split(",") if s.strip()]
    return list(dict.fromkeys(names)) or None


def check_names(settings: Settings, names: Sequence[str] | None) -> None:
    """Unknown source names are an input error (a typo would otherwise silently match nothing)."""
    if not names:
        return
    known = {PROJECT_SOURCE, *load_registry(settings.root), *read_sources(settings.lake_dir)}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"unknown source(s): {', '.join(unknown)}",
                         hint=f"known: {', '.join(sorted(known))} (see `ctx list`)")


def resolve_links(settings: Settings, names: Sequence[str] | None) -> list[SourceLink]:
    """Source names -> existing folders to link into a sandbox; default: the project and every source."""
    registry = load_registry(settings.root)
    rows = read_sources(settings.lake_dir)
    chosen = list(names) if names else [PROJECT_SOURCE, *registry]
    links: list[SourceLink] = []
    for name in chosen:
        if name == PROJECT_SOURCE:
            links.append(SourceLink(PROJECT_SOURCE, "local", str(settings.root), None, settings.root))
            continue
        spec: SourceSpec | None = registry.get(name)
        if spec is None:
            raise InputError(f"unknown source {name!r}",
                             hint=f"known: {', '.join([PROJECT_SOURCE, *sorted(registry)])} (see `ctx list`)")
        root = source_root(settings, spec)
        if not root.is_dir():
            if names:
                raise InputError(f"source {name!r} has not been fetched yet ({root} is missing)",
                                 hint=f"run `ctx update {name}`")
            continue  # "all sources": skip the ones never synced
        version = rows.get(name, {}).get("resolved")
        links.append(SourceLink(name, spec.type, spec.origin, version, root))
    return links


# A hit's file is read only this far (a hit past it falls back to its stored snippet).
HIT_READ_BYTES = 8_000_000


def _hit_text(root: Path, path: str, start: int, end: int, fallback: str) -> str:
    # The race-safe opener, like every other reader: no link out, nothing hidden, no FIFO, bounded.
    from ctxlake.errors import InputError
    from ctxlake.tasks import safe_io
    from ctxlake.tasks.secrets import mask_text

    try:
        data = safe_io.open_inside(root, path, HIT_READ_BYTES)
    except (InputError, OSError):
        return fallback
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines(keepends=True)[max(start, 1) - 1:min(end, start + MAX_HIT_LINES)]
    return mask_text("".join(lines), path) or fallback


def prompt_hits(settings: Settings, question: str, links: Sequence[SourceLink],
                lake: Lake | None = None) -> list[PromptHit]:
    """The index's top hits for the question within the linked sources (none when not indexed)."""
    if settings.agents.hits == 0 or not links:
        return []
    from ctxlake.serve.api import queries

    try:
        lake = lake or queries.Lake(settings)
    except NotIndexedError:
        return []
    names = [link.name for link in links]
    try:
        result = queries.search(lake, question, limit=settings.agents.hits, sources=names, check_stale=False)
    except (ModelMismatchError, EmbedderError, NotIndexedError):
        # The question still deserves keyword hits when the vectors cannot be used.
        result = queries.search(lake, question, mode="keyword", limit=settings.agents.hits, sources=names,
                                check_stale=False)
    roots = {link.name: link.root for link in links}
    return [
        PromptHit(h.source, h.path, h.start_line, h.end_line, h.symbol,
                  _hit_text(roots[h.source], h.path, h.start_line, h.end_line, h.snippet)
                  if h.source in roots else h.snippet)
        for h in result.hits
    ]


def ask(settings: Settings, names: Sequence[str] | None, question: str, agent: str | None = None,
        timeout_s: float | None = None, lake: Lake | None = None) -> AskResult:
    """Ask a subagent about some sources; the one call behind `ctx ask` and MCP ask_codebase."""
    question = question.strip()
    if not question:
        raise InputError("empty question", hint="pass -q 'your question'")
    links = resolve_links(settings, names)
    if not links:
        raise InputError("no source has been fetched yet", hint="`ctx add` one, or `ctx update`")
    hits = prompt_hits(settings, question, links, lake)
    run = ask_agent.fn(question, links, hits, settings.agents, agent, timeout_s)
    return AskResult(
        agent=run.agent, sources=run.sources, answer=run.stdout, stderr=run.stderr, exit_code=run.exit_code,
        truncated=bool(run.stdout_dropped or run.stderr_dropped), seconds=run.seconds,
        hits_in_prompt=run.hits_in_prompt, prompt_tokens=run.prompt_tokens,
    )
