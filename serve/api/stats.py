"""Headline figures and analyses of a project's lake and its agents' conversations (`ctx stats`, the UI's Analytics page).

DuckDB over Arrow read from the Lance tables (only the columns each analysis needs), scoped like
every memory query: the project's folder and below, or every project with `all_projects`.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import BaseModel, Field

from ctxlake.errors import NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import INDEX_RUNS_TABLE
from ctxlake.tasks.lake import (
    CHUNKS_TABLE,
    FILES_TABLE,
    WRITER_LOCK_FILE,
    IndexState,
    connect,
    open_table,
)
from ctxlake.tasks.memory_state import read_project_paths
from ctxlake.tasks.memory_store import KNOWLEDGE_TABLE, MESSAGES_TABLE, SESSIONS_TABLE
from ctxlake.tasks.run_log import folder_stamp, folder_stamps
from ctxlake.tasks.sessionize import scope_filter

if TYPE_CHECKING:
    import duckdb
    from lancedb.table import Table

ERROR_CHARS = 120  # errors are grouped by their first line, cut here


class Count(BaseModel):
    label: str = Field(description="a language, a file path or an error's first line")
    count: int


class DayActivity(BaseModel):
    day: str = Field(description="UTC date, YYYY-MM-DD")
    tool: str = Field(description="the agent tool (claude, codex, ...)")
    sessions: int = Field(description="sessions that started that day")
    messages: int = Field(description="messages of those sessions")


class IndexSize(BaseModel):
    finished_at: datetime
    files: int
    chunks: int
    embedded: int
    lake_bytes: int


class LakeStats(BaseModel):
    """What `ctx stats` prints and the Analytics page draws."""

    project: str
    scope: str = Field(description="'project' (its folder and below) or 'all projects' for conversation figures")
    code_indexed: bool = Field(True, description="false when the project's code has no index yet (`ctx run index`): "
                                                 "the code figures are then 0")
    files: int
    chunks: int
    embedded: int
    embedded_share: float = Field(description="chunks with a vector, 0..1")
    lake_bytes: int
    last_index_run: str | None = Field(description="when the last index run finished (ISO), if any")
    sessions: int
    messages: int
    knowledge: int
    chunks_per_language: list[Count]
    index_size: list[IndexSize] = Field(description="after each index run, oldest first (last 200 runs)")
    activity: list[DayActivity] = Field(description="sessions and messages per tool per day, oldest first")
    touched_files: list[Count] = Field(description="files most sessions read, wrote or mentioned")
    frequent_errors: list[Count] = Field(description="the errors seen in most sessions")


def _arrow(table: Table | None, columns: list[str], where: str | None = None) -> pa.Table | None:
    if table is None:
        return None
    query = table.search()
    if where:
        query = query.where(where)
    return query.select(columns).limit(None).to_arrow()


def _rows(con: duckdb.DuckDBPyConnection, sql: str, **tables: pa.Table) -> list[tuple[Any, ...]]:
    for name, data in tables.items():
        con.register(name, data)
    try:
        return con.execute(sql).fetchall()
    finally:
        for name in tables:
            con.unregister(name)


_duck: duckdb.DuckDBPyConnection | None = None
_duck_lock = threading.Lock()


def _cursor() -> duckdb.DuckDBPyConnection:
    """A cursor of this process's one in-memory DuckDB (opening a database costs ~25 ms; a cursor,
    which a thread may use on its own, nothing); `with` closes it."""
    global _duck
    import duckdb

    with _duck_lock:
        if _duck is None:
            _duck = duckdb.connect(":memory:")
        return _duck.cursor()


# Each half of the figures is kept per state of the folder it reads: a conversation ingest does not
# redo the code lake's figures, nor an index run the conversations'.
# (half, root, folder, top, scope) -> (the folder's stamp when read, the half's fields)
_computed: dict[tuple[str, str, str, int, bool], tuple[int, dict[str, Any]]] = {}
_computed_lock = threading.Lock()


def lake_stats(settings: Settings, top: int = 10, all_projects: bool = False) -> LakeStats:
    """A project's lake and its agents' sessions -> headline figures and the analyses.

    Each half is computed once per state of its lake folder: a long-lived caller (the UI's
    Analytics page) pays a walk of the two folders (~6 ms on django's lake) while nothing was
    written, instead of the scans and DuckDB queries (~0.1-0.5 s there). The stamps are taken
    before the tables are read, so a write landing meanwhile is seen by the next call.
    """
    lake_bytes, code_stamp, knowledge_stamp = _lake_stamps(settings.lake_dir)
    memory_stamp = hash((folder_stamp(settings.memory_dir)[1], knowledge_stamp))
    root = str(settings.root)
    code = _kept(("code", root, str(settings.lake_dir), int(top), False), code_stamp,
                 lambda: _code_figures(settings, top))
    memory = _kept(("memory", root, str(settings.memory_dir), int(top), all_projects), memory_stamp,
                   lambda: _memory_figures(settings, top, all_projects))
    ingested = memory.pop("ingested")
    if not code["code_indexed"] and not ingested:  # nothing at all to show
        raise NotIndexedError(f"no index at {settings.lake_dir} and no conversations ingested",
                              hint="run `ctx run index` (code) or `ctx run ingest` (agent conversations) first")
    return LakeStats(project=root, scope="all projects" if all_projects else "project", lake_bytes=lake_bytes,
                     **code, **memory)


def _lake_stamps(lake_dir: Path) -> tuple[int, int, int]:
    """(bytes under the project's lake, a change token of its code tables, one of its knowledge
    table): an ingest that extracts knowledge writes only the latter (and takes the writer's lock,
    whose file says nothing of the data)."""
    def part(top: str) -> str | None:
        if top == WRITER_LOCK_FILE:
            return None
        return "knowledge" if top.startswith(KNOWLEDGE_TABLE) else "code"

    total, digests = folder_stamps(lake_dir, part)
    return total, digests.get("code", hash(())), digests.get("knowledge", hash(()))


def _kept(key: tuple[str, str, str, int, bool], stamp: int, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    with _computed_lock:
        hit = _computed.get(key)
    if hit is not None and hit[0] == stamp:
        return copy.deepcopy(hit[1])
    fields = compute()
    with _computed_lock:
        _computed[key] = (stamp, fields)
    return copy.deepcopy(fields)


def _code_figures(settings: Settings, top: int) -> dict[str, Any]:
    lake_dir = settings.lake_dir
    state = IndexState.read(lake_dir)
    if state is None:  # the conversation figures may still be there: lake_stats decides
        return {"code_indexed": False, "files": 0, "chunks": 0, "embedded": 0, "embedded_share": 0.0,
                "last_index_run": None, "chunks_per_language": [], "index_size": []}
    db = connect(lake_dir)
    files, chunks, runs = open_table(db, FILES_TABLE), open_table(db, CHUNKS_TABLE), open_table(db, INDEX_RUNS_TABLE)
    n_chunks = chunks.count_rows() if chunks is not None else 0
    embedded = chunks.count_rows("vector IS NOT NULL") if chunks is not None else 0
    with _cursor() as con:
        per_lang: list[tuple[Any, ...]] = []
        langs = _arrow(files, ["lang", "n_chunks"])
        if langs is not None:
            per_lang = _rows(con, "SELECT coalesce(lang, 'other') AS lang, sum(n_chunks) AS n FROM f GROUP BY 1 "
                                  f"ORDER BY n DESC, lang LIMIT {int(top)}", f=langs)
        sizes: list[IndexSize] = []
        history = _arrow(runs, ["finished_at", "files", "chunks", "embedded", "lake_bytes"])
        if history is not None:
            rows = _rows(con, "SELECT * FROM (SELECT finished_at, files, chunks, embedded, lake_bytes FROM h "
                              "ORDER BY finished_at DESC LIMIT 200) ORDER BY finished_at", h=history)
            sizes = [IndexSize(finished_at=r[0], files=r[1], chunks=r[2], embedded=r[3], lake_bytes=r[4]) for r in rows]
    finished = (state.last_run or {}).get("finished_at") or None
    return {"code_indexed": True, "files": files.count_rows() if files is not None else 0, "chunks": n_chunks,
            "embedded": embedded,
            "embedded_share": round(embedded / n_chunks, 4) if n_chunks else 0.0,
            "last_index_run": str(finished) if finished else None,
            "chunks_per_language": [Count(label=str(r[0]), count=int(r[1] or 0)) for r in per_lang],
            "index_size": sizes}


def _memory_figures(settings: Settings, top: int, all_projects: bool) -> dict[str, Any]:
    knowledge = open_table(connect(settings.lake_dir), KNOWLEDGE_TABLE) if settings.lake_dir.is_dir() else None
    scope = None if all_projects else scope_filter(settings.root, read_project_paths(settings.memory_dir))
    n_sessions = n_messages = 0
    activity: list[DayActivity] = []
    touched: list[tuple[Any, ...]] = []
    errors: list[tuple[Any, ...]] = []
    if IndexState.read(settings.memory_dir) is not None:
        mdb = connect(settings.memory_dir)
        sessions_t, messages_t = open_table(mdb, SESSIONS_TABLE), open_table(mdb, MESSAGES_TABLE)
        if messages_t is not None:
            n_messages = messages_t.count_rows(scope) if scope else messages_t.count_rows()
        sessions = _arrow(sessions_t, ["tool", "started_at", "n_messages", "files", "errors"], scope)
        if sessions is not None:
            n_sessions = sessions.num_rows
            with _cursor() as con:
                activity = [DayActivity(day=str(r[0]), tool=r[1], sessions=r[2], messages=int(r[3] or 0)) for r in _rows(
                    con, "SELECT CAST(started_at AS DATE) AS day, tool, count(*), sum(n_messages) FROM s "
                         "GROUP BY 1, 2 ORDER BY 1, 2", s=sessions)]
                touched = _rows(con, "SELECT f, count(*) AS n FROM (SELECT DISTINCT rowid, unnest(files) AS f "
                                     "FROM (SELECT row_number() OVER () AS rowid, files FROM s)) "
                                     f"GROUP BY f ORDER BY n DESC, f LIMIT {int(top)}", s=sessions)
                errors = _rows(con, "SELECT e, count(*) AS n FROM (SELECT DISTINCT rowid, "
                                    f"left(split_part(trim(unnest(errors)), chr(10), 1), {ERROR_CHARS}) AS e "
                                    "FROM (SELECT row_number() OVER () AS rowid, errors FROM s)) WHERE e <> '' "
                                    f"GROUP BY e ORDER BY n DESC, e LIMIT {int(top)}", s=sessions)
    n_knowledge = knowledge.count_rows() if knowledge is not None else 0
    return {"ingested": IndexState.read(settings.memory_dir) is not None or n_knowledge > 0,
            "sessions": n_sessions, "messages": n_messages, "activity": activity, "knowledge": n_knowledge,
            "touched_files": [Count(label=str(r[0]), count=int(r[1])) for r in touched],
            "frequent_errors": [Count(label=str(r[0]), count=int(r[1])) for r in errors]}
