"""Read-side queries over conversation memory (MESSAGES, SESSIONS, KNOWLEDGE), shared by the CLI and the MCP memory tools."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ctxlake.errors import InputError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.handles import memo_schema
from ctxlake.serve.api.memory_models import (
    ContextHit,
    ContextMode,
    ContextResult,
    ContextType,
    Depth,
    KnowledgeList,
    KnowledgeOut,
    MessageOut,
    RememberResult,
    SessionDetail,
    SessionSummary,
    ToolCallOut,
)
from ctxlake.serve.api.queries import (
    BM25_SCORE,
    VECTOR_DISTANCE,
    fuse,
    keyword_query,
    read_pool,
    sum_scores,
)
from ctxlake.tasks.knowledge import inbox_records
from ctxlake.tasks.lake import IndexState, connect, open_table
from ctxlake.tasks.memory_state import MANIFEST_FILE, PROJECTS_FILE, read_project_paths
from ctxlake.tasks.memory_store import KNOWLEDGE_TABLE, MESSAGES_TABLE, SESSIONS_TABLE
from ctxlake.tasks.sessionize import scope_filter
from ctxlake.tasks.store import sql_str, vector_indexes

if TYPE_CHECKING:
    from lancedb.query import LanceVectorQueryBuilder
    from lancedb.table import Table

    from ctxlake.tasks.embedder_base import Embedder

READ_CONSISTENCY = timedelta(seconds=1)
TYPES: tuple[ContextType, ...] = ("message", "session", "decision", "error", "insight")
KNOWLEDGE_KINDS = ("decision", "error", "insight")
SUMMARY_CHARS = 1200
SNIPPET_CHARS = 400
DETAIL_CHARS = 2000
SESSION_COLUMNS = ["id", "tool", "title", "project_path", "started_at", "ended_at", "n_messages", "decisions",
                   "open_tasks", "errors", "files", "commits", "tokens_in", "tokens_out", "llm_summary", "text"]
MESSAGE_COLUMNS = ["id", "tool", "session_id", "timestamp", "seq", "role", "kind", "text", "tool_calls", "files",
                   "agent", "source_file"]
KNOWLEDGE_COLUMNS = ["id", "type", "title", "body", "created_at", "supersedes", "superseded_by", "source_tool",
                     "source_session", "files", "tags", "path", "text"]
RELATIVE = re.compile(r"^(\d+)\s*([dhm])$")


class MemoryLake:
    """Conversation memory opened for reading: the user-wide lake and this project's knowledge table.

    Rows are scoped to the project (its folder and below) unless `all_projects` is asked for.
    """

    def __init__(self, settings: Settings, load_embedder: Callable[[], Embedder] | None = None) -> None:
        self.settings = settings
        # How the model is had when a query first needs it (a long-lived reader passes its shared one).
        self._load_embedder = load_embedder
        self.state = IndexState.read(settings.memory_dir)
        self.messages: Table | None = None
        self.sessions: Table | None = None
        if self.state is not None:
            db = connect(settings.memory_dir, read_consistency=READ_CONSISTENCY)
            self.messages = memo_schema(open_table(db, MESSAGES_TABLE))
            self.sessions = memo_schema(open_table(db, SESSIONS_TABLE))
        self.knowledge: Table | None = None
        self.knowledge_model = ""
        if settings.lake_dir.is_dir():
            kdb = connect(settings.lake_dir, read_consistency=READ_CONSISTENCY)
            self.knowledge = memo_schema(open_table(kdb, KNOWLEDGE_TABLE))
            try:
                self.knowledge_model = json.loads((settings.lake_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("model_id", "")
            except (OSError, ValueError):
                self.knowledge_model = ""
        self._embedder: Embedder | None = None
        self._scope: tuple[int | None, str] | None = None

    def require_memory(self) -> tuple[Table, Table]:
        if self.messages is None or self.sessions is None:
            raise NotIndexedError("no agent conversations ingested yet", hint="run `ctx run ingest`")
        return self.messages, self.sessions

    def embedder(self) -> Embedder:
        if self._embedder is None:
            if self._load_embedder is not None:
                self._embedder = self._load_embedder()
            else:
                from ctxlake.tasks.embedders import make_embedder

                self._embedder = make_embedder(self.settings.embed, self.settings.models_dir)
        return self._embedder

    def scope(self, all_projects: bool) -> str | None:
        """SQL: this project's rows (None: every project's)."""
        if all_projects:
            return None
        # The record of project paths changes only when an ingest meets a new folder.
        path = self.settings.memory_dir / PROJECTS_FILE
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if self._scope is None or self._scope[0] != stamp:
            paths = read_project_paths(self.settings.memory_dir) if stamp is not None else None
            self._scope = (stamp, scope_filter(self.settings.root, paths))
        return self._scope[1]


def session_counts(lake: MemoryLake) -> dict[str, tuple[int, str | None]]:
    """tool -> (this project's sessions of it, when the newest ended); empty before any ingest."""
    if lake.sessions is None:
        return {}
    where = lake.scope(False)
    search = lake.sessions.search()
    if where:
        search = search.where(where)
    rows = search.select(["tool", "ended_at"]).limit(None).to_arrow().to_pylist()
    out: dict[str, tuple[int, str | None]] = {}
    for row in rows:
        count, last = out.get(row["tool"], (0, None))
        ended = row["ended_at"].isoformat() if row["ended_at"] is not None else None
        out[row["tool"]] = (count + 1, max(filter(None, (last, ended)), default=None))
    return out


# -- filters -------------------------------------------------------------------------------------


def parse_when(value: str | None, name: str) -> datetime | None:
    """An ISO date/time, or a relative age like 7d, 12h, 30m (that long ago)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    match = RELATIVE.match(text)
    try:
        if match:
            n, unit = int(match.group(1)), match.group(2)
            return datetime.now(UTC) - {"d": timedelta(days=n), "h": timedelta(hours=n), "m": timedelta(minutes=n)}[unit]
        when = datetime.fromisoformat(text)
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except OverflowError:  # an age before year 1 (9999999999d), or a date at its edge moved to UTC
        raise InputError(f"{name}: {value!r} is outside the dates a record can have",
                         hint="e.g. 2025-12-01, 2025-12-01T14:00, 7d, 12h") from None
    except ValueError:
        raise InputError(f"{name}: not a date, time or age: {value!r}", hint="e.g. 2025-12-01, 2025-12-01T14:00, 7d, 12h") from None


def _ts(when: datetime) -> str:
    # isoformat pads the year to 4 digits (strftime's %Y gives '110-05-18', which Lance cannot parse).
    return f"CAST('{when.astimezone(UTC).replace(tzinfo=None).isoformat(timespec='microseconds')}' AS TIMESTAMP)"


def _since(column: str, when: datetime | None) -> str | None:
    return f"{column} >= {_ts(when)}" if when else None


def _until(column: str, when: datetime | None) -> str | None:
    return f"{column} <= {_ts(when)}" if when else None


def _and(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " AND ".join(f"({p})" for p in kept) or None


def _in(column: str, values: Sequence[str] | None) -> str | None:
    return f"{column} IN ({', '.join(sql_str(v) for v in values)})" if values else None


def _trim(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# -- sessions ------------------------------------------------------------------------------------


def _summary(row: dict[str, Any], estimated: bool = False) -> SessionSummary:
    return SessionSummary(
        session_ref=row["id"], tool=row["tool"], title=row["title"], project_path=row["project_path"],
        started_at=row["started_at"], last_active=row["ended_at"], time_estimated=estimated, n_messages=row["n_messages"],
        summary=row["llm_summary"] or row["text"], decisions=row["decisions"] or [], open_tasks=row["open_tasks"] or [],
        errors=row["errors"] or [], files=row["files"] or [], commits=row["commits"] or [],
        tokens_in=row["tokens_in"], tokens_out=row["tokens_out"],
    )


def list_sessions(lake: MemoryLake, limit: int = 20, tools: Sequence[str] | None = None, all_projects: bool = False,
                  after: datetime | None = None, before: datetime | None = None) -> list[SessionSummary]:
    """Sessions, most recently active first."""
    if limit < 1:
        raise InputError(f"limit must be at least 1, got {limit}")
    check_tools(tools)
    _, sessions = lake.require_memory()
    where = _and(lake.scope(all_projects), _in("tool", tools), _since("ended_at", after),
                 _until("started_at", before))
    query = sessions.search()
    if where:
        query = query.where(where)
    rows = query.select([*SESSION_COLUMNS, "session_id"]).limit(None).to_list()
    if not rows:
        return []
    estimated = time_estimated(lake, rows)
    # Latest message first; a session whose times are its file's mtime goes after every session with real
    # message times from the same (UTC) day, whatever its mtime says.
    rows.sort(key=lambda r: (r["ended_at"].date(), r["id"] not in estimated, r["ended_at"]), reverse=True)
    return [_summary(r, r["id"] in estimated) for r in rows[:limit]]


def check_tools(tools: Sequence[str] | None) -> None:
    """InputError naming an agent tool no scraper writes (a typo would otherwise look like "no sessions")."""
    from ctxlake.tasks.scrape import SCRAPERS

    known = list(dict.fromkeys(s.tool for s in SCRAPERS.values()))
    unknown = [t for t in tools or () if t not in known]
    if unknown:
        raise InputError(f"unknown agent tool {unknown[0]!r}", hint=f"known: {', '.join(known)}")


def time_estimated(lake: MemoryLake, rows: Sequence[dict[str, Any]]) -> set[str]:
    """Refs of the sessions among `rows` whose every message is stamped with its file's time, not its own."""
    from ctxlake.tasks.scrape.timing import FILE_TIME_ROWS

    messages, _ = lake.require_memory()
    out: set[str] = set()
    for tool, stamped_by_file in FILE_TIME_ROWS.items():
        candidates = [r for r in rows if r["tool"] == tool]
        if not candidates:
            continue
        ids = sorted({r["session_id"] for r in candidates})
        where = f"tool = {sql_str(tool)} AND {_in('session_id', ids)} AND NOT ({stamped_by_file})"
        timed: dict[str, list[Any]] = {}
        for m in messages.search().where(where).select(["session_id", "timestamp"]).limit(None).to_list():
            timed.setdefault(m["session_id"], []).append(m["timestamp"])
        # A segment is estimated unless one of its own messages (inside its window) has a real time.
        for r in candidates:
            if not any(r["started_at"] <= t <= r["ended_at"] for t in timed.get(r["session_id"], [])):
                out.add(r["id"])
    return out


def resolve_ref(lake: MemoryLake, ref: str) -> dict[str, Any]:
    """A session row from its ref, a unique prefix of it, or a unique prefix of the tool's session id."""
    _, sessions = lake.require_memory()
    ref = ref.strip()
    if not ref:
        raise InputError("empty session ref")
    exact = sessions.search().where(f"id = {sql_str(ref)}").select([*SESSION_COLUMNS, "session_id"]).limit(1).to_list()
    if exact:
        return dict(exact[0])
    like = ref.replace("%", "\\%").replace("_", "\\_").replace("'", "''")
    found = sessions.search().where(f"id LIKE '{like}%' ESCAPE '\\' OR session_id LIKE '{like}%' ESCAPE '\\'") \
        .select([*SESSION_COLUMNS, "session_id"]).limit(20).to_list()
    if not found:
        raise InputError(f"no session matches {ref!r}", hint="`ctx sessions` lists them")
    if len(found) > 1:
        names = ", ".join(sorted(r["id"] for r in found)[:8])
        raise InputError(f"{ref!r} matches {len(found)} sessions: {names}", hint="give more of the ref")
    return dict(found[0])


def _message(row: dict[str, Any], limit: int | None = None) -> MessageOut:
    text = row["text"] if limit is None else _trim(row["text"], limit)
    return MessageOut(id=row["id"], timestamp=row["timestamp"], role=row["role"], kind=row["kind"], text=text,
                      tool_calls=[ToolCallOut(name=c.get("name") or "unknown", input=c.get("input") or "",
                                              is_error=c.get("is_error")) for c in row["tool_calls"] or []],
                      files=row["files"] or [], agent=row["agent"])


def session_detail(lake: MemoryLake, ref: str, offset: int = 0, limit: int = 50) -> SessionDetail:
    """A session's summary and one page of its messages in order."""
    if offset < 0 or limit < 1:
        raise InputError("offset must be >= 0 and limit >= 1")
    messages, _ = lake.require_memory()
    row = resolve_ref(lake, ref)
    where = (f"tool = {sql_str(row['tool'])} AND session_id = {sql_str(row['session_id'])} "
             f"AND timestamp >= {_ts(row['started_at'])} AND timestamp <= {_ts(row['ended_at'])}")
    items = messages.search().where(where).select(MESSAGE_COLUMNS).limit(None).to_list()
    items.sort(key=lambda r: (r["timestamp"], r["source_file"], r["seq"]))
    page = items[offset : offset + limit]
    end = offset + len(page)
    return SessionDetail(session=_summary(row), messages=[_message(r) for r in page], total=len(items), offset=offset,
                         next_offset=end if end < len(items) else None)


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
