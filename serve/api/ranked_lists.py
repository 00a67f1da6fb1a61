"""Ranked lists of chunks for a query (CHUNKS): filters, BM25, exact names, vectors, fuzzy names, and their fusion."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ctxlake.errors import InputError
from ctxlake.serve.api.code_lake import Lake, embedded_fraction
from ctxlake.serve.api.query_terms import analyse, query_title, squeeze_repeats
from ctxlake.serve.api.ranking import TEST_PATH, RankOptions, is_test_path, wants_tests
from ctxlake.serve.api.symbols import normalise, symbol_index
from ctxlake.tasks.terms import split_identifier

if TYPE_CHECKING:
    from lancedb.query import LanceVectorQueryBuilder


HIT_COLUMNS = ["id", "source", "path", "start_line", "end_line", "symbol", "kind", "lang", "text"]
# A query's score columns are asked for by name: LanceDB adds them to a projection by itself today
# but warns that it will stop, and every ranking here reads them.
BM25_SCORE = "_score"
VECTOR_DISTANCE = "_distance"
ANN_EF = 100  # HNSW candidates per vector query (see _nearest)
FUZZY_MIN_SCORE = 70.0


# -- filters -------------------------------------------------------------------------------------


def glob_to_regex(glob: str) -> str:
    """A path glob as an anchored regex: `**` spans folders, `*` and `?` stay inside one; a glob
    without a slash matches the file name at any depth, as in .gitignore."""
    if not glob:
        raise InputError("empty --path glob")
    out = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = glob.find("]", i + 1)
            if end == -1:
                raise InputError(f"unbalanced '[' in glob {glob!r}")
            body = glob[i + 1 : end].replace("\\", "\\\\")
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    prefix = "^(?:.*/)?" if "/" not in glob.rstrip("/") else "^"
    return prefix + body + "$"


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def build_filter(
    path_glob: str | None = None,
    lang: str | None = None,
    sources: Sequence[str] | None = None,
    exclude_tests: bool = False,
) -> str | None:
    parts = []
    if exclude_tests:
        parts.append(f"NOT regexp_like(path, {_sql(TEST_PATH.pattern)})")
    if path_glob:
        parts.append(f"regexp_like(path, {_sql(glob_to_regex(path_glob))})")
    if lang:
        parts.append(f"lang = {_sql(lang.lower())}")
    if sources:
        parts.append(f"source IN ({', '.join(_sql(s) for s in sources)})")
    return " AND ".join(parts) or None


# -- ranked lists --------------------------------------------------------------------------------


def keyword_query(query: str) -> str:
    """The query plus the words hidden in its identifiers (`getUserById` -> get user by id), so
    it matches both the raw text and the split `terms` field."""
    extra: list[str] = []
    for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", query):
        parts = split_identifier(token)
        if len(parts) > 1:
            extra.extend(parts)
    return query if not extra else f"{query} {' '.join(extra)}"


def keyword_rows(
    lake: Lake, query: str, limit: int, where: str | None, fuzziness: int = 0, squeeze: bool = False
) -> list[dict[str, Any]]:
    """BM25 over text and terms; `fuzziness` > 0 lets each query word match within that many edits."""
    from lancedb.query import BooleanQuery, FullTextQuery, MatchQuery, MultiMatchQuery, Occur

    text = keyword_query(squeeze_repeats(query) if squeeze else query)
    if not re.search(r"[A-Za-z0-9]", text):
        return []
    fts: FullTextQuery
    if fuzziness:
        # MultiMatchQuery has no fuzziness: the same OR over both fields, one fuzzy match each.
        fts = BooleanQuery([(Occur.SHOULD, MatchQuery(text, column, fuzziness=fuzziness))  # type: ignore[call-arg]
                            for column in ("text", "terms")])
    else:
        # lancedb declares these options as Field(default, kw_only=True), which mypy reads as required.
        fts = MultiMatchQuery(text, ["text", "terms"])  # type: ignore[call-arg]
    search = lake.chunks.search(fts, query_type="fts")
    if where:
        search = search.where(where, prefilter=True)
    rows: list[dict[str, Any]] = search.select([*HIT_COLUMNS, BM25_SCORE]).limit(limit).to_list()
    for row in rows:
        row["_rank_score"] = float(row.get(BM25_SCORE, 0.0))
    return rows


def identifier_rows(
    lake: Lake, identifiers: Sequence[str], limit: int, where: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Chunks containing the query's code names exactly: `ordering_parts` as the phrase
    "ordering parts", `SQLCompiler` as the token `sqlcompiler` (the tokenizer splits on
    punctuation only). Returns (rows, warning); an index built without positions gets a warning."""
    from lancedb.query import BooleanQuery, FullTextQuery, MatchQuery, Occur, PhraseQuery

    clauses: list[tuple[Occur, FullTextQuery]] = []
    for name in identifiers:
        words = [w.lower() for w in re.split(r"[^A-Za-z0-9]+", name) if w]
        if len(words) == 1:
            clauses.append((Occur.SHOULD, MatchQuery(words[0], "text")))  # type: ignore[call-arg]
        elif words:
            clauses.append((Occur.SHOULD, PhraseQuery(" ".join(words), "text")))  # type: ignore[call-arg]
    if not clauses:
        return [], None
    search = lake.chunks.search(BooleanQuery(clauses), query_type="fts")
    if where:
        search = search.where(where, prefilter=True)
    try:
        rows: list[dict[str, Any]] = search.select([*HIT_COLUMNS, BM25_SCORE]).limit(limit).to_list()
    except ValueError as exc:
        if "position" not in str(exc):
            raise
        return [], "exact identifier matching is off: this index predates it (`ctx run index` rebuilds it)"
    for row in rows:
        row["_rank_score"] = float(row.get(BM25_SCORE, 0.0))
    return rows, None


def semantic_rows(lake: Lake, query: str, limit: int, where: str | None, fill: bool = True,
                  held: bool = True) -> list[dict[str, Any]]:
    """The `limit` chunks nearest the query. From the vectors the lake holds in memory when it
    can (`held`); those rows carry only id, `_rowid` and distance unless `fill` (fill_rows)."""
    vector = lake.embedder().embed_query(query)
    # The null test reads every vector (4x the cost of the search on 50k chunks): only a lake
    # that is still being embedded needs it.
    complete = embedded_fraction(lake) == 1.0
    if held and complete and not where and lake.flat is not None:
        rows = _held_nearest(lake, vector, limit)
        if rows is not None and (not fill or fill_rows(lake, rows)):
            return rows
    rows = _nearest(lake, vector.tolist(), limit, ([] if complete else ["vector IS NOT NULL"]) + ([where] if where else []))
    if complete and len(rows) < limit:
        # The fraction was counted on a version an indexer has since replaced with chunks still
        # waiting for vectors; unfiltered, the nearest rows may all be those.
        rows = _nearest(lake, vector.tolist(), limit, ["vector IS NOT NULL"] + ([where] if where else []))
    for row in rows:
        row["_rank_score"] = 1.0 - float(row.get(VECTOR_DISTANCE, 1.0))
    return rows


def _held_nearest(lake: Lake, vector: Any, limit: int) -> list[dict[str, Any]] | None:
    """The flat search over the vectors the lake holds in memory (serve/api/vectors.py): rows of
    id, `_rowid` and distance; None when those vectors cannot answer."""
    from ctxlake.serve.api.vectors import Unanswerable

    assert lake.flat is not None
    try:
        nearest = lake.flat.nearest(vector, limit)
    except Unanswerable:
        return None
    return [{"id": chunk_id, "_rowid": row_id, VECTOR_DISTANCE: distance, "_rank_score": 1.0 - distance}
            for row_id, chunk_id, distance in nearest]


def fill_rows(lake: Lake, rows: list[dict[str, Any]]) -> bool:
    """Complete, in place, rows that carry only an id (from held vectors) with the columns a hit
    shows. Done after fusion, for the few rows shown: reading all 40 candidates of a hybrid
    query's semantic half was its costliest step. False when a row went away meanwhile (a commit
    after the vectors were read)."""
    wanted = [row for row in rows if "text" not in row]
    if not wanted:
        return True
    taken = lake.chunks.take_row_ids([row["_rowid"] for row in wanted]).select(HIT_COLUMNS).with_row_id().to_list()
    by_row = {found.pop("_rowid"): found for found in taken}
    for row in wanted:
        found = by_row.get(row["_rowid"])
        if found is None or found["id"] != row["id"]:
            return False
        row.update(found)
    return True


def _nearest(lake: Lake, vector: list[float], limit: int, conditions: list[str]) -> list[dict[str, Any]]:
    builder = cast("LanceVectorQueryBuilder", lake.chunks.search(vector, vector_column_name="vector"))
    # ef only matters once the table has its HNSW index (a flat scan ignores it): lance's default
    # of 1.5 x limit found 0.88-0.97 of the flat top 10 (0.93 at 500k rows), ef 100 finds
    # 0.95-0.99 for 2-4 ms more (bench bigrepo --ann-crossover, 10k-500k rows).
    builder = builder.distance_type("cosine").ef(max(ANN_EF, limit))
    if conditions:
        builder = builder.where(" AND ".join(conditions), prefilter=True)
    rows: list[dict[str, Any]] = builder.select([*HIT_COLUMNS, VECTOR_DISTANCE]).limit(limit).to_list()
    return rows


def fuzzy_rows(
    lake: Lake, query: str, limit: int, where: str | None, fuzziness: int = 2
) -> list[dict[str, Any]]:
    """Typo-tolerant: symbol names by edit similarity, then term matches within `fuzziness` edits."""
    from lancedb.query import MatchQuery
    from rapidfuzz import fuzz, process

    index = symbol_index(lake)
    names, keys = index.distinct, index.distinct_keys
    needle = normalise(query)
    # One pass of the C scorer over both key lists (a Python scorer took ~0.2 s on django's 60k
    # names); a name scores the better of its two keys.
    best: dict[int, float] = {}
    for _, score, i in process.extract(needle, keys, scorer=fuzz.ratio, limit=2 * limit):
        best[i % len(names)] = max(best.get(i % len(names), 0.0), float(score))
    scored = sorted(best.items(), key=lambda kv: -kv[1])[:limit]
    out: list[dict[str, Any]] = []
    good = [(names[i], score) for i, score in scored if score >= FUZZY_MIN_SCORE]
    if good:
        listed = ", ".join(_sql(n) for n, _ in good)
        # Merged chunks list several names; match those too.
        cond = f"(symbol IN ({listed}) OR " + " OR ".join(
            f"symbol LIKE {_sql('%' + n + '%')}" for n, _ in good[:10]) + ")"
        if where:
            cond += f" AND {where}"
        rows = lake.chunks.search().where(cond).select(HIT_COLUMNS).limit(limit * 4).to_list()
        rank = {n: s for n, s in good}
        for row in rows:
            names_in = [n.strip() for n in (row["symbol"] or "").split(",")]
            row["_rank_score"] = max((rank.get(n, 0.0) for n in names_in), default=0.0) / 100.0
        out = sorted(rows, key=lambda r: -r["_rank_score"])[:limit]
    words = [w for w in re.findall(r"[A-Za-z0-9_]+", query) if len(w) > 2]
    if words and len(out) < limit:
        fuzzy = MatchQuery(" ".join(words), "text", fuzziness=fuzziness)  # type: ignore[call-arg]
        search = lake.chunks.search(fuzzy, query_type="fts")
        if where:
            search = search.where(where, prefilter=True)
        for row in search.select([*HIT_COLUMNS, BM25_SCORE]).limit(limit).to_list():
            row["_rank_score"] = float(row.get(BM25_SCORE, 0.0)) / 100.0
            out.append(row)
    return out


def lexical_rows(
    lake: Lake, query: str, limit: int, where: str | None, k: int, fuzziness: int = 0
) -> tuple[list[dict[str, Any]], list[str]]:
    """BM25 of the query; when the query names code or has a title line (an issue text), fused
    with the chunks holding those names exactly and with the title's BM25, test files weighed
    down. The techniques and weights are those `ctx eval` measured (serve/api/ranking.py)."""
    options = RankOptions()
    rows = keyword_rows(lake, query, limit, where, fuzziness)
    lists = [(rows, options.keyword_weight)]
    warnings: list[str] = []
    names = [n for n, _ in analyse(query).identifiers.most_common(options.max_identifiers)]
    if names:
        exact, warning = identifier_rows(lake, names, limit, where)
        lists.append((exact, options.identifier_weight))
        warnings += [warning] if warning else []
    title = query_title(query)
    if title:
        lists.append((keyword_rows(lake, title, limit, where, fuzziness), options.title_weight))
    if len(lists) == 1:
        return rows, warnings
    fused = fuse(lists, k)
    if not wants_tests(query):
        for row in fused:
            if is_test_path(row["path"]):
                row["_rank_score"] *= options.test_weight
        fused.sort(key=lambda r: -r["_rank_score"])
    return fused, warnings


def _add_up(contributions: Iterable[tuple[dict[str, Any], float]]) -> list[tuple[dict[str, Any], float]]:
    """Each row (by id) with the sum of its contributions, highest first; ties keep first-seen order."""
    scores: dict[str, float] = {}
    rows: dict[str, dict[str, Any]] = {}
    for row, value in contributions:
        scores[row["id"]] = scores.get(row["id"], 0.0) + value
        rows.setdefault(row["id"], row)
    return [(rows[i], scores[i]) for i in sorted(scores, key=lambda i: -scores[i])]


def fuse(lists: Sequence[tuple[list[dict[str, Any]], float]], k: int) -> list[dict[str, Any]]:
    """Weighted reciprocal-rank fusion: each list adds weight / (k + rank) to its rows' scores."""
    added = _add_up((row, weight / (k + rank)) for ranked, weight in lists for rank, row in enumerate(ranked, start=1))
    return [{**row, "_rank_score": score} for row, score in added]


def sum_scores(lists: Sequence[list[dict[str, Any]]], limit: int) -> list[dict[str, Any]]:
    """Rows of several BM25 queries over one table, by the sum of each row's scores (what one
    query over all their columns gives; a row a list lacks adds nothing)."""
    added = _add_up((row, float(row.get(BM25_SCORE) or 0.0)) for ranked in lists for row in ranked)
    return [row for row, _ in added[:limit]]
