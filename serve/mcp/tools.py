"""MCP tool groups over the lake (CHUNKS, FILES) and the docs folders: search_code, fuzzy_find,
get_file_context, get_stale_status, list_sources, docs_index, docs_content, and index_codebase."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.models import SearchMode
from ctxlake.serve.api.models_sources import SourceList
from ctxlake.serve.api.tool_models import (
    CodeSearchResult,
    DocContent,
    DocsIndex,
    FileContext,
    FileRanking,
    IndexStarted,
    StaleStatus,
    SymbolMatches,
)
from ctxlake.serve.mcp.base import READ_ONLY, ServerState, response_size, tool_errors

# The MCP contract's search types, in the words of serve.api.code_search.search.
# Snippet sizes tried in turn when an answer would exceed [mcp] max_response_chars.
TRIM_STEPS = ((8, 480), (4, 240), (2, 120))



DEFAULT_BUDGET_TOKENS = 2000  # an answer an agent can afford to read; ~10 hits of ~8 lines

def _trim(result: CodeSearchResult, budget: int) -> CodeSearchResult:
    """Shorter snippets until the answer fits the budget; the hits themselves all stay."""
    for lines, chars in TRIM_STEPS:
        if response_size(result) <= budget:
            break
        for hit in result.hits:
            text = "\n".join(hit.snippet.splitlines()[:lines])
            hit.snippet = text if len(text) <= chars else text[:chars].rstrip() + " …"
        note = "snippets shortened to keep the answer small: use get_file_context for full text"
        if note not in result.warnings:
            result.warnings.append(note)
    return result


def register_code_tools(server: MCPServer, state: ServerState) -> None:
    """search_code, find_files, fuzzy_find, get_file_context, get_stale_status, list_sources."""

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def search_code(
        query: Annotated[str, Field(description="words, identifiers, a question, or a code fragment")],
        top_k: Annotated[int, Field(ge=1, le=50, description="number of chunks to return")] = 10,
        search_type: Annotated[SearchMode, Field(description=(
            "hybrid: keywords and meaning fused (default); semantic: meaning only; keyword: exact words "
            "and identifiers (BM25); fuzzy: typo-tolerant symbol names and words"))] = "hybrid",
        bm25_weight: Annotated[float | None, Field(ge=0.0, le=1.0, description=(
            "keyword share of the hybrid fusion, 0..1 (default from the project's settings)"))] = None,
        fuzziness: Annotated[int | None, Field(ge=0, le=2, description=(
            "edits allowed per word in keyword matching: 0 exact (keyword/hybrid default), 2 (fuzzy default)"))] = None,
        file_filter: Annotated[str | None, Field(description=(
            "only paths matching this glob, e.g. 'src/**/*.py' or '*.md'"))] = None,
        sources: Annotated[list[str] | None, Field(description=(
            "only these sources (see list_sources); default all"))] = None,
        budget_tokens: Annotated[int, Field(ge=100, le=20000, description=(
            "at most about this many tokens of hits (4 characters a token); the answer says how many "
            "it used and how many hits it left out"))] = DEFAULT_BUDGET_TOKENS,
    ) -> CodeSearchResult:
        """Search the indexed code and docs; returns ranked chunks with file, lines, symbol and a snippet."""
        from ctxlake.serve.api.code_lake import embedded_fraction
        from ctxlake.serve.api.code_search import mark_stale, search
        from ctxlake.serve.api.source_queries import check_names

        check_names(state.settings, sources)
        lake = state.lake()
        if search_type in ("hybrid", "semantic") and embedded_fraction(lake) > 0:
            state.query_embedder(lake)
        result = search(lake, query, mode=search_type, limit=top_k, path_glob=file_filter,
                        sources=sources, bm25_weight=bm25_weight, check_stale=False, fuzziness=fuzziness,
                        budget_tokens=budget_tokens)
        out = CodeSearchResult(**result.model_dump())
        mark_stale(out, state.freshness())
        if fuzziness and search_type == "semantic":
            out.warnings.append("fuzziness applies to keyword, fuzzy and hybrid; semantic search ignores it")
        return _trim(out, state.settings.mcp.max_response_chars)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def find_files(
        query: Annotated[str, Field(description=(
            "an issue or bug report, a traceback, identifiers, or a question; long text is fine"))],
        top_k: Annotated[int, Field(ge=1, le=50, description="number of files to return")] = 10,
        search_type: Annotated[SearchMode, Field(description=(
            "hybrid: keywords and meaning fused (default); semantic: meaning only; keyword: words and "
            "identifiers; fuzzy: typo-tolerant words"))] = "hybrid",
        file_filter: Annotated[str | None, Field(description="only paths matching this glob")] = None,
        exclude_tests: Annotated[bool, Field(description="leave test files out")] = False,
        sources: Annotated[list[str] | None, Field(description="only these sources; default all")] = None,
    ) -> FileRanking:
        """Which files to open first for a task: files ranked by their chunks' scores plus name, path and
        defined-symbol evidence (the ranking `ctx eval` measures on SWE-bench Lite)."""
        from ctxlake.serve.api.code_lake import embedded_fraction
        from ctxlake.serve.api.code_search import mark_stale
        from ctxlake.serve.api.file_search import search_files
        from ctxlake.serve.api.source_queries import check_names

        check_names(state.settings, sources)
        lake = state.lake()
        if search_type != "keyword" and embedded_fraction(lake) > 0:
            state.query_embedder(lake)
        result = search_files(lake, query, mode=search_type, limit=top_k, path_glob=file_filter,
                              sources=sources, exclude_tests=exclude_tests)
        out = FileRanking(**result.model_dump())
        mark_stale(out, state.freshness())
        return out

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def fuzzy_find(
        symbol_name: Annotated[str, Field(description="a function, method or class name; typos are fine")],
        symbol_type: Annotated[str | None, Field(description=(
            "only this kind: function, method, class, section ... (as the index names them)"))] = None,
    ) -> SymbolMatches:
        """Find where a symbol is defined when you only roughly know its name (typo-tolerant)."""
        from ctxlake.serve.api.explore import find_symbols

        result = find_symbols(state.lake(), symbol_name, symbol_type)
        result.stale = bool(state.freshness().stale_paths)
        return result

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def get_file_context(
        filepath: Annotated[str, Field(description="path of an indexed file, relative to the project root")],
        start_line: Annotated[int | None, Field(ge=1, description="first line, 1-based (default 1)")] = None,
        end_line: Annotated[int | None, Field(ge=1, description="last line, inclusive (default: 400 lines on)")] = None,
        include_related: Annotated[bool, Field(description=(
            "also return the chunks most similar to these lines in other files"))] = False,
        source: Annotated[str, Field(description=(
            "which indexed source the file is in: the project (default) or a name from list_sources"))] = PROJECT_SOURCE,
    ) -> FileContext:
        """Read lines of a file (current content on disk) with the symbols they contain."""
        from ctxlake.serve.api.explore import file_context
        from ctxlake.serve.api.source_queries import check_names

        check_names(state.settings, [source])
        budget = state.settings.mcp.max_response_chars // 3
        return file_context(state.lake(), filepath, start_line, end_line, include_related, budget, source=source)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def get_stale_status() -> StaleStatus:
        """Is the index up to date? Merkle root now vs. at the last run, changed files, embedding progress."""
        from ctxlake.errors import NotIndexedError
        from ctxlake.serve.api.explore import stale_status

        try:
            lake = state.lake()
        except NotIndexedError:
            lake = None
        return stale_status(state.settings, lake, state.rescan())

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def list_sources() -> SourceList:
        """What is indexed: each source with its files, chunks, embedded chunks, languages and last update."""
        from ctxlake.serve.api.source_queries import list_sources as sources_of

        return sources_of(state.settings, state.lake())


def register_docs_tools(server: MCPServer, state: ServerState) -> None:
    """docs_index and docs_content: the local documentation reader ([docs] paths)."""

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def docs_index(
        source: Annotated[str | None, Field(description="one docs folder by name (default: all)")] = None,
        cursor: Annotated[str | None, Field(description="next_cursor of the previous page")] = None,
    ) -> DocsIndex:
        """List the project's documentation files (markdown, rst, txt) with size and modification time."""
        return state.docs.index(source, cursor)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def docs_content(
        path: Annotated[str, Field(description="a path from docs_index, e.g. docs/guide/install.md")],
        chunk: Annotated[int, Field(ge=1, description="which chunk of the file, 1-based")] = 1,
    ) -> DocContent:
        """Read a documentation file, in chunks of at most 500 lines (see totalChunks)."""
        return state.docs.content(path, chunk)


def register_index_tool(server: MCPServer, state: ServerState) -> None:
    """index_codebase, only with `ctx serve --allow-index`: starts `ctx run index` in its own process."""
    if not state.options.allow_index:
        return

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                             idempotent_hint=True, open_world_hint=False))
    @tool_errors
    def index_codebase(
        force: Annotated[bool, Field(description="rebuild and re-embed everything")] = False,
    ) -> IndexStarted:
        """Start updating the index in the background; follow it with get_stale_status."""
        from ctxlake.tasks.lake import WriterLock

        settings = state.settings
        busy = WriterLock(settings.lake_dir).held_by_other() if settings.lake_dir.is_dir() else None
        if busy:
            raise ToolError(f"an indexer is already running (pid {busy.get('pid')}, since {busy.get('since')})")
        settings.lake_dir.mkdir(parents=True, exist_ok=True)
        log_path = settings.lake_dir / "index-mcp.log"
        argv = [sys.executable, "-c", "from ctxlake.serve.cli import main; main()", "run", "index",
                str(settings.root), *(["--force"] if force else [])]
        # A process of its own (own session, no pipes to us): the request returns at once, and the
        # run neither blocks the server nor dies with it.
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, cwd=settings.root, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=log, start_new_session=True, env=dict(os.environ))
        return IndexStarted(started=True, pid=proc.pid, log_file=str(log_path),
                            message="indexing started; get_stale_status shows progress, search works meanwhile")
