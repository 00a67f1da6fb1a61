"""The web UI's page builders (serve stage; SESSIONS, MESSAGES, KNOWLEDGE, CHUNKS through serve/api): each page's data.

Server-rendered data for the Jinja2 pages, each a thin call into serve/api/ (no query logic here)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from ctxlake.errors import CtxError
from ctxlake.serve.web.base import ANALYTICS_TOP, UiContext, _number, _split

MESSAGES_PAGE = 50
# The Knowledge page shows a record whole up to what a record may hold when written (tasks/knowledge.py);
# longer ones (written by hand) are cut with a note, and 500 long records share this many characters.
KNOWLEDGE_TITLE_CHARS = 200
KNOWLEDGE_BODY_CHARS = 20_000
KNOWLEDGE_PAGE_CHARS = 1_000_000


def sessions_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.memory_lake import parse_when
    from ctxlake.serve.api.memory_sessions import list_sessions

    q = request.query_params
    limit = _number(request, "limit", 100, 1, 500) or 100
    settings = ctx.settings(root)
    lake = ctx.memory(settings)
    if lake.sessions is None:
        return {"sessions": [], "by_tool": {}, "ingested": False, "filters": dict(q)}
    tools = _split(q.get("tool"))
    found = list_sessions(lake, limit=limit, tools=tools or None,
                          all_projects=q.get("all") == "1", after=parse_when(q.get("after"), "after"),
                          before=parse_when(q.get("before"), "before"))
    by_tool: dict[str, list[Any]] = {}
    for s in found:
        by_tool.setdefault(s.tool, []).append(s)
    return {"sessions": found, "by_tool": by_tool, "ingested": True, "filters": dict(q)}


def session_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.handoff import build_brief
    from ctxlake.serve.api.memory_sessions import session_detail

    ref = request.path_params["ref"]
    offset = _number(request, "offset", 0, 0) or 0
    lake = ctx.memory(ctx.settings(root))
    detail = session_detail(lake, ref, offset=offset, limit=MESSAGES_PAGE)
    brief = build_brief(lake, ref=detail.session.session_ref)
    return {"detail": detail, "brief": brief, "ref": ref}


def knowledge_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.context_search import project_knowledge
    from ctxlake.serve.api.memory_lake import KNOWLEDGE_KINDS

    q = request.query_params
    kind = q.get("type") or None
    text = (q.get("q") or "").strip() or None
    tag = (q.get("tag") or "").strip()
    lake = ctx.memory(ctx.settings(root))
    found = project_knowledge(lake, kind, text, limit=500, include_superseded=q.get("history") == "1")
    records = [r for r in found.records if not tag or tag in r.tags]
    # Each body gets an equal share of the page once the records would overflow it (at least 2,000 characters).
    share = max(2_000, min(KNOWLEDGE_BODY_CHARS, KNOWLEDGE_PAGE_CHARS // max(1, len(records))))
    cut: dict[str, int] = {}  # record id -> characters left out of its title and body
    shown = []
    for r in records:
        left_out = max(0, len(r.title) - KNOWLEDGE_TITLE_CHARS) + max(0, len(r.body) - share)
        if left_out:
            cut[r.id] = left_out
            r = r.model_copy(update={"title": _shorten(r.title, KNOWLEDGE_TITLE_CHARS), "body": _shorten(r.body, share)})
        shown.append(r)
    by_id = {r.id: r if len(r.title) <= KNOWLEDGE_TITLE_CHARS else
             r.model_copy(update={"title": _shorten(r.title, KNOWLEDGE_TITLE_CHARS)}) for r in found.records}
    tags = sorted({t for r in found.records for t in r.tags})
    return {"records": shown, "cut": cut, "by_id": by_id, "inbox": found.inbox, "kinds": KNOWLEDGE_KINDS, "tags": tags,
            "filters": {"type": kind or "", "q": text or "", "tag": tag, "history": q.get("history") == "1"}}


def _shorten(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars].rstrip() + " …"


def sources_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.source_queries import list_sources

    settings = ctx.settings(root)
    lake = ctx.lake(settings) if settings.lake_dir.is_dir() else None
    try:
        listed = list_sources(settings, lake)
    except CtxError:
        listed = list_sources(settings)
    return {"sources": listed.sources, "model_id": listed.model_id}


def settings_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.overview import effective_settings

    values = effective_settings(ctx.settings(root), env=ctx.env)
    sections: dict[str, list[Any]] = {}
    for v in values:
        sections.setdefault(v.section, []).append(v)
    return {"sections": sections, "has_schedules": ctx.schedules.api_url is not None}  # listed by /api/schedules


def analytics_page(request: Request, ctx: UiContext, root: str) -> dict[str, Any]:
    from ctxlake.serve.api.stats import lake_stats
    from ctxlake.serve.web.charts import hbars, line, stacked_columns

    everyone = request.query_params.get("all") == "1"
    figures = lake_stats(ctx.settings(root), top=ANALYTICS_TOP, all_projects=everyone)
    days = sorted({a.day for a in figures.activity})
    tools = sorted({a.tool for a in figures.activity})
    per = {(a.day, a.tool): a for a in figures.activity}
    sessions = {t: [per[(d, t)].sessions if (d, t) in per else 0 for d in days] for t in tools}
    messages = {t: [per[(d, t)].messages if (d, t) in per else 0 for d in days] for t in tools}
    size = [(r.finished_at.strftime("%Y-%m-%d %H:%M"), r.lake_bytes / 2**20) for r in figures.index_size]
    charts = [
        ("Chunks per language", hbars([(c.label, c.count) for c in figures.chunks_per_language], "Chunks per language")),
        ("Lake size after each index run (MB)", line(size, "Lake size after each index run", " MB")),
        ("Sessions per tool per day", stacked_columns(days, sessions, "Sessions per tool per day")),
        ("Messages per tool per day", stacked_columns(days, messages, "Messages per tool per day")),
        ("Files most touched in sessions", hbars([(c.label, c.count) for c in figures.touched_files], "Files most touched in sessions")),
        ("Most frequent errors", hbars([(c.label, c.count) for c in figures.frequent_errors], "Most frequent errors")),
    ]
    return {"figures": figures, "charts": charts, "everyone": everyone}
