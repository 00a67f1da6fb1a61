"""The web UI's routes (serve stage; the tables only through pages.py and endpoints.py): the Starlette app.

Server-rendered pages and small JSON endpoints, each a thin call into serve/api/ (no query logic here),
for the projects the service knows."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from ctxlake import __version__
from ctxlake.errors import CtxError, LakeError
from ctxlake.serve.web.base import UiContext, _ctx, _known
from ctxlake.serve.web.endpoints import (
    api_file,
    api_files,
    api_job,
    api_knowledge_create,
    api_knowledge_delete,
    api_knowledge_edit,
    api_overview,
    api_schedule,
    api_schedules,
    api_search,
    api_source_action,
    api_source_add,
)
from ctxlake.serve.web.pages import (
    analytics_page,
    knowledge_page,
    session_page,
    sessions_page,
    settings_page,
    sources_page,
)
from ctxlake.serve.web.security import Guard
from ctxlake.tasks.lake import storage_errno

HERE = Path(__file__).resolve().parent  # an editable install links each file: serve the real folder (StaticFiles refuses links out)
PAGES = [("overview", "/", "Overview"), ("search", "/search", "Search"), ("sessions", "/sessions", "Sessions"),
         ("knowledge", "/knowledge", "Knowledge"), ("sources", "/sources", "Sources"), ("analytics", "/analytics", "Analytics"),
         ("settings", "/settings", "Settings")]
# A POST body: the largest the UI sends is a knowledge record (200 + 20,000 characters, under 130 KB
# even with every character escaped as \uXXXX).
MAX_BODY_BYTES = 1 << 20


# -- helpers -------------------------------------------------------------------------------------

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
