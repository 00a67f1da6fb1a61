"""Read-side queries over the lake (CHUNKS, FILES): search and status, shared by the CLI and the MCP server."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import pyarrow as pa

from ctxlake.errors import ConfigError, InputError, ModelMismatchError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.serve.api.handles import memo_schema
from ctxlake.serve.api.models import Hit, SearchMode, SearchResult, Status, hit_tokens
from ctxlake.serve.api.query_terms import analyse, bound_query, query_title, squeeze_repeats
from ctxlake.serve.api.ranking import (
    TEST_PATH,
    LakeCatalog,
    RankOptions,
    assigned_names,
    is_test_path,
    wants_tests,
)
from ctxlake.serve.api.symbols import normalise, symbol_index
from ctxlake.serve.api.tool_models import FileRanking
from ctxlake.serve.api.watched import project_freshness, settle
from ctxlake.tasks import freshness
from ctxlake.tasks.lake import (
    CHUNKS_TABLE,
    FILES_TABLE,
    IndexState,
    WriterLock,
    connect,
    open_table,
)
from ctxlake.tasks.merkle import not_indexed
from ctxlake.tasks.run_log import folder_stamp
from ctxlake.tasks.secrets import MASK_PREFIX
from ctxlake.tasks.terms import split_identifier

if TYPE_CHECKING:
    from lancedb.query import LanceVectorQueryBuilder
    from lancedb.table import Table

    from ctxlake.serve.api.vectors import FlatVectors
    from ctxlake.tasks.embedder_base import Embedder

HIT_COLUMNS = ["id", "source", "path", "start_line", "end_line", "symbol", "kind", "lang", "text"]
# A query's score columns are asked for by name: LanceDB adds them to a projection by itself today
# but warns that it will stop, and every ranking here reads them.
BM25_SCORE = "_score"
VECTOR_DISTANCE = "_distance"
SNIPPET_LINES = 12
SNIPPET_CHARS = 800
# Candidates each ranked list contributes before fusion, per result asked for.
CANDIDATES_PER_HIT = 4
ANN_EF = 100  # HNSW candidates per vector query (see _nearest)
FUZZY_MIN_SCORE = 70.0
# A long-lived reader (the MCP server) checks for a newer table version on every query: a cheap
# manifest read, and an edit seen by the watcher is searchable at once.
READ_CONSISTENCY = timedelta(0)
# ... but that read goes through LanceDB's one event-loop thread, and a hybrid query asked for the
# version three times (vectors held? fraction counted?): ~15% of the service's samples under ten
# concurrent sessions. Those checks share one read per this many seconds; the rows a query reads
# are always the latest.
VERSION_MEMO_S = 0.05


class Lake:
    """The lake opened for reading, once per CLI command or once per MCP server.

    Readers see the last committed version of each table (Lance snapshots), never a half-written
    one, and pick up newer versions as soon as they are committed.
    """

    def __init__(self, settings: Settings, embedder: Embedder | None = None) -> None:
        self.settings = settings
        self.state = IndexState.read(settings.lake_dir)
        if self.state is None:
            raise NotIndexedError(
                f"{settings.root} is not indexed yet", hint="run `ctx run index` there first"
            )
        self.db = connect(settings.lake_dir, read_consistency=READ_CONSISTENCY)
        chunks = memo_schema(open_table(self.db, CHUNKS_TABLE))
        files = memo_schema(open_table(self.db, FILES_TABLE))
        if chunks is None or files is None:
            raise NotIndexedError(f"the lake at {settings.lake_dir} has no tables yet",
                                  hint="run `ctx run index` to build it")
        self.chunks: Table = chunks
        self.files: Table = files
        self._embedder: Embedder | None = None
        if embedder is not None:
            self._check_model(embedder)
            self._embedder = embedder
        self._counts: tuple[int, int, int] | None = None  # (table version, chunks, chunks without a vector)
        self._catalogs: dict[str | None, tuple[int, LakeCatalog]] = {}
        self._imports: tuple[int, dict[tuple[str, str], set[tuple[str, str]]]] | None = None
        self._cochange: tuple[int, dict[tuple[str, str], dict[tuple[str, str], float]]] | None = None
        # (files version, chunks version) -> per-source figures (source_queries.index_stats)
        self._source_stats: tuple[tuple[int, int], dict[str, Any]] | None = None
        self.flat: FlatVectors | None = None  # chunk vectors in memory, for long-lived readers
        self._version: tuple[float, int] | None = None  # (monotonic time read, chunks version)

    def chunks_version(self, fresh: bool = False) -> int:
        """The chunks table's latest version, read at most once per VERSION_MEMO_S unless `fresh`."""
        now = time.monotonic()
        memo = self._version
        if fresh or memo is None or now - memo[0] >= VERSION_MEMO_S:
            memo = self._version = (now, int(self.chunks.version))
        return memo[1]

    def keep_vectors(self, like: Lake | None = None) -> FlatVectors:
        """Answer flat semantic queries from vectors held in memory (serve/api/vectors.py); a
        long-lived reader calls this once. `like`: a Lake this one replaces, whose vectors it takes
        over (only the rows changed since are read)."""
        from ctxlake.serve.api.vectors import FlatVectors

        if self.flat is None:
            old = like.flat if like is not None else None
            self.flat = (old.rebind(self.chunks, self.chunks_version, self._pending_vectors) if old is not None
                         else FlatVectors(self.chunks, self.chunks_version, self._pending_vectors))
        return self.flat

    def _pending_vectors(self) -> int:
        """Chunks waiting for a vector as the last run left them (an unreadable state: assume some)."""
        state = IndexState.read(self.settings.lake_dir)
        return 1 if state is None else int(state.pending_vectors)

    # -- helpers ---------------------------------------------------------------------------------

    def embedder(self) -> Embedder:
        """The query embedder, loaded on first semantic query; it must match the index's model."""
        if self._embedder is None:
            from ctxlake.tasks.embedders import make_embedder

            embedder = make_embedder(self.settings.embed, self.settings.models_dir)
            self._check_model(embedder)
            self._embedder = embedder
        return self._embedder

    def _check_model(self, embedder: Embedder) -> None:
        if self.state is not None and self.state.model_id and self.state.model_id != embedder.model_id:
            raise ModelMismatchError(
                f"index was built with {self.state.model_id}, config says {embedder.model_id}",
                hint="run `ctx run index --force`, or search with --mode keyword",
            )

    def catalog(self, where: str | None = None) -> LakeCatalog:
        """Files and the names they define (chunks matching `where`), cached per table version."""
        version = self.chunks.version
        cached = self._catalogs.get(where)
        if cached is None or cached[0] != version:
            search = self.chunks.search()
            if where:
                search = search.where(where)
            table = search.select(["source", "path", "symbol"]).to_arrow()
            # Module-level code (constants, settings) has no symbol: read its names from the text.
            module = self.chunks.search().where(f"kind = 'module'{f' AND {where}' if where else ''}")
            mod = module.select(["source", "path", "text"]).to_arrow()
            assigned = [(src, path, name) for src, path, text in zip(
                mod.column("source").to_pylist(), mod.column("path").to_pylist(),
                mod.column("text").to_pylist(), strict=True) for name in assigned_names(text)]
            catalog = LakeCatalog.build(zip(
                table.column("source").to_pylist(), table.column("path").to_pylist(),
                table.column("symbol").to_pylist(), strict=True), assigned)
            cached = self._catalogs[where] = (version, catalog)
        return cached[1]

    def imports(self) -> dict[tuple[str, str], set[tuple[str, str]]]:
        """(source, path) -> the indexed files it imports (the graph's resolved imports), cached per
        table version; empty for a lake without the graph."""
        from ctxlake.tasks.graph_store import IMPORTS_TABLE

        table = open_table(self.db, IMPORTS_TABLE)
        if table is None:
            return {}
        version = table.version
        if self._imports is None or self._imports[0] != version:
            rows = table.search().where("resolved IS NOT NULL").select(["source", "path", "resolved"]) \
                .limit(None).to_arrow()
            out: dict[tuple[str, str], set[tuple[str, str]]] = {}
            for source, path, resolved in zip(rows.column("source").to_pylist(), rows.column("path").to_pylist(),
                                              rows.column("resolved").to_pylist(), strict=True):
                if resolved != path:
                    out.setdefault((source, path), set()).add((source, resolved))
            self._imports = (version, out)
        return self._imports[1]

    def cochange(self) -> dict[tuple[str, str], dict[tuple[str, str], float]]:
        """(source, path) -> the files changed in the same commits, each with its strength in 0..1
        (as `ctx related` shows it), cached per table version; empty without git history."""
        from ctxlake.schemas.tables import COCHANGE_TABLE
        from ctxlake.tasks.cochange import newest_weight, strength

        table = open_table(self.db, COCHANGE_TABLE)
        if table is None:
            return {}
        version = table.version
        if self._cochange is None or self._cochange[0] != version:
            rows = table.search().select(["source", "path", "other", "weight"]).limit(None).to_arrow()
            tops: dict[str, float | None] = {}
            out: dict[tuple[str, str], dict[tuple[str, str], float]] = {}
            for source, path, other, weight in zip(*(rows.column(c).to_pylist() for c in
                                                     ("source", "path", "other", "weight")), strict=True):
                if source not in tops:
                    tops[source] = newest_weight(self.settings.lake_dir, source)
                top = tops[source]
                if top:
                    out.setdefault((source, path), {})[(source, other)] = strength(float(weight), top)
            self._cochange = (version, out)
        return self._cochange[1]

    def refresh(self) -> None:
        self.state = IndexState.read(self.settings.lake_dir) or self.state
        for table in (self.chunks, self.files):
            table.checkout_latest()


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


# -- public queries ------------------------------------------------------------------------------


def snippet(text: str) -> str:
    lines = text.splitlines()
    out = "\n".join(lines[:SNIPPET_LINES])
    if len(out) > SNIPPET_CHARS:
        out = out[:SNIPPET_CHARS].rstrip() + " …"
    elif len(lines) > SNIPPET_LINES:
        out += "\n…"
    return out


def embedding_counts(lake: Lake, fresh: bool = False) -> tuple[int, int]:
    """(chunks, chunks still without a vector), counted once per table version: the null count
    scans the whole vector column (on django's 47k chunks ~0.1 s of CPU, which get_stale_status
    paid on every call). `fresh`: read the version now, not the one memoised for VERSION_MEMO_S."""
    version = lake.chunks_version(fresh)
    if lake._counts is not None and lake._counts[0] == version:
        return lake._counts[1], lake._counts[2]
    total = lake.chunks.count_rows()  # from the table's metadata
    if total == 0 or (lake.flat is not None and lake.flat.complete()):  # its refresh costs less than the count
        pending = 0
    else:
        pending = lake.chunks.count_rows("vector IS NULL")
    lake._counts = (version, total, pending)
    return total, pending


def embedded_fraction(lake: Lake, fresh: bool = False) -> float:
    """Share of chunks with a vector (embedding_counts)."""
    total, pending = embedding_counts(lake, fresh)
    return 0.0 if total == 0 else 1.0 - pending / total


# Hybrid search runs its semantic half on a worker while the lexical half runs on the caller's
# thread (LanceDB releases the GIL): below the ANN threshold the vector scan is most of a query
# (~55 ms of ~80 on django's 47k chunks), and the answer arrives in about the longer half's time.
# search_context runs its table queries here too. Jobs never wait on other jobs of this pool.
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def read_pool() -> ThreadPoolExecutor:
    """The read side's worker threads for queries that run side by side."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ctx-read")
        return _pool


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
    if isinstance(result, Status):
        result.stale_count = len(fresh.stale_paths)
    elif isinstance(result, SearchResult) and not fresh.up_to_date and not fresh.stale_paths \
            and fresh.reason != "up to date":
        result.warnings.append(f"index may be behind: {fresh.reason}")


def memory_malformed(memory_dir: Path) -> dict[str, dict[str, int]]:
    """Malformed records in the conversation logs as of the last `ctx run ingest` (read from its saved positions)."""
    from ctxlake.errors import LakeError
    from ctxlake.tasks.scrape import ScrapeState, malformed_totals

    try:
        return malformed_totals(ScrapeState.load(memory_dir))
    except (LakeError, TypeError, ValueError):  # a damaged state file: status still answers
        return {}


def status(settings: Settings, check_stale: bool = True) -> Status:
    """What is indexed, with which model, how fresh, and whether an indexer is running."""
    lake_dir = settings.lake_dir
    out = Status(root=str(settings.root), lake_dir=str(lake_dir), indexed=False)
    out.config_trust = _config_trust(settings)
    out.writer = WriterLock(lake_dir).held_by_other() if lake_dir.is_dir() else None
    out.memory_malformed = memory_malformed(settings.memory_dir)
    state = IndexState.read(lake_dir) if lake_dir.is_dir() else None
    if state is None:
        return out
    out.provider, out.model, out.model_id, out.dims = state.provider, state.model, state.model_id, state.dims
    out.last_run, out.clean = state.last_run, state.clean
    out.source_runs = dict(state.source_runs or {})
    lake_bytes, stamp = folder_stamp(lake_dir)
    # A clean state with nothing pending is exact (every writer of chunks is an index run, which
    # marks the state unclean until it has counted again): the count reads the whole vector column
    # (0.3 s and ~0.3 GB on the 100k-file tree).
    counts = _index_counts(lake_dir, stamp, none_pending=state.clean and state.pending_vectors == 0)
    if counts is not None:
        out.indexed = True
        out.chunks, out.pending_vectors, out.files = counts.chunks, counts.pending_vectors, counts.files
        out.embedded = out.chunks - out.pending_vectors
        out.languages, out.sources = dict(counts.languages), dict(counts.sources)
        out.masked_chunks = counts.masked_chunks
    # From the snapshot of the last whole scan (a watcher's batch sees only the changed paths).
    for _, why, _ in not_indexed(lake_dir, PROJECT_SOURCE):
        out.not_indexed[why] = out.not_indexed.get(why, 0) + 1
    out.secret_files_skipped = out.not_indexed.get("secret", 0)
    if check_stale:
        mark_stale(out, project_freshness(settings))
    out.lake_bytes = lake_bytes
    return out


def not_indexed_files(settings: Settings) -> list[tuple[str, str, int]]:
    """(path, reason, bytes) of the project's files the last scan saw but did not index, by path."""
    return not_indexed(settings.lake_dir, PROJECT_SOURCE)


class IndexCounts(NamedTuple):
    chunks: int
    pending_vectors: int
    files: int
    languages: dict[str, int]  # files per language
    sources: dict[str, int]  # chunks per source
    masked_chunks: int


# lake folder -> (its stamp when counted, the counts): a long-lived reader (the UI's Overview, the MCP
# server) recounts only after a write; the masked-text count alone reads every chunk's text (~0.3 s
# on django's lake).
_counted: dict[str, tuple[int, IndexCounts | None]] = {}


def _index_counts(lake_dir: Path, stamp: int, none_pending: bool = False) -> IndexCounts | None:
    """The index tables' counts for `status`, or None when they do not exist yet; the stamp is taken
    before the tables are read, so a write landing meanwhile is counted by the next call.
    `none_pending`: the caller knows no chunk is without a vector (not counted then)."""
    hit = _counted.get(str(lake_dir))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    db = connect(lake_dir)
    chunks, files = open_table(db, CHUNKS_TABLE), open_table(db, FILES_TABLE)
    counts = None
    if chunks is not None and files is not None:
        file_rows = files.search().select(["lang", "source"]).to_arrow()
        chunk_sources = chunks.search().select(["source"]).to_arrow()
        counts = IndexCounts(
            chunks=chunks.count_rows(), pending_vectors=0 if none_pending else chunks.count_rows("vector IS NULL"),
            files=file_rows.num_rows,
            languages=_counts(file_rows.column("lang")), sources=_counts(chunk_sources.column("source")),
            masked_chunks=chunks.count_rows(f"text LIKE '%{MASK_PREFIX}%'"))
    _counted[str(lake_dir)] = (stamp, counts)
    return counts


def _config_trust(settings: Settings) -> dict[str, Any]:
    import tomllib

    from ctxlake.schemas import trust
    from ctxlake.schemas.sources import untrusted_sources

    try:
        parsed = tomllib.loads(settings.config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        parsed = {}  # absent (reported as such) or unparsable (load_settings already said so)
    st = trust.state(settings.config_path, parsed, settings.home)
    with contextlib.suppress(ConfigError):  # a broken sources.toml is reported by the commands that use it
        st.untrusted_sources = [s.name for s in untrusted_sources(settings.root, settings.home)]
    return {**st.as_dict(), "summary": st.summary}


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    import pyarrow.compute as pc

    counts = pc.value_counts(column.fill_null("(unknown)")).to_pylist()
    return dict(sorted(((c["values"], c["counts"]) for c in counts), key=lambda kv: -kv[1]))


def all_rows(table: Any, columns: list[str], where: str | None = None) -> pa.Table:
    """Every matching row of a LanceDB table, only the named columns (a scan without a limit)."""
    query = table.search().select(columns)
    if where:
        query = query.where(where)
    result: pa.Table = query.to_arrow()
    return result
