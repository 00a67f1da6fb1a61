"""Code search over the lake (CHUNKS, FILES): `search`, the one query behind `ctx search` and search_code, and its staleness rule."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ctxlake.errors import InputError
from ctxlake.serve.api.code_lake import Lake, embedded_fraction, read_pool
from ctxlake.serve.api.models import Hit, SearchMode, SearchResult, Status, hit_tokens
from ctxlake.serve.api.query_terms import bound_query, query_title
from ctxlake.serve.api.ranked_lists import (
    build_filter,
    fill_rows,
    fuse,
    fuzzy_rows,
    lexical_rows,
    semantic_rows,
)
from ctxlake.serve.api.ranking import RankOptions
from ctxlake.serve.api.tool_models import FileRanking
from ctxlake.serve.api.watched import project_freshness, settle
from ctxlake.tasks import freshness

SNIPPET_LINES = 12
SNIPPET_CHARS = 800
# Candidates each ranked list contributes before fusion, per result asked for.
CANDIDATES_PER_HIT = 4


# -- public queries ------------------------------------------------------------------------------


def snippet(text: str) -> str:
    lines = text.splitlines()
    out = "\n".join(lines[:SNIPPET_LINES])
    if len(out) > SNIPPET_CHARS:
        out = out[:SNIPPET_CHARS].rstrip() + " …"
    elif len(lines) > SNIPPET_LINES:
        out += "\n…"
    return out


def search(
    lake: Lake,
    query: str,
    mode: SearchMode | None = None,
    limit: int | None = None,
    path_glob: str | None = None,
    lang: str | None = None,
    sources: Sequence[str] | None = None,
    bm25_weight: float | None = None,
    check_stale: bool = True,
    fuzziness: int | None = None,
    exclude_tests: bool = False,
    budget_tokens: int | None = None,
) -> SearchResult:
    """Search the lake's chunks; the one query behind `ctx search` and the MCP `search_code`.

    `budget_tokens` bounds the answer: hits are kept in rank order while their estimated tokens
    fit (the first always does), the rest are counted in `omitted`.

    `fuzziness` (0-2 edits per word) widens the keyword matching: keyword and hybrid default to
    exact words (0), fuzzy mode's word fallback to 2.
    """
    started = time.perf_counter()
    query = query.strip()
    if not query:
        raise InputError("empty query")
    query, cut = bound_query(query)
    cfg = lake.settings.search
    mode = mode or cfg.mode
    limit = limit or cfg.limit
    weight = cfg.bm25_weight if bm25_weight is None else bm25_weight
    if not 0.0 <= weight <= 1.0:
        raise InputError(f"bm25_weight must be between 0 and 1, got {weight}")
    if fuzziness is not None and fuzziness not in (0, 1, 2):
        raise InputError(f"fuzziness must be 0, 1 or 2 (edits per word), got {fuzziness}")
    edits = fuzziness or 0
    where = build_filter(path_glob, lang, sources, exclude_tests)
    if check_stale:
        settle(lake.settings.root)  # an edit the service's watcher is applying: wait for it (bounded)
    pool = max(limit * CANDIDATES_PER_HIT, 20)
    warnings: list[str] = [cut] if cut else []
    # Only the modes that use vectors ask: the count follows every commit (a held-vector refresh or
    # a scan of the vector column), which keyword searches polling during a watcher batch paid.
    fraction = embedded_fraction(lake) if mode in ("semantic", "hybrid") else 1.0

    # An issue-like query's vector is its title's (RankOptions.semantic_title: a static model's
    # average over a whole issue says little).
    meaning = (query_title(query) if RankOptions().semantic_title else None) or query
    if mode == "keyword":
        rows, notes = lexical_rows(lake, query, pool, where, cfg.rrf_k, edits)
        warnings += notes
    elif mode == "semantic":
        # Not an error: during a (re-)index vectors arrive after their chunks; say so instead.
        if fraction == 0.0:
            warnings.append("no chunk has a vector yet: wait for `ctx run index` to embed, or use --mode keyword")
            rows = []
        else:
            rows = semantic_rows(lake, meaning, limit, where)
            if not rows:
                # A re-index began meanwhile? Read the version afresh: the memoised one may predate
                # the commit that replaced every chunk with one still waiting for its vector.
                if embedded_fraction(lake, fresh=True) == 0.0:
                    warnings.append("no chunk has a vector yet: wait for `ctx run index` to embed, or use --mode keyword")
                else:  # the query read a version between the chunks' write and their vectors': ask again
                    rows = semantic_rows(lake, meaning, limit, where)
    elif mode == "fuzzy":
        if len(query.split()) >= SENTENCE_WORDS:
            warnings.append("fuzzy mode matches symbol names and single words with typos; for a sentence "
                            "or a question use hybrid (the default) or keyword")
        rows = fuzzy_rows(lake, query, limit, where, 2 if fuzziness is None else fuzziness)
    elif mode == "hybrid":
        semantic = read_pool().submit(semantic_rows, lake, meaning, pool, where, False) if fraction != 0.0 else None
        lexical, notes = lexical_rows(lake, query, pool, where, cfg.rrf_k, edits)
        warnings += notes
        if semantic is None:
            warnings.append("semantic part skipped: no chunk is embedded yet")
            rows = lexical
        else:
            rows = fuse([(lexical, weight), (semantic.result(), 1.0 - weight)], cfg.rrf_k)
            if not fill_rows(lake, rows[:limit]):  # a shown row went away: the semantic half from the table
                rows = fuse([(lexical, weight), (semantic_rows(lake, meaning, pool, where, held=False), 1.0 - weight)],
                            cfg.rrf_k)
    else:
        raise InputError(f"unknown mode {mode!r}", hint="hybrid, keyword, semantic or fuzzy")
    if 0.0 < fraction < 1.0 and mode in ("hybrid", "semantic"):
        warnings.append(f"only {fraction:.0%} of chunks are embedded so far")

    hits = [
        Hit(
            source=r["source"], path=r["path"], start_line=r["start_line"], end_line=r["end_line"],
            symbol=r["symbol"], kind=r["kind"], lang=r["lang"],
            rank=i, snippet=snippet(r["text"]),
        )
        for i, r in enumerate(rows[:limit], start=1)
    ]
    hits, used, omitted = within_budget(hits, budget_tokens)
    unknown = None if hits else unknown_lang(lake, lang)
    if unknown:
        warnings.append(unknown)
    if omitted:
        warnings.append(f"{omitted} more hit(s) left out to stay within {budget_tokens} tokens "
                        "(raise the budget, or narrow the query or filters)")
    result = SearchResult(
        query=query, mode=mode, hits=hits, stale=False,
        embedded_fraction=round(fraction, 4) if mode in ("semantic", "hybrid") else None, warnings=warnings, tokens_used=used, omitted=omitted, took_ms=round((time.perf_counter() - started) * 1000, 1),
    )
    if check_stale:
        mark_stale(result, project_freshness(lake.settings))
    return result


def unknown_lang(lake: Lake, lang: str | None) -> str | None:
    """A warning when `lang` is no language of the index (`py` for python), so the filter matched
    nothing; asked only of an empty answer."""
    if not lang:
        return None
    import pyarrow.compute as pc

    column = lake.files.search().select(["lang"]).limit(None).to_arrow().column("lang")
    known = sorted(v for v in pc.unique(column).to_pylist() if v)
    if lang.lower() in known:
        return None
    return f"no language {lang!r} in the index; known: {', '.join(known) or 'none'}"


STALE_SHOWN = 50  # changed files an answer lists
SENTENCE_WORDS = 4  # a fuzzy query of this many words is a sentence, not a name


def within_budget(hits: list[Hit], budget_tokens: int | None) -> tuple[list[Hit], int, int]:
    """(hits in rank order, a token budget or None) -> (the hits kept, their tokens, how many were left out)."""
    kept: list[Hit] = []
    used = 0
    for hit in hits:
        cost = hit_tokens(hit)
        if budget_tokens is not None and kept and used + cost > budget_tokens:
            break
        kept.append(hit)
        used += cost
    return kept, used, len(hits) - len(kept)


def mark_stale(result: SearchResult | FileRanking | Status, fresh: freshness.Freshness) -> None:
    """The one staleness rule every face shows: the changed files, and a warning when the index
    is behind for another reason (an unfinished run, another model) with no file changed."""
    result.stale = bool(fresh.stale_paths)
    result.stale_paths = fresh.stale_paths[:STALE_SHOWN]
    behind = fresh.reason if not fresh.up_to_date and not fresh.stale_paths else None
    if behind == freshness.NOT_INDEXED:
        # Sources added before the project's first run: their rows are there, the project's are not.
        behind = "the project's own files are not indexed yet (`ctx run index`); only its sources are"
    if isinstance(result, Status):
        result.stale_count = len(fresh.stale_paths)
        result.behind = behind
    elif isinstance(result, SearchResult) and behind:
        result.warnings.append(behind if fresh.reason == freshness.NOT_INDEXED else f"index may be behind: {behind}")
