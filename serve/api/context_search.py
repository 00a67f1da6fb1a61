"""Search over conversation memory (MESSAGES, SESSIONS, KNOWLEDGE): search_context across the tables, and the knowledge records (project_knowledge; remember writes one)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ctxlake.errors import InputError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.code_lake import read_pool
from ctxlake.serve.api.memory_lake import (
    KNOWLEDGE_COLUMNS,
    KNOWLEDGE_KINDS,
    MESSAGE_COLUMNS,
    SESSION_COLUMNS,
    MemoryLake,
    _and,
    _in,
    _since,
    _trim,
    _until,
)
from ctxlake.serve.api.memory_models import (
    ContextHit,
    ContextMode,
    ContextResult,
    ContextType,
    Depth,
    KnowledgeList,
    KnowledgeOut,
    RememberResult,
)
from ctxlake.serve.api.memory_sessions import check_tools
from ctxlake.serve.api.ranked_lists import (
    BM25_SCORE,
    VECTOR_DISTANCE,
    fuse,
    keyword_query,
    sum_scores,
)
from ctxlake.tasks.knowledge import inbox_records
from ctxlake.tasks.store import sql_str, vector_indexes

if TYPE_CHECKING:
    from lancedb.query import LanceVectorQueryBuilder
    from lancedb.table import Table


TYPES: tuple[ContextType, ...] = ("message", "session", "decision", "error", "insight")
SUMMARY_CHARS = 1200
SNIPPET_CHARS = 400
DETAIL_CHARS = 2000


# -- search --------------------------------------------------------------------------------------


def _fts(table: Table, query: str, where: str | None, columns: list[str], limit: int,
         column: str = "text") -> list[dict[str, Any]]:
    """BM25 over one indexed column (see `_fts_columns` for why not one query over several)."""
    from lancedb.query import MatchQuery

    text = keyword_query(query)
    if not re.search(r"[A-Za-z0-9]", text):
        return []
    # lancedb declares these options as Field(default, kw_only=True), which mypy reads as required.
    search = table.search(MatchQuery(text, column), query_type="fts")  # type: ignore[call-arg]
    if where:
        search = search.where(where, prefilter=True)
    rows: list[dict[str, Any]] = search.select([*columns, BM25_SCORE]).with_row_id(True).limit(limit).to_list()
    return rows


def _fts_columns(table: Table) -> set[str]:
    """The table's BM25-indexed columns.

    A message's `terms` (tool calls, files) are searched by a query of their own, run beside the
    one over `text`, and the two BM25 scores of a row are added (`sum_scores`): what one
    MultiMatchQuery over both columns ranks, but at 1.55M messages (bench history, 20,000
    sessions) that one query took 104 ms where its two halves took 27 and 9.
    """
    return {c for i in table.list_indices() if i.index_type == "FTS" for c in i.columns}


# IVF partitions a vector query reads at least and at most (memory tables get an IVF_SQ index at
# 10k vectors: tasks/memory_store.py). Measured at 1.55M messages (bench history, 20,000
# sessions; a project's flat scan took 110-150 ms), 40 queries, recall@10 against the flat
# answer: 0.975 in 19 ms (40 or 60 probes: the same; re-ranking by full vectors: 0.99 for 2 ms
# more). A narrow filter (one session) leaves too few rows in 200 partitions (10 of 30 hits): then
# the query is asked again with no limit on partitions (32 ms), which as the first try cost
# 47-50 ms for every query. A table without the index ignores both.
ANN_PROBES = (20, 200)


def _vector(table: Table, vector: list[float], where: str | None, columns: list[str], limit: int) -> list[dict[str, Any]]:
    # No `vector IS NOT NULL` condition: a vector search leaves rows without one out by itself
    # (tested), and as a prefilter it read every vector, which undid an index (13 -> 49 ms).
    def nearest(max_probes: int) -> list[dict[str, Any]]:
        builder = cast("LanceVectorQueryBuilder", table.search(vector, vector_column_name="vector"))
        builder = builder.distance_type("cosine").minimum_nprobes(ANN_PROBES[0]).maximum_nprobes(max_probes)
        if where:
            builder = builder.where(where, prefilter=True)
        found: list[dict[str, Any]] = builder.select([*columns, VECTOR_DISTANCE]).with_row_id(True).limit(limit).to_list()
        return found

    rows = nearest(ANN_PROBES[1])
    if len(rows) < limit and where and vector_indexes(table):
        return nearest(0)  # a flat scan (no index) has already seen every row the filter allows
    return rows


def search_context(
    lake: MemoryLake, query: str, mode: ContextMode = "hybrid", depth: Depth = "summary",
    types: Sequence[str] | None = None, tools: Sequence[str] | None = None, after: datetime | None = None,
    before: datetime | None = None, limit: int = 10, all_projects: bool = False,
) -> ContextResult:
    """Messages, session summaries and knowledge matching `query`, fused across tables."""
    started = time.perf_counter()
    query = query.strip()
    if not query:
        raise InputError("empty query")
    if mode not in ("hybrid", "keyword", "semantic"):
        raise InputError(f"unknown mode {mode!r}", hint="hybrid, keyword or semantic")
    if depth not in ("summary", "detail", "raw"):
        raise InputError(f"unknown depth {depth!r}", hint="summary, detail or raw")
    if not 1 <= limit <= 200:
        raise InputError(f"limit must be between 1 and 200, got {limit}")
    check_tools(tools)
    wanted = set(types or TYPES)
    unknown = wanted - set(TYPES) - {"knowledge"}
    if unknown:
        raise InputError(f"unknown type(s) {', '.join(sorted(unknown))}", hint=f"one of {', '.join(TYPES)}, knowledge")
    if "knowledge" in wanted:
        wanted = (wanted - {"knowledge"}) | set(KNOWLEDGE_KINDS)
    warnings: list[str] = []
    pool_size = max(limit * 3, 20)
    weight = lake.settings.search.bm25_weight if mode == "hybrid" else 1.0
    scope = lake.scope(all_projects)
    lists: list[tuple[list[dict[str, Any]], float]] = []
    qvec: list[float] | None = None

    def semantic(model_id: str, what: str) -> list[float] | None:
        nonlocal qvec
        if mode == "keyword":
            return None
        embedder = lake.embedder()
        if model_id != embedder.model_id:
            warnings.append(f"semantic search of {what} skipped: its vectors were made with {model_id or 'no model'}, "
                            f"the configuration says {embedder.model_id} (run `ctx run ingest`)")
            return None
        if qvec is None:
            qvec = embedder.embed_query(query).tolist()
        return qvec

    # The table queries (BM25 and vectors over up to three tables) run at once on the read pool:
    # LanceDB releases the GIL, and one after another they cost their sum (~200 ms at 2,000
    # sessions where the slowest alone is ~70).
    # Each returns ids and row ids only (knowledge: its type too); the columns a hit shows are read
    # after fusion, for the rows shown (fill_hits): the candidates' texts were most of the reads.
    jobs: list[tuple[list[Future[list[dict[str, Any]]]], str, float]] = []
    tables: dict[str, tuple[Table, list[str]]] = {}  # kind -> (table, columns a hit shows)
    pool = read_pool()

    def add(fn: Callable[..., list[dict[str, Any]]], table: Table, what: Any, where: str | None,
            columns: list[str], kind: str, w: float) -> None:
        tables[kind] = (table, columns)
        jobs.append(([pool.submit(fn, table, what, where, _narrow(kind), pool_size)], kind, w))

    def add_keyword(table: Table, where: str | None, columns: list[str], kind: str) -> None:
        tables[kind] = (table, columns)
        indexed = _fts_columns(table)
        parts = [pool.submit(_fts, table, query, where, _narrow(kind), pool_size, c)
                 for c in ("text", "terms") if c in indexed]
        if parts:
            jobs.append((parts, kind, weight))

    memory_ready = lake.messages is not None and lake.sessions is not None
    if ("message" in wanted or "session" in wanted) and not memory_ready:
        warnings.append("no agent conversations ingested yet (run `ctx run ingest`)")
    if memory_ready and lake.messages is not None and lake.sessions is not None:
        model = lake.state.model_id if lake.state else ""
        tool_where = _in("tool", tools)
        if "message" in wanted:
            where = _and(scope, tool_where, _since("timestamp", after), _until("timestamp", before))
            if mode != "semantic":
                add_keyword(lake.messages, where, MESSAGE_COLUMNS, "message")
            vec = semantic(model, "messages")
            if vec is not None:
                add(_vector, lake.messages, vec, where, MESSAGE_COLUMNS, "message", 1.0 - weight if mode == "hybrid" else 1.0)
        if "session" in wanted:
            where = _and(scope, tool_where, _since("ended_at", after), _until("started_at", before))
            cols = [*SESSION_COLUMNS, "session_id"]
            if mode != "semantic":
                add_keyword(lake.sessions, where, cols, "session")
            vec = semantic(model, "sessions")
            if vec is not None:
                add(_vector, lake.sessions, vec, where, cols, "session", 1.0 - weight if mode == "hybrid" else 1.0)
    kinds = [k for k in KNOWLEDGE_KINDS if k in wanted]
    if kinds and lake.knowledge is not None and not tools and lake.knowledge.count_rows() > 0:
        where = _and("superseded_by IS NULL", _in("type", kinds), _since("created_at", after),
                     _until("created_at", before))
        if mode != "semantic":
            add_keyword(lake.knowledge, where, KNOWLEDGE_COLUMNS, "knowledge")
        vec = semantic(lake.knowledge_model, "knowledge")
        if vec is not None:
            add(_vector, lake.knowledge, vec, where, KNOWLEDGE_COLUMNS, "knowledge", 1.0 - weight if mode == "hybrid" else 1.0)
    for parts, kind, w in jobs:
        rows = parts[0].result() if len(parts) == 1 else sum_scores([p.result() for p in parts], pool_size)
        for r in rows:
            r["_type"] = kind if kind != "knowledge" else r["type"]
            r["_table"] = kind
            r["id"] = f"{r['_type']}:{r['id']}"
        lists.append((rows, w))
    fused = fuse(lists, lake.settings.search.rrf_k)[:limit]
    fill_hits(fused, tables)
    hits = [_hit(r, depth) for r in fused]
    return ContextResult(query=query, mode=mode, depth=depth, hits=hits, warnings=warnings,
                         took_ms=round((time.perf_counter() - started) * 1000, 1))


def _narrow(kind: str) -> list[str]:
    return ["id", "type"] if kind == "knowledge" else ["id"]


def fill_hits(rows: list[dict[str, Any]], tables: dict[str, tuple[Table, list[str]]]) -> None:
    """Complete, in place, fused rows that carry only ids with the columns their hit shows: one
    take by row id per table. A row whose id is no longer at its row id (a compaction moved it
    meanwhile) is read by its id instead. The tables' takes run side by side on the read pool."""
    def take(table: Table, columns: list[str], wanted: list[dict[str, Any]]) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = table.take_row_ids([r["_rowid"] for r in wanted]).select(columns).with_row_id().to_list()
        return found

    jobs = []
    for kind, (table, columns) in tables.items():
        wanted = [r for r in rows if r["_table"] == kind]
        if wanted:
            jobs.append((table, columns, wanted, read_pool().submit(take, table, columns, wanted)))
    for table, columns, wanted, job in jobs:
        by_row = {found.pop("_rowid"): found for found in job.result()}
        missing: dict[str, dict[str, Any]] = {}
        for r in wanted:
            bare = r["id"].split(":", 1)[1]
            found = by_row.get(r["_rowid"])
            if found is None or found["id"] != bare:
                missing[bare] = r
            else:
                r.update({**found, "id": r["id"]})
        if missing:
            where = f"id IN ({', '.join(sql_str(i) for i in missing)})"
            for found in table.search().where(where).select(columns).to_list():
                if found["id"] in missing:
                    moved = missing.pop(found["id"])
                    moved.update({**found, "id": moved["id"]})
        for r in missing.values():  # deleted meanwhile: left out
            rows.remove(r)


def _hit(row: dict[str, Any], depth: Depth) -> ContextHit:
    kind = row["_type"]
    score = round(float(row["_rank_score"]), 6)
    ref = row["id"].split(":", 1)[1]
    if kind == "message":
        calls = "".join(f"\n[{c.get('name')}] {c.get('input') or ''}" + (" (error)" if c.get("is_error") else "")
                        for c in row["tool_calls"] or [])
        full = row["text"] + (calls if depth == "raw" else "")
        text = {"summary": _trim(row["text"], SNIPPET_CHARS), "detail": _trim(row["text"], DETAIL_CHARS), "raw": full}[depth]
        return ContextHit(type="message", ref=ref, session_ref=f"{row['tool']}:{row['session_id']}", tool=row["tool"],
                          timestamp=row["timestamp"], role=row["role"], text=text or calls.strip(), score=score)
    if kind == "session":
        summary = row["llm_summary"] or row["text"]
        text = {"summary": _trim(summary, SUMMARY_CHARS), "detail": row["text"], "raw": row["text"]}[depth]
        return ContextHit(type="session", ref=ref, session_ref=ref, tool=row["tool"], timestamp=row["ended_at"],
                          title=row["title"], text=text, score=score)
    body = {"summary": _trim(row["body"], SNIPPET_CHARS), "detail": row["body"], "raw": row["text"]}[depth]
    return ContextHit(type=kind, ref=ref, session_ref=row["source_session"], tool=row["source_tool"],
                      timestamp=row["created_at"], title=row["title"], text=body, score=score)


# -- knowledge -----------------------------------------------------------------------------------


def _knowledge(row: dict[str, Any]) -> KnowledgeOut:
    return KnowledgeOut(**{k: row[k] for k in ("id", "type", "title", "body", "created_at", "supersedes", "superseded_by",
                                               "source_tool", "source_session", "path")},
                        files=row["files"] or [], tags=row["tags"] or [])


def project_knowledge(lake: MemoryLake, kind: str | None = None, query: str | None = None, limit: int = 20,
                      include_superseded: bool = False) -> KnowledgeList:
    """This project's knowledge records (current ones unless asked), newest first, or the best matches for `query`."""
    if kind is not None and kind not in KNOWLEDGE_KINDS:
        raise InputError(f"unknown knowledge type {kind!r}", hint=f"one of {', '.join(KNOWLEDGE_KINDS)}")
    if limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}")
    inbox = len(inbox_records(lake.settings.knowledge_dir, lake.settings.root))
    pending, replaced, problems = _pending_files(lake, kind, query)
    # A file that cannot be read is left out of every answer; say which, so it is not lost silently.
    warnings = [f"skipped {p}" for p in problems]
    if lake.knowledge is None or lake.knowledge.count_rows() == 0:
        return KnowledgeList(records=pending[:limit], inbox=inbox, warnings=warnings)
    if query:
        result = search_context(lake, query, types=[kind] if kind else ["knowledge"], limit=limit)
        ids = [h.ref for h in result.hits]
        if not ids:
            return KnowledgeList(records=pending[:limit], inbox=inbox, warnings=warnings)
        by_id = {r["id"]: r for r in lake.knowledge.search().where(_in("id", ids) or "").select(KNOWLEDGE_COLUMNS).limit(None).to_list()}
        found = [_knowledge(by_id[i]) for i in ids if i in by_id and i not in replaced]
        return KnowledgeList(records=(pending + found)[:limit], inbox=inbox, warnings=warnings)
    where = _and(None if include_superseded else "superseded_by IS NULL", kind and f"type = {sql_str(kind)}")
    search = lake.knowledge.search()
    if where:
        search = search.where(where)
    rows = [r for r in search.select(KNOWLEDGE_COLUMNS).limit(None).to_list()
            if include_superseded or r["id"] not in replaced]
    merged = sorted([*map(_knowledge, rows), *pending], key=lambda k: k.created_at, reverse=True)
    return KnowledgeList(records=merged[:limit], inbox=inbox, warnings=warnings)


def _pending_files(lake: MemoryLake, kind: str | None,
                   query: str | None) -> tuple[list[KnowledgeOut], set[str], list[str]]:
    """Knowledge files written since the last ingest (`ctx remember`, save_*), so they show at once;
    the ids they supersede; one line per file that could not be read. A query is matched as words
    in the title/body (they have no vectors yet)."""
    from ctxlake.tasks.knowledge import heads, load_records

    records, problems = load_records(lake.settings.knowledge_dir, lake.settings.root)
    if not records:
        return [], set(), problems
    stored: set[str] = set()
    if lake.knowledge is not None and lake.knowledge.count_rows() > 0:
        ids = lake.knowledge.search().select(["id"]).limit(None).to_arrow().column("id").to_pylist()
        stored = set(ids)
    new = [r for r in heads(records) if r.id not in stored and (kind is None or r.type == kind)]
    if query:
        words = [w for w in re.findall(r"\w+", query.lower()) if len(w) > 2]
        new = [r for r in new if words and all(w in r.text.lower() for w in words)]
    out = [KnowledgeOut(id=r.id, type=r.type, title=r.title, body=r.body, created_at=r.created_at,
                        supersedes=r.supersedes, superseded_by=None, source_tool=r.source_tool,
                        source_session=r.source_session, path=r.path, files=r.files, tags=r.tags) for r in new]
    return out, {r.supersedes for r in new if r.supersedes}, problems


def remember(settings: Settings, kind: str, title: str, body: str = "", files: Sequence[str] = (),
             tags: Sequence[str] = (), source_tool: str | None = None, source_session: str | None = None,
             files_from: Path | None = None) -> RememberResult:
    """Write a knowledge file (never a table): created, superseded (a similar record replaced) or duplicate.
    Relative `files` are project paths, or read from `files_from` (the CLI's current folder)."""
    from ctxlake.tasks.embed_cache import EmbeddingCache
    from ctxlake.tasks.embedders import make_embedder
    from ctxlake.tasks.knowledge import write_record

    embedder = make_embedder(settings.embed, settings.models_dir)
    cache = EmbeddingCache(settings.cache_dir, embedder.model_id, embedder.dims)
    mem = settings.memory
    result = write_record(settings.knowledge_dir, settings.root, kind, title, body, cache=cache, embedder=embedder,
                          duplicate_above=mem.duplicate_threshold, supersede_from=mem.supersede_threshold,
                          files=files, tags=tags, source_tool=source_tool, source_session=source_session,
                          files_from=files_from)
    return RememberResult(status=result.status, id=result.id, path=result.path, similar_to=result.similar_to,
                          similarity=result.similarity)
