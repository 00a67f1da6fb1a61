"""Read-side queries behind the MCP tools beyond search: symbols, file context, freshness, file listing (CHUNKS, FILES); sources are in source_queries."""

from __future__ import annotations

import difflib
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ctxlake.errors import InputError, UnknownFileError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.code_lake import Lake, all_rows, embedding_counts
from ctxlake.serve.api.code_search import snippet
from ctxlake.serve.api.docs import clean_relative
from ctxlake.serve.api.models import Hit
from ctxlake.serve.api.ranked_lists import HIT_COLUMNS, VECTOR_DISTANCE, _sql, keyword_rows
from ctxlake.serve.api.symbols import SYMBOL_COLUMNS, symbol_index
from ctxlake.serve.api.symbols import normalise as _normalise
from ctxlake.serve.api.tool_models import (
    EmbeddingProgress,
    FileContext,
    FileEntry,
    FilePage,
    Outline,
    StaleFile,
    StaleStatus,
    Symbol,
    SymbolMatches,
    decode_cursor,
    encode_cursor,
)
from ctxlake.serve.api.watched import project_freshness
from ctxlake.tasks import freshness, safe_io
from ctxlake.tasks.lake import IndexState, WriterLock
from ctxlake.tasks.merkle import load_snapshot
from ctxlake.tasks.safe_io import text_as_indexed
from ctxlake.tasks.secrets import mask_text, skipped_as_secret

if TYPE_CHECKING:
    from lancedb.query import LanceVectorQueryBuilder

SYMBOL_MIN_SCORE = 60.0
FILE_LINES = 400  # lines get_file_context returns when no end_line is given
MAX_FILE_LINES = 1000
RELATED = 5
FILES_PAGE = 200
STALE_LISTED = 100


# -- fuzzy_find ----------------------------------------------------------------------------------


MAX_SYMBOL_CHARS = 200


def find_symbols(lake: Lake, symbol_name: str, symbol_type: str | None = None, limit: int = 20) -> SymbolMatches:
    """Symbols whose name is close to `symbol_name` (typos, case, separators), best first."""
    from rapidfuzz import fuzz, process

    if len(symbol_name) > MAX_SYMBOL_CHARS:  # fuzzy matching costs length x length per symbol
        raise InputError(f"symbol_name is {len(symbol_name):,} characters; a name is at most {MAX_SYMBOL_CHARS}",
                         hint="give one function, method or class name; `ctx search` (MCP: search_code) takes text")
    needle = _normalise(symbol_name)
    if not needle:
        raise InputError("symbol_name has no letters or digits", hint="e.g. getUserById or Flask.register_blueprint")
    index = symbol_index(lake)
    wanted = None
    if symbol_type:
        wanted = symbol_type.strip().lower()
        if wanted not in index.kinds:
            raise InputError(f"unknown symbol_type {symbol_type!r}",
                             hint=f"kinds in this index: {', '.join(index.kinds)}")
    best: dict[int, float] = {}
    # Two passes with a C scorer each (fast over 100k names): the bare name and the qualified one.
    for keys in (index.short, index.full):
        for _, score, i in process.extract(needle, keys, scorer=fuzz.ratio, limit=max(limit * 20, 200),
                                           score_cutoff=SYMBOL_MIN_SCORE):
            best[i] = max(best.get(i, 0.0), float(score))
    kind_col = index.rows.column("kind")
    out: list[Symbol] = []
    seen: set[tuple[str, str, int]] = set()
    for i in sorted(best, key=lambda i: (-best[i], index.names[i])):
        row = index.row_of[i]
        if wanted is not None and kind_col[row].as_py() != wanted:
            continue
        r = {c: index.rows.column(c)[row].as_py() for c in SYMBOL_COLUMNS}
        if (r["path"], index.names[i], r["start_line"]) in seen:
            continue
        seen.add((r["path"], index.names[i], r["start_line"]))
        out.append(Symbol(symbol=index.names[i], kind=r["kind"], source=r["source"], path=r["path"],
                          start_line=r["start_line"], end_line=r["end_line"], lang=r["lang"],
                          score=round(best[i], 1)))
        if len(out) >= limit:
            break
    warnings = [] if out else [f"no symbol is similar enough to {symbol_name!r}; try `ctx search` (MCP: search_code)"]
    return SymbolMatches(query=symbol_name, symbol_type=wanted, matches=out, stale=False, warnings=warnings)


# -- get_file_context ----------------------------------------------------------------------------


def indexed_file(lake: Lake, filepath: str, source: str = PROJECT_SOURCE,
                 root: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The clean path of an indexed file of `source` (relative to `root`, its folder: the project
    root by default) and its FILES row; InputError otherwise."""
    root = root or lake.settings.root
    raw = filepath.strip()
    if "\0" in raw:  # checked before resolve(), which raises a bare ValueError for it
        raise InputError("filepath contains a NUL byte")
    if raw.startswith("/"):
        # An absolute path inside the project is unambiguous (agents copy them from editors).
        try:
            real = Path(raw).resolve()
        except RuntimeError:  # Python 3.11 raises this for a symlink loop
            raise InputError(f"filepath {filepath!r} is a symlink loop") from None
        if real != root and root not in real.parents:
            raise InputError(f"absolute path outside the {_owner(source)}: {filepath!r}",
                             hint=f"give a path relative to {root}")
        raw = real.relative_to(root).as_posix()
    clean = clean_relative(raw, "filepath")
    where = f"source = {_sql(source)} AND path = {_sql(clean)}"
    rows = all_rows(lake.files, ["path", "lang", "hash", "size"], where).to_pylist()
    if not rows:
        elsewhere = sorted(set(all_rows(lake.files, ["source"], f"path = {_sql(clean)}").column("source").to_pylist()))
        if elsewhere:
            raise UnknownFileError(f"not an indexed file of the {_owner(source)}: {clean!r}",
                             hint=f"it is in {', '.join(map(_owner, elsewhere))}: pass --source "
                                  f"(MCP: source) {elsewhere[0]}")
        paths = all_rows(lake.files, ["path"], f"source = {_sql(source)}").column("path").to_pylist()
        close = difflib.get_close_matches(clean, paths, n=3, cutoff=0.5)
        raise UnknownFileError(f"not an indexed file: {clean!r}",
                         hint=f"did you mean {', '.join(close)}?" if close else
                         "find paths with `ctx files` or `ctx search` (MCP: search_code, ctx://files); "
                         "ignored and binary files are not served")
    return clean, rows[0]


def _owner(source: str) -> str:
    return "project" if source == PROJECT_SOURCE else f"source {source!r}"


def _refresh(source: str) -> str:
    """What brings the index of `source` up to date: a source's files come back with its update."""
    if source == PROJECT_SOURCE:
        return "run `ctx run index` to update the index"
    return f"run `ctx update {source}` to fetch and index the source again"


def file_context(
    lake: Lake, filepath: str, start_line: int | None = None, end_line: int | None = None,
    include_related: bool = False, max_chars: int = 40_000, source: str = PROJECT_SOURCE,
) -> FileContext:
    """Lines of one indexed file (of the project, or of `source`) as they are on disk now, its
    outline, and similar code elsewhere."""
    import xxhash

    from ctxlake.serve.api.source_queries import source_folder

    root = source_folder(lake.settings, source)
    clean, row = indexed_file(lake, filepath, source, root)
    if skipped_as_secret(clean, lake.settings.index.secret_files):
        # Indexed while secret_files was "mask": the scan now leaves it out, and so does the reader.
        raise InputError(f"{clean!r} holds secrets by its name and is not indexed ([index] secret_files = \"skip\")",
                         hint="run `ctx run index` to drop it from the index")
    # Read with the race-safe opener (tasks/safe_io.py): no symlink out, no .git, regular files
    # only, bounded. A hidden name is served when indexed: the scan's rules admitted it (a secret
    # file only when masked, and then it is masked below as the index masked it).
    limit = max(lake.settings.index.max_file_bytes, int(row["size"] or 0))
    try:
        data = safe_io.open_inside(root, clean, limit, allow_hidden=True, what="filepath")
    except (FileNotFoundError, NotADirectoryError):
        raise InputError(f"{clean!r} was deleted since the last index run", hint=_refresh(source)) from None
    except safe_io.TooLarge as exc:
        raise InputError(f"{clean!r} is now {exc.size:,} bytes, over the index limit of {limit:,}",
                         hint=_refresh(source)) from None
    warnings: list[str] = []
    stale = xxhash.xxh3_128(data).hexdigest() != row["hash"]
    if stale:
        warnings.append("the file changed since the last index run: lines are current, outline may be off")
    # Read from disk, so masked here as the index masked it (same stage, same line numbers).
    text = mask_text(text_as_indexed(data), clean)
    lines = text.splitlines(keepends=True)
    total = len(lines)
    start = 1 if start_line is None else start_line
    if start < 1 or (total and start > total):
        raise InputError(f"start_line {start} is out of range: {clean!r} has {total} line(s)")
    if end_line is not None and end_line < start:
        raise InputError(f"end_line {end_line} is before start_line {start}")
    end = min(total, end_line if end_line is not None else start + FILE_LINES - 1, start + MAX_FILE_LINES - 1)
    chars, last = 0, start - 1
    for i in range(start - 1, end):
        if last >= start and chars + len(lines[i]) > max_chars:
            break
        chars += len(lines[i])
        last = i + 1
    content = "".join(lines[start - 1 : last])[:max_chars]
    asked_end = min(total, end_line) if end_line is not None else end
    truncated = last < asked_end
    columns = ["symbol", "kind", "start_line", "end_line"] + (["vector", "terms"] if include_related else [])
    chunks = all_rows(lake.chunks, columns, f"source = {_sql(source)} AND path = {_sql(clean)}").to_pylist()
    overlap = sorted((c for c in chunks if c["start_line"] <= last and c["end_line"] >= start),
                     key=lambda c: (c["start_line"], c["end_line"]))
    outline = [Outline(symbol=c["symbol"], kind=c["kind"], start_line=c["start_line"], end_line=c["end_line"])
               for c in overlap[:50]]
    related: list[Hit] = []
    if include_related:
        related = _related(lake, source, clean, overlap, warnings)
    return FileContext(
        source=source, path=clean, lang=row["lang"], start_line=start, end_line=last, total_lines=total, content=content,
        truncated=truncated, next_start_line=last + 1 if last < total else None, outline=outline,
        related=related, stale=stale, warnings=warnings,
    )


def _related(lake: Lake, source: str, path: str, chunks: list[dict[str, Any]], warnings: list[str]) -> list[Hit]:
    """Chunks of other files closest to the slice: by the mean of its vectors, else by its words."""
    outside = f"NOT (source = {_sql(source)} AND path = {_sql(path)})"
    vectors = [c["vector"] for c in chunks if c["vector"] is not None]
    rows: list[dict[str, Any]]
    if vectors:
        centre = np.mean(np.asarray(vectors, dtype=np.float32), axis=0)
        centre /= float(np.linalg.norm(centre)) or 1.0
        builder = cast("LanceVectorQueryBuilder", lake.chunks.search(centre.tolist(), vector_column_name="vector"))
        rows = (builder.distance_type("cosine").where(f"vector IS NOT NULL AND {outside}", prefilter=True)
                .select([*HIT_COLUMNS, VECTOR_DISTANCE]).limit(RELATED).to_list())
        for r in rows:
            r["_rank_score"] = 1.0 - float(r.get(VECTOR_DISTANCE, 1.0))
    else:
        words: list[str] = []
        for c in chunks:
            for w in (c["terms"] or "").split():
                if len(w) > 2 and w not in words:
                    words.append(w)
        if not words:
            return []
        warnings.append("related by keywords: this part of the file has no vectors yet")
        rows = keyword_rows(lake, " ".join(words[:40]), RELATED, outside)
    return [Hit(source=r["source"], path=r["path"], start_line=r["start_line"], end_line=r["end_line"],
                symbol=r["symbol"], kind=r["kind"], lang=r["lang"], rank=i,
                snippet=snippet(r["text"])) for i, r in enumerate(rows, start=1)]


# -- get_stale_status ----------------------------------------------------------------------------


def stale_status(settings: Settings, lake: Lake | None, fresh: freshness.Freshness | None = None) -> StaleStatus:
    """Root hash of the files now vs. at the last clean run, the changed files, embedding progress.

    `fresh` is a freshness scan just made by the caller (the MCP server caches it for searches).
    """
    started = time.perf_counter()
    lake_dir = settings.lake_dir
    state = IndexState.read(lake_dir) if lake_dir.is_dir() else None
    writer = WriterLock(lake_dir).held_by_other() if lake_dir.is_dir() else None
    if state is None:
        return StaleStatus(indexed=False, up_to_date=False, reason="not indexed yet: run `ctx run index`",
                           root_hash_match=False, stale_count=0, indexer_running=writer)
    if fresh is None:
        fresh = project_freshness(settings)
    indexed_root = (state.roots or {}).get(PROJECT_SOURCE)
    if indexed_root is None:
        snapshot = load_snapshot(lake_dir, PROJECT_SOURCE)
        indexed_root = snapshot.root_hash if snapshot is not None else None
    # A watched project's answer may come from its watcher without a scan (no tree): up to date
    # means the files hash to the indexed root.
    current_root = fresh.tree.root_hash if fresh.tree is not None else (indexed_root if fresh.up_to_date else None)
    changes = ([StaleFile(path=p, change="added") for p in fresh.diff.added]
               + [StaleFile(path=p, change="modified") for p in fresh.diff.modified]
               + [StaleFile(path=p, change="removed") for p in fresh.diff.removed])
    changes.sort(key=lambda f: f.path)
    embedding = None
    if lake is not None:
        total, pending = embedding_counts(lake, fresh=True)
        embedding = EmbeddingProgress(chunks=total, embedded=total - pending, pending=pending,
                                      fraction=round((total - pending) / total, 4) if total else 1.0,
                                      model_id=state.model_id)
    return StaleStatus(
        indexed=True, up_to_date=fresh.up_to_date, reason=fresh.reason,
        root_hash_indexed=indexed_root, root_hash_current=current_root,
        root_hash_match=indexed_root is not None and indexed_root == current_root,
        stale_count=len(changes), stale_files=changes[:STALE_LISTED], embedding=embedding,
        last_run=state.last_run, indexer_running=writer,
        checked_in_ms=round((time.perf_counter() - started) * 1000, 1),
    )


# -- the file listing ------------------------------------------------------------------------------------


def list_files(lake: Lake, cursor: str | None = None, page: int = FILES_PAGE) -> FilePage:
    """The indexed files, sorted by source and path, one page at a time."""
    table = all_rows(lake.files, ["source", "path", "lang", "size", "n_chunks"])
    table = table.sort_by([("source", "ascending"), ("path", "ascending")])
    offset = decode_cursor(cursor, "files") if cursor else 0
    rows = table.slice(offset, page).to_pylist()
    end = offset + len(rows)
    return FilePage(
        files=[FileEntry(source=r["source"], path=r["path"], lang=r["lang"], size=r["size"], chunks=r["n_chunks"])
               for r in rows],
        total=table.num_rows, next_cursor=encode_cursor("files", end) if end < table.num_rows else None,
    )
