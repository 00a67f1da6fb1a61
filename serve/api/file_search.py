"""File-level search over CHUNKS: ranked chunks and exact name/path evidence fused into a ranking of files."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ctxlake.errors import InputError, NotIndexedError
from ctxlake.serve.api.code_lake import Lake, embedded_fraction
from ctxlake.serve.api.code_search import unknown_lang
from ctxlake.serve.api.models import FileHit, FileSearchResult, SearchMode
from ctxlake.serve.api.query_terms import (
    MAX_ISSUE_CHARS,
    analyse,
    bound_query,
    query_prose,
    query_title,
)
from ctxlake.serve.api.ranked_lists import (
    build_filter,
    fuzzy_rows,
    identifier_rows,
    keyword_rows,
    semantic_rows,
)
from ctxlake.serve.api.ranking import (
    FileKey,
    RankOptions,
    add_bonus,
    called_name_scores,
    cochange_scores,
    down_weight_tests,
    file_scores,
    folder_scores,
    module_stem_scores,
    neighbour_scores,
    ordered,
    path_scores,
    rrf,
    scaled,
    stem_scores,
    symbol_scores,
    typo_stem_scores,
    wants_tests,
)


@dataclass
class FileEvidence:
    """Everything a file ranking is fused from: ranked chunks of each list, and per-file scores of
    the names and paths the query mentions. Kept apart so one search serves every fusion."""

    keyword: list[dict[str, Any]] = field(default_factory=list)  # BM25 (or fuzzy) over the whole query
    title: list[dict[str, Any]] = field(default_factory=list)  # BM25 over its first line
    prose: list[dict[str, Any]] = field(default_factory=list)  # BM25 over its prose (tried)
    identifiers: list[dict[str, Any]] = field(default_factory=list)  # exact code-name occurrences
    semantic: list[dict[str, Any]] = field(default_factory=list)  # vector chunk rows
    symbol: dict[FileKey, float] = field(default_factory=dict)
    title_symbol: dict[FileKey, float] = field(default_factory=dict)  # files defining the title's names
    title_stem: dict[FileKey, float] = field(default_factory=dict)  # modules named like a title word
    typo_stem: dict[FileKey, float] = field(default_factory=dict)  # files one edit from a query word
    title_call: dict[FileKey, float] = field(default_factory=dict)  # files defining the title's first call
    path: dict[FileKey, float] = field(default_factory=dict)
    stem: dict[FileKey, float] = field(default_factory=dict)
    folder: dict[FileKey, float] = field(default_factory=dict)
    imports: dict[FileKey, set[FileKey]] = field(default_factory=dict)  # file -> files it imports
    cochange: dict[FileKey, dict[FileKey, float]] = field(default_factory=dict)  # file -> co-changed files
    asks_for_tests: bool = False
    warnings: list[str] = field(default_factory=list)

    def for_mode(self, mode: SearchMode) -> FileEvidence:
        """The part of hybrid evidence that `mode` would have gathered on its own."""
        if mode == "semantic":
            return FileEvidence(semantic=self.semantic, asks_for_tests=self.asks_for_tests)
        if mode in ("keyword", "fuzzy"):
            return dataclasses.replace(self, semantic=[])
        return self


def file_evidence(
    lake: Lake, query: str, mode: SearchMode, where: str | None, options: RankOptions
) -> FileEvidence:
    """A query -> ranked chunks (BM25 of the query and its title, exact identifiers, vectors) and
    the files named by what the query mentions."""
    out = FileEvidence(asks_for_tests=wants_tests(query))
    lexical = mode in ("keyword", "hybrid", "fuzzy")
    analysis = analyse(query) if lexical else None
    title = query_title(query)
    if mode == "fuzzy":
        out.keyword = fuzzy_rows(lake, query, options.pool, where)
    elif lexical:
        out.keyword = keyword_rows(lake, query, options.pool, where, squeeze=options.squeeze_logs)
        if options.title_list and title:
            out.title = keyword_rows(lake, title, options.pool, where)
        if options.prose_list:
            prose = query_prose(query)
            if prose:
                out.prose = keyword_rows(lake, prose, options.pool, where)
    if analysis is not None and options.identifier_list:
        names = [n for n, _ in analysis.identifiers.most_common(options.max_identifiers)]
        out.identifiers, warning = identifier_rows(lake, names, options.pool, where)
        if warning:
            out.warnings.append(warning)
    if mode in ("semantic", "hybrid"):
        if embedded_fraction(lake) > 0.0:
            # A static model averages its tokens' vectors: over a whole issue (logs, code, prose)
            # that average says little, while the title names what the issue is about.
            out.semantic = semantic_rows(lake, title if options.semantic_title and title else query,
                                         options.pool, where)
        elif mode == "semantic":
            raise NotIndexedError("no chunk has a vector yet",
                                  hint="wait for `ctx run index` to embed, or use --mode keyword")
        else:
            out.warnings.append("semantic part skipped: no chunk is embedded yet")
    if analysis is not None and (options.symbol_evidence or options.path_evidence or options.stem_evidence):
        catalog = lake.catalog(where)
        out.symbol = symbol_scores(analysis, catalog) if options.symbol_evidence else {}
        if options.title_symbols and title:
            out.title_symbol = symbol_scores(analyse(title), catalog)
        if options.title_stems and title:
            out.title_stem = module_stem_scores(analyse(title), catalog)
        if options.typo_stems:
            out.typo_stem = typo_stem_scores(analysis, catalog)
        if options.title_calls and title:
            out.title_call = called_name_scores(title, catalog)
        out.path = path_scores(analysis, catalog) if options.path_evidence else {}
        if options.stem_evidence:
            out.stem = stem_scores(analysis, catalog)
            out.folder = folder_scores(analysis, catalog)
    if options.import_neighbours:
        out.imports = lake.imports()
    if options.cochange_neighbours:
        out.cochange = lake.cochange()
    return out


def fuse_files(evidence: FileEvidence, options: RankOptions) -> list[tuple[FileKey, float]]:
    """Evidence -> files ranked by weighted reciprocal-rank fusion of its lists, plus bonuses.

    Chunk lists become file lists first (a file scores its best chunk plus a share of its next
    few); each list adds weight / (k + rank) to its files. Name and path evidence is sparse and
    uneven, so it adds a saturating bonus instead of a rank. Test files are weighed down unless
    the query asks for tests.
    """
    def files(rows: list[dict[str, Any]]) -> dict[FileKey, float]:
        return file_scores(rows, options.file_sum_weight, options.file_sum_chunks)

    lists = [(files(evidence.keyword), options.keyword_weight),
             (files(evidence.semantic), options.semantic_weight)]
    if options.title_list:
        lists.append((files(evidence.title), options.title_weight))
    if options.identifier_list:
        lists.append((files(evidence.identifiers), options.identifier_weight))
    if options.prose_list:
        lists.append((files(evidence.prose), options.prose_weight))
    k = options.rrf_k
    fused = scaled(lists, k) if options.score_fusion else rrf(lists, k)
    if options.symbol_evidence:
        add_bonus(fused, evidence.symbol, options.symbol_weight, options.symbol_scale, k)
    if options.title_symbols:
        add_bonus(fused, evidence.title_symbol, options.symbol_weight, options.symbol_scale, k)
    if options.path_evidence:
        add_bonus(fused, evidence.path, options.path_weight, options.path_scale, k)
    if options.stem_evidence:
        names = dict(evidence.stem)
        for key, score in evidence.folder.items():
            names[key] = names.get(key, 0.0) + options.folder_share * score
        if options.typo_stems:
            for key, score in evidence.typo_stem.items():
                names[key] = names.get(key, 0.0) + score
        add_bonus(fused, names, options.stem_weight, options.stem_scale, k)
    if options.title_stems:
        add_bonus(fused, evidence.title_stem, options.stem_weight, options.stem_scale, k)
    if options.title_calls:
        add_bonus(fused, evidence.title_call, options.symbol_weight, options.symbol_scale, k)
    if options.import_neighbours and evidence.imports:
        neighbours = neighbour_scores(fused, evidence.imports, options.neighbour_hits)
        add_bonus(fused, neighbours, options.neighbour_weight, options.neighbour_scale, k)
    if options.cochange_neighbours and evidence.cochange:
        partners = cochange_scores(fused, evidence.cochange, options.neighbour_hits)
        add_bonus(fused, partners, options.cochange_weight, options.cochange_scale, k)
    if options.test_weight != 1.0 and not evidence.asks_for_tests:
        fused = down_weight_tests(fused, options.test_weight)
    return ordered(fused)


def best_chunks(evidence: FileEvidence) -> dict[FileKey, dict[str, Any]]:
    """Each file's best-scoring chunk across the chunk lists (what a file hit points at)."""
    best: dict[FileKey, dict[str, Any]] = {}
    for rows in (evidence.keyword, evidence.title, evidence.prose, evidence.identifiers, evidence.semantic):
        for rank, row in enumerate(rows):
            key = (row["source"], row["path"])
            if key not in best or rank < best[key]["_rank"]:
                best[key] = {**row, "_rank": rank}
    return best


def search_files(
    lake: Lake,
    query: str,
    mode: SearchMode | None = None,
    limit: int | None = None,
    path_glob: str | None = None,
    lang: str | None = None,
    sources: Sequence[str] | None = None,
    exclude_tests: bool = False,
    options: RankOptions | None = None,
) -> FileSearchResult:
    """Files ranked for a query (chunk scores aggregated per file, fused with name/path evidence)."""
    started = time.perf_counter()
    query = query.strip()
    if not query:
        raise InputError("empty query")
    query, cut = bound_query(query, MAX_ISSUE_CHARS)
    mode = mode or lake.settings.search.mode
    limit = limit or lake.settings.search.limit
    options = options or RankOptions(rrf_k=lake.settings.search.rrf_k)
    where = build_filter(path_glob, lang, sources, exclude_tests)
    evidence = file_evidence(lake, query, mode, where, options)
    best_of = best_chunks(evidence)
    files: list[FileHit] = []
    for rank, ((source, path), _score) in enumerate(fuse_files(evidence, options)[:limit], start=1):
        best = best_of.get((source, path))
        files.append(FileHit(
            source=source, path=path, rank=rank,
            start_line=best["start_line"] if best else None, end_line=best["end_line"] if best else None,
            symbol=best["symbol"] if best else None,
        ))
    warnings = [cut, *evidence.warnings] if cut else list(evidence.warnings)
    unknown = None if files else unknown_lang(lake, lang)
    if unknown:
        warnings.append(unknown)
    return FileSearchResult(query=query, mode=mode, files=files, warnings=warnings,
                            took_ms=round((time.perf_counter() - started) * 1000, 1))
