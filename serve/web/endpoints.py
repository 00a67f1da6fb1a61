"""The web UI's JSON endpoints, /api/* (serve stage; CHUNKS, SESSIONS, MESSAGES, KNOWLEDGE through serve/api).

Each a thin call into serve/api/ (no query logic here); sources are added, updated and removed as background jobs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from starlette.requests import Request

from ctxlake.errors import CtxError, InputError
from ctxlake.serve.web.base import UiContext, _ctx, _known, _memory_stamp, _number, _split

CONTEXT_TYPES = {"conversations": ["message", "session"], "knowledge": ["knowledge"]}


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
    if name:  # without one, `ctx add` names the source after its origin
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
    named = [name] if name else []
    job = ctx.jobs.start(f"add {name or origin}", [*argv, "--", *named, origin], Path(root), env=_child_env(ctx))
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
