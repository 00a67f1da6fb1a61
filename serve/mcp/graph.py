"""MCP tools over the symbol graph: find_definition, find_references, related_files, file_outline.

Each delegates to serve/api/graph.py (the same functions as `ctx def/refs/related/outline`); the
graph tables are opened once per server, on the first call, and read at their newest version
by every call after it (an index run while serving needs no restart).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.graph_models import DefinitionAnswer, Outline, ReferencePage, RelatedAnswer
from ctxlake.serve.mcp.base import READ_ONLY, ServerState, tool_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from ctxlake.serve.api.graph import GraphReader


def register_graph_tools(server: MCPServer, state: ServerState) -> None:
    """find_definition, find_references, related_files, file_outline."""
    lock = threading.Lock()
    held: list[GraphReader] = []

    def reader(source: str = PROJECT_SOURCE) -> GraphReader:
        from ctxlake.serve.api.graph import GraphReader
        from ctxlake.serve.api.source_queries import check_names

        check_names(state.settings, [source])  # a typo names no source: an error, not an empty answer
        with lock:
            if not held:
                held.append(GraphReader(state.settings.lake_dir, state.settings.root))
            return held[0]

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def find_definition(
        symbol: Annotated[str, Field(description="a name or qualified name, e.g. 'filter' or 'QuerySet.filter'")],
        from_path: Annotated[str | None, Field(description=(
            "the file you are reading: definitions it imports rank first"))] = None,
        limit: Annotated[int, Field(ge=1, le=50, description="at most this many definitions")] = 5,
        source: Annotated[str, Field(description=(
            "which indexed source to read: the project (default) or a source's name from list_sources"))] = PROJECT_SOURCE,
    ) -> DefinitionAnswer:
        """Where a symbol is defined: path, lines, signature, docstring line; several definitions are
        ranked (imports of from_path, same folder, most imported) with a confidence and ambiguous flag."""
        return reader(source).find_definition(symbol, from_path, limit, source=source)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def find_references(
        symbol: Annotated[str, Field(description="a name or qualified name whose uses to list")],
        offset: Annotated[int, Field(ge=0, description="skip this many (use next_offset to page)")] = 0,
        limit: Annotated[int, Field(ge=1, le=100, description="references per page")] = 20,
        include_imports: Annotated[bool, Field(description="also list import lines")] = True,
        source: Annotated[str, Field(description=(
            "which indexed source to read: the project (default) or a source's name from list_sources"))] = PROJECT_SOURCE,
    ) -> ReferencePage:
        """Who uses a symbol: path:line, kind (call/attribute/name/import), enclosing function and
        the line; files linked to a definition through imports first (resolved=true)."""
        return reader(source).find_references(symbol, offset, limit, include_imports, source=source)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def related_files(
        path: Annotated[str, Field(description="an indexed file, relative to the project root")],
        limit: Annotated[int, Field(ge=1, le=100, description="at most this many related files")] = 30,
        source: Annotated[str, Field(description=(
            "which indexed source to read: the project (default) or a source's name from list_sources"))] = PROJECT_SOURCE,
    ) -> RelatedAnswer:
        """Files a file imports, files importing it, and files often changed in the same commits."""
        return reader(source).related_files(path, limit, source=source)

    @server.tool(annotations=READ_ONLY)
    @tool_errors
    def file_outline(
        path: Annotated[str, Field(description="an indexed file, relative to the project root")],
        limit: Annotated[int, Field(ge=1, le=200, description="at most this many definitions")] = 200,
        source: Annotated[str, Field(description=(
            "which indexed source to read: the project (default) or a source's name from list_sources"))] = PROJECT_SOURCE,
    ) -> Outline:
        """A file's definitions in order with lines, signatures, docstring lines and nesting depth."""
        return reader(source).file_outline(path, limit, source=source)
