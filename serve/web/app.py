"""The web UI's routes (Starlette): server-rendered pages and small JSON endpoints, each a thin call
into serve/api/ (no query logic here), for the projects the service knows."""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ctxlake import __version__
from ctxlake.errors import CtxError, InputError, LakeError
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.serve.web.jobs import Jobs
from ctxlake.serve.web.security import Guard
from ctxlake.tasks.lake import lake_failure, storage_errno

HERE = Path(__file__).resolve().parent  # an editable install links each file: serve the real folder (StaticFiles refuses links out)
PAGES = [("overview", "/", "Overview"), ("search", "/search", "Search"), ("sessions", "/sessions", "Sessions"),
         ("knowledge", "/knowledge", "Knowledge"), ("sources", "/sources", "Sources"), ("analytics", "/analytics", "Analytics"),
         ("settings", "/settings", "Settings")]
MESSAGES_PAGE = 50
ANALYTICS_TOP = 12  # bars per ranked chart
WARM_DELAY_S = 2.0  # after a project's first page, before its Analytics figures are computed
CONTEXT_TYPES = {"conversations": ["message", "session"], "knowledge": ["knowledge"]}
# The Knowledge page shows a record whole up to what a record may hold when written (tasks/knowledge.py);
# longer ones (written by hand) are cut with a note, and 500 long records share this many characters.
KNOWLEDGE_TITLE_CHARS = 200
KNOWLEDGE_BODY_CHARS = 20_000
KNOWLEDGE_PAGE_CHARS = 1_000_000
# A POST body: the largest the UI sends is a knowledge record (200 + 20,000 characters, under 130 KB
# even with every character escaped as \uXXXX).
MAX_BODY_BYTES = 1 << 20


class Schedules:
    """The service's scheduled flows (its orchestrator's Prefect server); absent outside the service."""

    def __init__(self, orchestrator_of: Callable[[], Any] = lambda: None) -> None:
        self.orchestrator_of = orchestrator_of  # the service starts its orchestrator after the UI

    @property
    def api_url(self) -> str | None:
        orchestrator = self.orchestrator_of()
        return getattr(orchestrator, "api_url", None) if orchestrator is not None else None

    def list(self) -> list[dict[str, Any]]:
        orchestrator = self.orchestrator_of()
        if orchestrator is None or self.api_url is None:
            return []
        return list(orchestrator.schedules())

    def change(self, name: str, action: str, every: str | None = None) -> None:
        from ctxlake.serve.service import schedules

        if self.api_url is None:
            raise InputError("schedules run in the service", hint="start it with `ctx up`")
        if action in ("pause", "resume"):
            schedules.pause_schedule(self.api_url, name, paused=action == "pause")
        elif action == "every":
            schedules.set_schedule(self.api_url, name, every=every)
        else:
            raise InputError(f"unknown schedule action {action!r}", hint="pause, resume or every")


@dataclass
class UiContext:
    """What the pages may see: the registered project roots (nothing else is served), one warm
    lake per project, the schedules, and the background jobs."""

    projects: Callable[[], list[str]]
    schedules: Schedules = field(default_factory=Schedules)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    mode: str = "service"  # or "standalone"
    jobs: Jobs = field(default_factory=Jobs)
    _memory: dict[str, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)
    _settings: dict[str, tuple[Any, Settings]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _engine: Any = None
    _overview: tuple[Any, float, dict[str, Any]] | None = None
    _warmed: set[str] = field(default_factory=set)

    def roots(self) -> list[str]:
        return list(dict.fromkeys(self.projects()))

    def pick(self, request: Request) -> str | None:
        """The project named by ?project= (it must be registered), else the first one."""
        roots = self.roots()
        asked = request.query_params.get("project")
        if asked:
            if asked not in roots:
                raise InputError(f"not a registered project: {asked!r}",
                                 hint="register it with `ctx up --watch PATH` or `ctx run index` while the service runs")
            return asked
        return roots[0] if roots else None

    def settings(self, root: str) -> Settings:
        config = Path(root) / ".ctx" / "config.toml"
        try:
            stamp: Any = config.stat().st_mtime_ns
        except OSError:
            stamp = None
        with self._lock:
            hit = self._settings.get(root)
            if hit is not None and hit[0] == stamp:
                return hit[1]
        settings = load_settings(Path(root), env=self.env)
        with self._lock:
            self._settings[root] = (stamp, settings)
        return settings

    def engine(self) -> Any:
        from ctxlake.serve.service import engine

        if self._engine is None:
            self._engine = engine.active() or engine.EngineCache()
        return self._engine

    def lake(self, settings: Settings) -> Any:
        return self.engine().lake(settings)

    def warm_analytics(self, root: str, *, start: bool = True) -> threading.Timer | None:
        """Compute a project's Analytics figures on a thread when one of its other pages is first
        served, so that DuckDB's import and the first scans of the tables (0.2-0.7 s, once per
        process) are not paid by the Analytics page itself. Once per project and process; later
        visits recompute only what a write changed. `start=False` marks the project as warmed (the
        Analytics page computes them itself)."""
        with self._lock:
            if root in self._warmed:
                return None
            self._warmed.add(root)
        if not start:
            return None
        # A moment after the page: its own requests (the Overview's data) go first.
        thread = threading.Timer(WARM_DELAY_S, self._warm_analytics, args=(root,))
        thread.name, thread.daemon = "ctx-ui-warm", True
        thread.start()
        return thread

    def _warm_analytics(self, root: str) -> None:
        from ctxlake.serve.api.stats import lake_stats

        try:
            lake_stats(self.settings(root), top=ANALYTICS_TOP)
        except Exception:  # a warm-up only: the page reports the error when it is visited
            return

    def memory(self, settings: Settings) -> Any:
        from ctxlake.serve.api.memory_lake import MemoryLake

        key = str(settings.root)
        stamp = _memory_stamp(settings)  # an ingest rewrites these: reopen then (new tables may exist)
        with self._lock:
            hit = self._memory.get(key)
            if hit is not None and hit[0] == stamp and hit[1].settings is settings:
                return hit[1]
        engine = self.engine()
        # The model is loaded (once, shared with code search) when a search first needs it, not for
        # the Overview's counts or a session's messages.
        lake = MemoryLake(settings, load_embedder=lambda: engine.embedder(settings))
        with self._lock:
            self._memory[key] = (stamp, lake)
        return lake


def _memory_stamp(settings: Settings) -> tuple[Any, ...]:
    from ctxlake.tasks.lake import STATE_FILE
    from ctxlake.tasks.memory_state import MANIFEST_FILE

    out: list[Any] = []
    for path in (settings.memory_dir / STATE_FILE, settings.lake_dir / MANIFEST_FILE, settings.lake_dir / STATE_FILE):
        try:
            st = path.stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


# -- helpers -------------------------------------------------------------------------------------

def _ctx(request: Request) -> UiContext:
    ctx: UiContext = request.app.state.ctx
    return ctx


def _known(exc: BaseException) -> CtxError | None:
    """ctxlake's own error for `exc`: itself, or the LakeError a full or forbidden disk or a damaged
    lake's Lance error stands for (the one line and hint the CLI prints); None for a bug."""
    if isinstance(exc, CtxError):
        return exc
    if isinstance(exc, (OSError, RuntimeError, ValueError)):
        return lake_failure(exc)
    return None


def _status_of(known: CtxError, exc: BaseException) -> int:
    if not isinstance(known, LakeError):
        return 400  # the request's fault
    # A full disk is 507 Insufficient Storage, HTTP's one status for it; a damaged lake, a read-only
    # or forbidden folder: 503 until it is rebuilt or the permissions are fixed.
    return 507 if storage_errno(exc) in (errno.ENOSPC, errno.EDQUOT) else 503


def _error(exc: Exception) -> JSONResponse:
    known = _known(exc)
    if known is not None:
        return JSONResponse({"error": known.message, "hint": known.hint}, status_code=_status_of(known, exc))
    return JSONResponse({"error": f"{exc.__class__.__name__}: {exc}"}, status_code=500)


def _json_api(handler: Callable[..., Any]) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        payload: Any = None
        if request.method == "POST":
            body = await _body(request)
            if body is None:
                return JSONResponse({"error": f"the request body is over {MAX_BODY_BYTES:,} bytes"}, status_code=413)
            try:
                payload = json.loads(body)
            except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
                payload = None
            if not isinstance(payload, dict):
                return JSONResponse({"error": "the request body must be a JSON object"}, status_code=400)
        try:
            result = await run_in_threadpool(handler, request, payload) if payload is not None \
                else await run_in_threadpool(handler, request)
        except Exception as exc:
            return _error(exc)
        return JSONResponse(result)
    return endpoint


async def _body(request: Request) -> bytes | None:
    """The request body, or None once it is over MAX_BODY_BYTES (read no further: a client cannot
    make the UI hold a body of any size in memory)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY_BYTES:
            return None
    return bytes(data)


def _page(name: str, builder: Callable[..., dict[str, Any]] | None = None) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        ctx = _ctx(request)
        base: dict[str, Any] = {"page": name, "pages": PAGES, "version": __version__, "mode": ctx.mode,
                                "csrf": request.scope.get("state", {}).get("csrf_token", ""), "error": None}
        status_code = 200
        try:
            root = ctx.pick(request)
            base.update(project=root, projects=ctx.roots())
            if root is not None:
                ctx.warm_analytics(root, start=name != "analytics")
            if builder is not None and root is not None:
                base.update(await run_in_threadpool(builder, request, ctx, root))
        except Exception as exc:
            known = _known(exc)
            if known is None:
                raise
            base.update(error=known.message, hint=known.hint)
            base.setdefault("project", None)
            base.setdefault("projects", ctx.roots())
            status_code = 200 if name == "overview" else _status_of(known, exc)
        templates: Jinja2Templates = request.app.state.templates
        return templates.TemplateResponse(request, f"{name}.html", base, status_code=status_code)
    return endpoint


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _number(request: Request, name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    """A whole-number query parameter clamped to [low, high]; a value that is no number is the
    caller's mistake (400 with its name), never a 500."""
    raw = (request.query_params.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(f"{name} must be a whole number, got {raw[:40]!r}") from None
    return max(low, value if high is None else min(value, high))


# -- page builders (server-rendered data) -----------------------------------------------------------

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


# -- JSON endpoints ------------------------------------------------------------------------------------

def _root(request: Request) -> str:
    root = _ctx(request).pick(request)
    if root is None:
        raise InputError("no project is registered with the service",
                         hint="`ctx up --watch PATH`, or `ctx run index` in a project while the service runs")
    return root


OVERVIEW_MAX_AGE_S = 10.0  # bounds how late a file edit shows as stale; an index run or ingest shows at once


def api_overview(request: Request) -> dict[str, Any]:
    """The Overview's data; recomputed when a lake changed or after OVERVIEW_MAX_AGE_S (the freshness
    walk and lake size of a django-size project take ~0.4 s of the answer)."""
    ctx = _ctx(request)
    key = tuple((root, _memory_stamp(ctx.settings(root))) for root in ctx.roots())
    with ctx._lock:
        hit = ctx._overview
    if hit is not None and hit[0] == key and time.monotonic() - hit[1] < OVERVIEW_MAX_AGE_S:
        return dict(hit[2])
    data = _overview(ctx)
    with ctx._lock:
        ctx._overview = (key, time.monotonic(), data)
    return data


def _overview(ctx: UiContext) -> dict[str, Any]:
    # The orchestrator's Prefect server answers in 0.1-0.7 s: ask it while the lakes are read.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="ctx-ui-schedules") as pool:
        schedules_read = pool.submit(ctx.schedules.list)
        data = _overview_lakes(ctx)
    try:
        schedules, sched_error = schedules_read.result(), None
    except Exception as exc:
        schedules, sched_error = [], str(exc)
    return {**data, "schedules": schedules, "schedules_error": sched_error, "service": ctx.mode == "service"}


def _overview_lakes(ctx: UiContext) -> dict[str, Any]:
    from ctxlake.serve.api.index_status import status
    from ctxlake.serve.api.memory_sessions import list_sessions
    from ctxlake.serve.api.overview import tool_ingestion
    from ctxlake.serve.api.source_queries import list_sources

    projects = []
    memory = None
    for root in ctx.roots():
        try:
            settings = ctx.settings(root)
            st = status(settings)
            lake = ctx.lake(settings) if st.indexed else None
            sources = list_sources(settings, lake).sources if lake is not None else list_sources(settings).sources
            projects.append({"root": root, "status": st.model_dump(), "sources": [s.model_dump() for s in sources]})
            memory = memory or ctx.memory(settings)
        except Exception as exc:
            known = _known(exc)  # one project's damaged lake leaves the others' figures shown
            if known is None:
                raise
            projects.append({"root": root, "error": str(known)})
    ingestion: dict[str, Any] = {"tools": [], "ingested": False}
    recent: list[dict[str, Any]] = []
    if memory is not None:
        ingestion = tool_ingestion(memory).model_dump()
        if memory.sessions is not None:
            recent = [s.model_dump(mode="json") for s in list_sessions(memory, limit=20, all_projects=True)]
    return {"projects": projects, "ingestion": ingestion, "recent_sessions": recent}


def api_search(request: Request) -> dict[str, Any]:
    from ctxlake.serve.api.code_search import search
    from ctxlake.serve.api.context_search import search_context
    from ctxlake.serve.api.memory_lake import parse_when
    from ctxlake.serve.api.source_queries import check_names

    q = request.query_params
    query = (q.get("q") or "").strip()
    kind = q.get("kind") or "all"
    if kind not in ("all", "code", "conversations", "knowledge"):
        raise InputError(f"unknown record type {kind!r}", hint="all, code, conversations or knowledge")
    mode = q.get("mode") or "hybrid"
    limit = _number(request, "limit", 20, 1, 100) or 20
    out: dict[str, Any] = {"query": query, "mode": mode, "kind": kind, "code": None, "context": None, "warnings": []}
    if not query:
        return out
    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    if kind in ("all", "code"):
        if settings.lake_dir.is_dir():
            sources = _split(q.get("source")) or None
            check_names(settings, sources)  # a typo is an error, as in the CLI and MCP, not an empty answer
            result = search(ctx.lake(settings), query, mode=mode, limit=limit,  # type: ignore[arg-type]
                            path_glob=q.get("path") or None, lang=q.get("lang") or None,
                            sources=sources, check_stale=False)
            out["code"] = result.model_dump()
        else:
            out["warnings"].append("this project is not indexed yet (`ctx run index`)")
    if kind != "code":
        memory = ctx.memory(settings)
        if memory.sessions is None and memory.knowledge is None:
            if kind != "all":
                out["warnings"].append("no conversations or knowledge ingested yet (`ctx run ingest`)")
        else:
            cmode = mode if mode in ("hybrid", "keyword", "semantic") else "keyword"
            if cmode != mode:
                out["warnings"].append(f"conversations and knowledge have no {mode} mode: searched by keyword")
            types = CONTEXT_TYPES.get(kind)
            try:
                result_c = search_context(memory, query, mode=cmode, types=types, tools=_split(q.get("tool")) or None,  # type: ignore[arg-type]
                                          after=parse_when(q.get("after"), "after"), before=parse_when(q.get("before"), "before"),
                                          limit=limit, all_projects=q.get("all") == "1")
                out["context"] = result_c.model_dump(mode="json")
            except CtxError as exc:
                if kind != "all":
                    raise
                out["warnings"].append(str(exc))
    return out


def api_file(request: Request) -> dict[str, Any]:
    from ctxlake.serve.api.explore import file_context

    q = request.query_params
    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    path = q.get("path") or ""
    start = _number(request, "start", None, 1)
    end = _number(request, "end", None, 1)
    if start is not None and end is None:
        end = start + 399
    return file_context(ctx.lake(settings), path, start, end).model_dump()


def api_files(request: Request) -> dict[str, Any]:
    from ctxlake.serve.api.file_search import search_files

    q = request.query_params
    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    text = (q.get("q") or "").strip()
    if not text:
        raise InputError("paste an issue or a question first")
    limit = _number(request, "limit", 10, 1, 50) or 10
    return search_files(ctx.lake(settings), text, limit=limit).model_dump()


def api_knowledge_create(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from ctxlake.serve.api.context_search import remember
    from ctxlake.serve.api.memory_lake import KNOWLEDGE_KINDS

    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    kind = str(body.get("type") or "")
    if kind not in KNOWLEDGE_KINDS:
        raise InputError(f"unknown knowledge type {kind!r}", hint=", ".join(KNOWLEDGE_KINDS))
    result = remember(settings, kind, str(body.get("title") or ""), str(body.get("body") or ""),
                      tags=_split(str(body.get("tags") or "")), source_tool="web")
    return result.model_dump()


def api_knowledge_edit(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from ctxlake.serve.api.knowledge_edit import revise

    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    tags = _split(str(body["tags"])) if "tags" in body else None
    return revise(settings, request.path_params["id"], str(body.get("title") or ""), str(body.get("body") or ""),
                  tags=tags).model_dump()


def api_knowledge_delete(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from ctxlake.serve.api.knowledge_edit import delete

    ctx = _ctx(request)
    settings = ctx.settings(_root(request))
    return {"deleted": request.path_params["id"], "path": delete(settings, request.path_params["id"])}


def api_source_add(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from ctxlake.schemas.sources import validate_name

    ctx = _ctx(request)
    root = _root(request)
    name, origin = str(body.get("name") or "").strip(), str(body.get("origin") or "").strip()
    validate_name(name)
    if not origin:
        raise InputError("give the source's origin: a git URL, a folder or a docs URL")
    argv = ["add-docs" if body.get("docs") else "add", "--json"]
    kind = str(body.get("type") or "")
    if kind:
        argv.append(f"--type={kind}")  # one token: a value starting with '-' stays the value
    if body.get("ref"):
        argv.append(f"--ref={body['ref']}")
    # After `--`, an origin such as `--help` is the origin, never an option of `ctx add`.
    job = ctx.jobs.start(f"add {name}", [*argv, "--", name, origin], Path(root), env=_child_env(ctx))
    return job.as_dict()


def api_source_action(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    from ctxlake.schemas.sources import validate_name

    ctx = _ctx(request)
    root = _root(request)
    name, action = request.path_params["name"], request.path_params["action"]
    validate_name(name)
    if action not in ("update", "remove"):
        raise InputError(f"unknown action {action!r}", hint="update or remove")
    job = ctx.jobs.start(f"{action} {name}", [action, name, "--json"], Path(root), env=_child_env(ctx))
    return job.as_dict()


def _child_env(ctx: UiContext) -> dict[str, str]:
    return {k: v for k, v in ctx.env.items() if k.startswith(("CTX_", "PREFECT_", "HF_", "TRANSFORMERS_"))}


def api_job(request: Request) -> dict[str, Any]:
    job = _ctx(request).jobs.get(request.path_params["id"])
    if job is None:
        raise InputError(f"no job {request.path_params['id']!r}")
    return job.as_dict()


def api_schedules(request: Request) -> dict[str, Any]:
    """The service's schedules with their last and next runs ([] outside the service)."""
    return {"schedules": _ctx(request).schedules.list()}


def api_schedule(request: Request, body: dict[str, Any]) -> dict[str, Any]:
    ctx = _ctx(request)
    name = request.path_params["name"]
    ctx.schedules.change(name, str(body.get("action") or ""), every=str(body["every"]) if body.get("every") else None)
    return {"ok": True, "schedules": ctx.schedules.list()}


async def health(request: Request) -> Response:
    return JSONResponse({"ok": True, "version": __version__})


def create_app(ctx: UiContext, port_of: Callable[[], int]) -> Guard:
    """The ASGI app behind the guard. `port_of` gives the bound port (for the Host/Origin checks)."""
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.globals["qs"] = _qs
    # Values shown as JSON keep their own characters (a path with accents, a bullet); <, >, & and ' are still escaped.
    templates.env.policies["json.dumps_kwargs"] = {"sort_keys": True, "ensure_ascii": False}
    routes = [
        Route("/", _page("overview")),
        Route("/search", _page("search")),
        Route("/sessions", _page("sessions", sessions_page)),
        Route("/sessions/{ref:path}", _page("session", session_page)),
        Route("/knowledge", _page("knowledge", knowledge_page)),
        Route("/sources", _page("sources", sources_page)),
        Route("/settings", _page("settings", settings_page)),
        Route("/analytics", _page("analytics", analytics_page)),
        Route("/healthz", health),
        Route("/api/overview", _json_api(api_overview)),
        Route("/api/search", _json_api(api_search)),
        Route("/api/file", _json_api(api_file)),
        Route("/api/files", _json_api(api_files)),
        Route("/api/knowledge", _json_api(api_knowledge_create), methods=["POST"]),
        Route("/api/knowledge/{id}/edit", _json_api(api_knowledge_edit), methods=["POST"]),
        Route("/api/knowledge/{id}/delete", _json_api(api_knowledge_delete), methods=["POST"]),
        Route("/api/sources", _json_api(api_source_add), methods=["POST"]),
        Route("/api/sources/{name}/{action}", _json_api(api_source_action), methods=["POST"]),
        Route("/api/jobs/{id}", _json_api(api_job)),
        Route("/api/schedules", _json_api(api_schedules)),
        Route("/api/schedules/{name}", _json_api(api_schedule), methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.ctx = ctx
    app.state.templates = templates
    return Guard(app, port_of)


def _qs(project: str | None, **params: Any) -> str:
    """A query string that keeps the selected project."""
    from urllib.parse import urlencode

    items = {"project": project, **params}
    return "?" + urlencode({k: v for k, v in items.items() if v not in (None, "", False)})
