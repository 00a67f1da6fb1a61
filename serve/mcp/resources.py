"""MCP resources (ctx://status, ctx://config, ctx://files, ctx://file/{+path}) and prompts (code_review,
explain_codebase, find_similar) over the lake (CHUNKS, FILES) and the project's settings."""

from __future__ import annotations

import json
from collections import Counter
from typing import Annotated, Any

from mcp.server import MCPServer
from mcp.server.mcpserver.resources import ResourceSecurity
from mcp.shared.exceptions import MCPError
from mcp.types import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import Field

from ctxlake.errors import CtxError
from ctxlake.serve.api.models import SearchMode
from ctxlake.serve.mcp.base import ServerState
from ctxlake.tasks.lake import lake_failure

JSON = "application/json"
# The prompts quote code; this keeps a prompt well inside a model's context.
PROMPT_LINES = 300


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str, ensure_ascii=False)


def _domain_errors(fn: Any) -> Any:
    """Domain errors, a full or forbidden disk and a damaged lake as protocol errors with their
    message and hint (as tool_errors does for tools): the SDK replaces any other exception of a
    resource or prompt with a generic "Error rendering ..." text."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CtxError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from exc
        except (OSError, RuntimeError, ValueError) as exc:
            known = lake_failure(exc)
            if known is None:
                raise
            raise MCPError(code=INTERNAL_ERROR, message=str(known)) from exc

    return wrapper


def register_resources(server: MCPServer, state: ServerState) -> None:
    """Status, effective configuration, the file listing (paged) and single files."""

    @server.resource("ctx://status", name="status", mime_type=JSON,
                     description="index status: files, chunks, languages, model, last run, stale files")
    @_domain_errors
    def status() -> str:
        from ctxlake.serve.api.index_status import status as status_of

        return _json(status_of(state.settings).model_dump(mode="json"))

    @server.resource("ctx://config", name="config", mime_type=JSON,
                     description="the effective settings (CLI > CTX_* env > .ctx/config.toml > defaults); no secrets")
    def config() -> str:
        return _json(state.settings.model_dump(mode="json"))

    @server.resource("ctx://files", name="files", mime_type=JSON,
                     description="indexed files, 200 per page; next pages at ctx://files?cursor=<next_cursor>")
    @_domain_errors
    def files() -> str:
        from ctxlake.serve.api.explore import list_files

        return _json(list_files(state.lake()).model_dump(mode="json"))

    @server.resource("ctx://files{?cursor}", name="files_page", mime_type=JSON,
                     description="a further page of the indexed files")
    @_domain_errors
    def files_page(cursor: str = "") -> str:
        from ctxlake.serve.api.explore import list_files

        return _json(list_files(state.lake(), cursor or None).model_dump(mode="json"))

    # Our own path checks (serve/api/docs.py) give clearer errors than the SDK's generic rejection.
    @server.resource("ctx://file/{+path}", name="file", mime_type="text/plain",
                     description="an indexed file's current text (long files are cut; see get_file_context)",
                     security=ResourceSecurity(exempt_params={"path"}))
    @_domain_errors
    def file(path: str) -> str:
        from ctxlake.serve.api.explore import file_context

        budget = state.settings.mcp.max_response_chars // 2
        context = file_context(state.lake(), path, 1, None, max_chars=budget)
        if context.truncated or context.next_start_line:
            return context.content + (
                f"\n… [cut after line {context.end_line} of {context.total_lines}: read on with "
                f"get_file_context(filepath={context.path!r}, start_line={context.end_line + 1})]\n")
        return context.content


def _numbered(content: str, first: int) -> str:
    return "".join(f"{first + i:>5}  {line}" for i, line in enumerate(content.splitlines(keepends=True)))


def register_prompts(server: MCPServer, state: ServerState) -> None:
    """code_review(filepath), explain_codebase(), find_similar(code)."""

    @server.prompt(description="Review one file of the project, with its current text and outline")
    @_domain_errors
    def code_review(
        filepath: Annotated[str, Field(description="path of an indexed file, relative to the project root")],
    ) -> str:
        from ctxlake.serve.api.explore import file_context

        ctx = file_context(state.lake(), filepath, 1, PROMPT_LINES)
        outline = "\n".join(f"- {o.kind} {o.symbol or ''} (lines {o.start_line}-{o.end_line})" for o in ctx.outline)
        more = (f"\nOnly lines 1-{ctx.end_line} of {ctx.total_lines} are shown; read the rest with "
                f"get_file_context(filepath={ctx.path!r}, start_line={ctx.end_line + 1}).\n"
                if ctx.end_line < ctx.total_lines else "")
        return (
            f"Review `{ctx.path}` ({ctx.lang or 'text'}, {ctx.total_lines} lines). Look for bugs, unclear "
            "naming, missing error handling and missing tests. Before judging how something is used, "
            "check its callers with search_code or fuzzy_find; get_file_context(include_related=true) "
            "shows similar code elsewhere.\n\n"
            f"Outline:\n{outline or '- (no symbols)'}\n\n```{ctx.lang or ''}\n{_numbered(ctx.content, 1)}```\n{more}"
        )

    @server.prompt(description="Explain how this codebase is organised, from the index's overview")
    @_domain_errors
    def explain_codebase() -> str:
        from ctxlake.serve.api.explore import list_files
        from ctxlake.serve.api.source_queries import list_sources

        lake = state.lake()
        sources = list_sources(state.settings, lake)
        folders: Counter[str] = Counter()
        cursor: str | None = None
        while True:
            page = list_files(lake, cursor, page=5000)
            folders.update(f.path.split("/", 1)[0] if "/" in f.path else "(root)" for f in page.files)
            cursor = page.next_cursor
            if cursor is None:
                break
        project = next((s for s in sources.sources if s.name == "project"), None)
        langs = ", ".join(f"{k} {v}" for k, v in list((project.languages if project else {}).items())[:8])
        tops = "\n".join(f"- {name}/ ({n} files)" for name, n in folders.most_common(25))
        docs = state.docs.index()
        doc_list = "\n".join(f"- {d.path}" for d in docs.documents[:20]) or "- (none in the docs folders)"
        return (
            "Explain how this codebase is organised: its purpose, the main components and how they "
            "depend on each other, the entry points, and where to start reading. Ground every claim "
            "in code you looked at (search_code, fuzzy_find, get_file_context) and cite paths.\n\n"
            f"Indexed: {project.files if project else 0} files, {project.chunks if project else 0} chunks; "
            f"languages: {langs or '-'}.\n\nTop-level folders:\n{tops}\n\nDocumentation "
            f"(docs_content reads them):\n{doc_list}\n"
        )

    @server.prompt(description="Find code similar to a fragment, with the index's best matches attached")
    @_domain_errors
    def find_similar(
        code: Annotated[str, Field(description="a code fragment to find look-alikes of")],
    ) -> str:
        from ctxlake.serve.api.code_lake import embedded_fraction
        from ctxlake.serve.api.code_search import search

        lake = state.lake()
        mode: SearchMode = "semantic" if embedded_fraction(lake) > 0 else "keyword"
        if mode == "semantic":
            state.query_embedder(lake)
        result = search(lake, code, mode=mode, limit=8, check_stale=False)
        hits = "\n".join(f"{i}. {h.path}:{h.start_line}-{h.end_line} {h.symbol or ''}"
                         for i, h in enumerate(result.hits, start=1)) or "(no matches)"
        return (
            "Find code in this project that does the same as, or closely resembles, the fragment "
            "below. Candidates from the index "
            f"({'by meaning' if mode == 'semantic' else 'by keywords'}) are listed; read them with "
            "get_file_context, say which really are similar and how they differ, and suggest whether "
            f"they could share code.\n\n```\n{code[:8000]}\n```\n\nCandidates:\n{hits}\n"
        )
