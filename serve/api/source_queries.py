"""Read side of sources (SOURCES, FILES, CHUNKS): list them with counts, check names, and ask a subagent; shared by the CLI and MCP."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ctxlake.errors import EmbedderError, InputError, ModelMismatchError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.sources import SourceSpec, is_trusted, load_registry
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.models_sources import AskResult, SourceInfo, SourceList
from ctxlake.tasks.agents import PromptHit, SourceLink, ask_agent
from ctxlake.tasks.source_store import read_sources, source_counts, source_roots
from ctxlake.tasks.sources import check_access, source_root

if TYPE_CHECKING:
    from ctxlake.serve.api.code_lake import Lake

# A hit's text is read from the file itself (the index keeps a snippet); longer chunks are cut.
MAX_HIT_LINES = 200


def _iso(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else (str(value) if value else None)


def list_sources(settings: Settings, lake: Lake | None = None, with_project: bool = True) -> SourceList:
    """Every declared source with its last sync and its files/chunks in the index now: what
    `ctx list` prints. Given the open lake, each source also gets its embedded chunks, languages
    and last indexing, with the index's model, and 'project' comes first unless `with_project`
    is false (`ctx list` lists the added sources)."""
    registry = load_registry(settings.root)
    rows = read_sources(settings.lake_dir)
    # Given the lake, its per-source counts below replace these (one read of the tables, not two).
    counts = source_counts(settings.lake_dir) if lake is None else {}
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
    listed = _with_index_stats(lake, out)
    if not with_project:
        listed.sources = [s for s in listed.sources if s.name != PROJECT_SOURCE]
    return listed


def _with_index_stats(lake: Lake, out: list[SourceInfo]) -> SourceList:
    """Files, chunks, embedded chunks, languages and last indexing per source, read from the
    index tables (a source indexed but neither declared nor synced is listed too)."""
    by_name = {info.name: info for info in out}
    for name, figures in sorted(index_stats(lake).items()):
        info = by_name.get(name)
        if info is None:
            info = by_name[name] = SourceInfo(name=name)
            out.append(info)
        info.files, info.chunks, info.embedded = figures.files, figures.chunks, figures.embedded
        info.languages = dict(figures.languages)
        info.last_indexed = figures.last_indexed
    state = lake.state
    finished = (state.last_run or {}).get("finished_at") if state is not None else None
    return SourceList(sources=out, model_id=state.model_id if state is not None else "",
                      last_run=str(finished) if finished else None)


class SourceFigures(NamedTuple):
    files: int
    chunks: int
    embedded: int
    languages: dict[str, int]  # files per language, most first
    last_indexed: str | None


def index_stats(lake: Lake) -> dict[str, SourceFigures]:
    """Source -> its figures in the index, counted once per version of the files and chunks tables:
    a warm lake (the MCP server, the UI) answers a repeat visit with a version check."""
    import pyarrow.compute as pc

    from ctxlake.serve.api.code_lake import all_rows

    # The versions are read before the tables: a write landing meanwhile leaves a key that no
    # longer matches, so the next call counts again instead of keeping a stale answer.
    versions = (lake.files.version, lake.chunks.version)
    if lake._source_stats is not None and lake._source_stats[0] == versions:
        return lake._source_stats[1]
    files = all_rows(lake.files, ["source", "lang", "indexed_at"])
    chunks = _value_counts(all_rows(lake.chunks, ["source"]).column("source"))
    # Only the chunks still waiting for a vector come back: the vector column is filtered in the
    # scan, never read into memory (reading it took ~0.1 s of each visit on django's 47k chunks).
    pending = _value_counts(all_rows(lake.chunks, ["source"], "vector IS NULL").column("source"))
    found: dict[str, SourceFigures] = {}
    for name in sorted(set(files.column("source").to_pylist()) | set(chunks)):
        in_files = files.filter(pc.equal(files.column("source"), name))
        langs = pc.value_counts(in_files.column("lang").fill_null("(unknown)")).to_pylist()
        newest = pc.max(in_files.column("indexed_at")).as_py() if in_files.num_rows else None
        found[name] = SourceFigures(
            files=in_files.num_rows, chunks=chunks.get(name, 0), embedded=chunks.get(name, 0) - pending.get(name, 0),
            languages=dict(sorted(((d["values"], d["counts"]) for d in langs), key=lambda kv: (-kv[1], kv[0]))),
            last_indexed=newest.isoformat(timespec="seconds") if newest is not None else None)
    lake._source_stats = (versions, found)
    return found


def _value_counts(column: Any) -> dict[str, int]:
    import pyarrow.compute as pc

    return {d["values"]: d["counts"] for d in pc.value_counts(column).to_pylist()}


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


def source_folder(settings: Settings, name: str) -> Path:
    """The folder a source's files were indexed from: the project root for 'project'."""
    if name == PROJECT_SOURCE:
        return settings.root
    root = source_roots(settings.lake_dir).get(name)
    if root is None:
        check_names(settings, [name])
        raise InputError(f"source {name!r} has not been indexed yet", hint=f"run `ctx update {name}`")
    return root


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
        if not is_trusted(spec, settings.root, settings.home):
            if names:
                check_access(spec, settings.root, settings.home)  # raises its one clear error
            continue  # "all sources": an untrusted folder is never linked into a sandbox
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
    from ctxlake.tasks.safe_io import text_as_indexed
    from ctxlake.tasks.secrets import mask_text

    try:
        data = safe_io.open_inside(root, path, HIT_READ_BYTES)
    except (InputError, OSError):
        return fallback
    text = text_as_indexed(data)
    lines = text.splitlines(keepends=True)[max(start, 1) - 1:min(end, start + MAX_HIT_LINES)]
    return mask_text("".join(lines), path) or fallback


def prompt_hits(settings: Settings, question: str, links: Sequence[SourceLink],
                lake: Lake | None = None) -> list[PromptHit]:
    """The index's top hits for the question within the linked sources; NotIndexedError without a lake."""
    if settings.agents.hits == 0 or not links:
        return []
    from ctxlake.serve.api import code_lake, code_search

    lake = lake or code_lake.Lake(settings)
    names = [link.name for link in links]
    try:
        result = code_search.search(lake, question, limit=settings.agents.hits, sources=names, check_stale=False)
    except (ModelMismatchError, EmbedderError, NotIndexedError):
        # The question still deserves keyword hits when the vectors cannot be used.
        result = code_search.search(lake, question, mode="keyword", limit=settings.agents.hits, sources=names,
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
    try:
        hits, indexed = prompt_hits(settings, question, links, lake), True
    except NotIndexedError:
        hits, indexed = [], False  # the agent can still read the files; it just gets no head start
    run = ask_agent.fn(question, links, hits, settings.agents, agent, timeout_s)
    return AskResult(
        agent=run.agent, sources=run.sources, answer=run.stdout, stderr=run.stderr, exit_code=run.exit_code,
        truncated=bool(run.stdout_dropped or run.stderr_dropped), seconds=run.seconds,
        hits_in_prompt=run.hits_in_prompt, prompt_tokens=run.prompt_tokens, indexed=indexed,
    )
