"""Sessions of conversation memory (SESSIONS, MESSAGES): count and list them, resolve a session ref, page through one session's messages."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ctxlake.errors import InputError
from ctxlake.serve.api.memory_lake import (
    MESSAGE_COLUMNS,
    SESSION_COLUMNS,
    MemoryLake,
    _and,
    _in,
    _since,
    _trim,
    _ts,
    _until,
)
from ctxlake.serve.api.memory_models import MessageOut, SessionDetail, SessionSummary, ToolCallOut
from ctxlake.tasks.store import sql_str

# -- sessions ------------------------------------------------------------------------------------


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
