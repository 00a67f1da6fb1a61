"""Headline figures and analyses of a project's lake and its agents' conversations (`ctx stats`, the UI's Analytics page).

DuckDB over Arrow read from the Lance tables (only the columns each analysis needs), scoped like
every memory query: the project's folder and below, or every project with `all_projects`.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import BaseModel, Field

from ctxlake.errors import NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.schemas.tables import INDEX_RUNS_TABLE
from ctxlake.tasks.lake import CHUNKS_TABLE, FILES_TABLE, IndexState, connect, open_table
from ctxlake.tasks.memory_state import read_project_paths
from ctxlake.tasks.memory_store import KNOWLEDGE_TABLE, MESSAGES_TABLE, SESSIONS_TABLE
from ctxlake.tasks.run_log import folder_stamp
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


# (root, lake, memory lake, top, scope) -> (the two lake folders' stamps when read, the figures)
_computed: dict[tuple[str, str, str, int, bool], tuple[tuple[int, int], LakeStats]] = {}
_computed_lock = threading.Lock()


def lake_stats(settings: Settings, top: int = 10, all_projects: bool = False) -> LakeStats:
    """A project's lake and its agents' sessions -> headline figures and the analyses.

    Computed once per state of the two lake folders: a long-lived caller (the UI's Analytics page)
    pays a walk of them (~6 ms on django's lake) while nothing was written, instead of the scans
    and DuckDB queries (~0.15-0.5 s there). The stamps are taken before the tables are read, so a
    write landing meanwhile is seen by the next call.
    """
    key = (str(settings.root), str(settings.lake_dir), str(settings.memory_dir), int(top), all_projects)
    lake_bytes, lake_stamp = folder_stamp(settings.lake_dir)
    stamps = (lake_stamp, folder_stamp(settings.memory_dir)[1])
    with _computed_lock:
        hit = _computed.get(key)
    if hit is not None and hit[0] == stamps:
        return hit[1].model_copy(deep=True)
    figures = _lake_stats(settings, top, all_projects, lake_bytes)
    with _computed_lock:
        _computed[key] = (stamps, figures)
    return figures.model_copy(deep=True)


def _lake_stats(settings: Settings, top: int, all_projects: bool, lake_bytes: int) -> LakeStats:
    import duckdb

    lake_dir = settings.lake_dir
    state = IndexState.read(lake_dir)
    if state is None:
        raise NotIndexedError(f"no index at {lake_dir}", hint="run `ctx run index` in the project first")
    db = connect(lake_dir)
    files, chunks = open_table(db, FILES_TABLE), open_table(db, CHUNKS_TABLE)
    knowledge, runs = open_table(db, KNOWLEDGE_TABLE), open_table(db, INDEX_RUNS_TABLE)
    n_chunks = chunks.count_rows() if chunks is not None else 0
    embedded = chunks.count_rows("vector IS NOT NULL") if chunks is not None else 0
    con = duckdb.connect(":memory:")

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

    scope = None if all_projects else scope_filter(settings.root, read_project_paths(settings.memory_dir))
    n_sessions = n_messages = 0
    activity: list[DayActivity] = []
    touched: list[tuple[Any, ...]] = []
    errors: list[tuple[Any, ...]] = []
    memory_state = IndexState.read(settings.memory_dir)
    if memory_state is not None:
        mdb = connect(settings.memory_dir)
        sessions_t, messages_t = open_table(mdb, SESSIONS_TABLE), open_table(mdb, MESSAGES_TABLE)
        if messages_t is not None:
            n_messages = messages_t.count_rows(scope) if scope else messages_t.count_rows()
        sessions = _arrow(sessions_t, ["tool", "started_at", "n_messages", "files", "errors"], scope)
        if sessions is not None:
            n_sessions = sessions.num_rows
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

    finished = (state.last_run or {}).get("finished_at") or None
    return LakeStats(
        project=str(settings.root), scope="all projects" if all_projects else "project",
        files=files.count_rows() if files is not None else 0, chunks=n_chunks, embedded=embedded,
        embedded_share=round(embedded / n_chunks, 4) if n_chunks else 0.0, lake_bytes=lake_bytes,
        last_index_run=str(finished) if finished else None,
        sessions=n_sessions, messages=n_messages, knowledge=knowledge.count_rows() if knowledge is not None else 0,
        chunks_per_language=[Count(label=str(r[0]), count=int(r[1] or 0)) for r in per_lang],
        index_size=sizes, activity=activity,
        touched_files=[Count(label=str(r[0]), count=int(r[1])) for r in touched],
        frequent_errors=[Count(label=str(r[0]), count=int(r[1])) for r in errors],
    )
