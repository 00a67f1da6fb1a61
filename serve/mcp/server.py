"""The MCP server: build_server(settings, options) -> an MCPServer of read-only tools over the lake (no Prefect).

How it is put together
----------------------
- One `ServerState` per server (the typed lifespan context). Right after the first answer
  (`initialize`) it starts opening the lake on a background thread (importing lancedb costs
  ~1 s), so the handshake never waits for it; the first tool that needs the lake waits instead.
  The query embedder loads on the first semantic query, never before.
- Tools, resources and prompts come in groups. A group is a function in its own module,

      def register_<group>_tools(server: MCPServer, state: ServerState) -> None:
          @server.tool(annotations=READ_ONLY)
          @tool_errors
          def my_tool(arg: str) -> MyModel:
              \"\"\"What it does, for an agent reader.\"\"\"
              from ctxlake.serve.api.my_queries import my_query

              return my_query(state.lake(), arg)

  and `build_server` calls every group listed in `tool_groups()`: add a line there. Keep each tool
  to a dozen lines that delegate to a query function, return a pydantic model (clients then get
  an outputSchema, structured content and a JSON text mirror), and raise on bad input: a domain
  error (ctxlake.errors) becomes a tool error carrying its message and hint; never return a
  success=False answer. Import heavy modules inside the tool body, not at module import: the
  server must answer `initialize` within 2 s. Sync tools run on worker threads, so a slow
  query never blocks the protocol.
- stdout carries only the protocol (the SDK points fd 1 at stderr while it serves stdio); logs go
  to stderr.
"""

from __future__ import annotations

import contextlib
import os
import reprlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server import MCPServer

from ctxlake import __version__
from ctxlake.schemas.config import Settings
from ctxlake.serve.mcp.base import ServeOptions as ServeOptions
from ctxlake.serve.mcp.base import ServerState, ToolGroup

SERVER_NAME = "ctxlake"
INSTRUCTIONS = (
    "ctxlake serves a local index of this project's code and docs. Start with search_code "
    "(hybrid by default; keyword for exact identifiers, fuzzy for half-remembered names), use "
    "fuzzy_find for a symbol's definition, get_file_context to read lines of a file, docs_index and "
    "docs_content for the project's documentation. Results carry `stale` when files changed since "
    "the last index run; get_stale_status says what changed. Everything here is read-only."
)


def tool_groups() -> list[ToolGroup]:
    """Every group of tools, resources and prompts the server offers; imported here so that
    building a server is the only thing that pulls them in."""
    from ctxlake.serve.mcp.graph import register_graph_tools
    from ctxlake.serve.mcp.handoff import register_handoff
    from ctxlake.serve.mcp.memory import register_memory_tools
    from ctxlake.serve.mcp.registry import register_registry_tools
    from ctxlake.serve.mcp.resources import register_prompts, register_resources
    from ctxlake.serve.mcp.sources import register_source_tools
    from ctxlake.serve.mcp.tools import (
        register_code_tools,
        register_docs_tools,
        register_index_tool,
    )

    def register_sources(server: MCPServer[ServerState], state: ServerState) -> None:
        register_source_tools(server, state.settings, allow_agents=state.options.allow_agents)

    def register_memory(server: MCPServer[ServerState], state: ServerState) -> None:
        register_memory_tools(server, state.settings, state.memory, allow_writes=state.options.allow_writes)

    return [register_code_tools, register_docs_tools, register_index_tool, register_sources,
            register_memory, register_resources, register_prompts, register_handoff, register_graph_tools,
            register_registry_tools]


def _describe(errors: list[Any]) -> str:
    """Pydantic's errors as one line: `field: what is wrong (got <value>)` each."""
    parts = []
    for err in errors[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "arguments"
        got = "" if err.get("type") == "missing" else f" (got {reprlib.repr(err.get('input'))})"
        parts.append(f"{where}: {err.get('msg', 'invalid').lower()}{got}")
    more = f"; and {len(errors) - 5} more" if len(errors) > 5 else ""
    return "; ".join(parts) + more


MAX_ERROR_CHARS = 2_000


class CtxServer(MCPServer[ServerState]):
    """The SDK's server with clear answers to calls it cannot run: an unknown tool is a protocol
    error (-32602) that names the tools there are; arguments that do not fit the schema, or names
    the tool does not take, are one tool-error line instead of pydantic's multi-line dump."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
        from mcp.shared.exceptions import MCPError
        from mcp.types import INVALID_PARAMS
        from pydantic import ValidationError

        tool = self._tool_manager.get_tool(name)
        if tool is None:
            known = ", ".join(sorted(t.name for t in self._tool_manager.list_tools()))
            raise MCPError(INVALID_PARAMS, f"unknown tool {reprlib.repr(name)}; the tools are: {known}")
        allowed = set((tool.parameters or {}).get("properties", {}))
        extra = sorted(k for k in arguments if k not in allowed)
        if extra:
            raise ToolError(f"invalid arguments for {name}: unknown argument(s) {', '.join(map(repr, extra))} "
                            f"(hint: {name} takes {', '.join(sorted(allowed)) or 'no arguments'})")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(exc, UnexpectedToolError):
                raise
            if not isinstance(cause, ValidationError):
                if len(str(exc)) <= MAX_ERROR_CHARS:
                    raise
                # A domain error that quotes a huge argument back (a 100,000-character path).
                text = str(exc)
                raise ToolError(text[: MAX_ERROR_CHARS // 2] + " … " + text[-MAX_ERROR_CHARS // 4 :]) from cause
            raise ToolError(f"invalid arguments for {name}: {_describe(cause.errors())} "
                            "(hint: see the tool's inputSchema in tools/list)") from cause


def build_server(settings: Settings, options: ServeOptions | None = None) -> MCPServer[ServerState]:
    """An MCP server over the project's lake; nothing is opened until it runs.

    The state is made here, so that static resources (which get no request context) reach it
    too; the lifespan starts it and hands it on as the typed lifespan context.
    """
    state = ServerState(settings, options or ServeOptions())

    @asynccontextmanager
    async def lifespan(_: MCPServer[ServerState]) -> AsyncIterator[ServerState]:
        try:
            yield state
        finally:
            state.close()

    async def warm_up_after_first_answer(ctx: Any, call_next: Any) -> Any:
        # Opening the lake imports lancedb (~1 s of CPU, mostly holding the GIL): started with
        # the lifespan it would delay the answer to `initialize` on a 2-core machine.
        result = await call_next(ctx)
        state.start()
        return result

    server: MCPServer[ServerState] = CtxServer(
        SERVER_NAME, version=__version__, instructions=INSTRUCTIONS, lifespan=lifespan,
        log_level=state.options.log_level,  # type: ignore[arg-type]
    )
    server.middleware.append(warm_up_after_first_answer)
    for register in tool_groups():
        register(server, state)
    return server


def run_stdio(settings: Settings, options: ServeOptions) -> None:
    """Serve MCP over stdin/stdout until the client closes the pipe, then exit at once.

    Returning normally ran the interpreter's shutdown while the stdio transport's reader thread
    could still be blocked in a read of stdin; about 1 run in 8 then aborted with "Fatal Python
    error: PyGILState_Release". Nothing is left to do once the transport has closed: every answer
    was written, so flush and leave without the interpreter's teardown.
    """
    build_server(settings, options).run("stdio")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # the client closed its end too
            stream.flush()
    os._exit(0)


def run_http(settings: Settings, options: ServeOptions, port: int) -> None:
    """Serve MCP over streamable HTTP on 127.0.0.1 only (with the SDK's DNS-rebinding guard)."""
    server = build_server(settings, options)
    server.run("streamable-http", host="127.0.0.1", port=port)

