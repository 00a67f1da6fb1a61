"""MCP tools of sources: ask_codebase (a subagent over chosen sources), registered only with `ctx serve --allow-agents`.

`list_sources` belongs to the main server (serve/mcp/server.py) and reads the same data through
`serve.api.source_queries.list_sources`. Nothing here imports Prefect or writes a table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from ctxlake.errors import AgentError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.models_sources import AskResult

if TYPE_CHECKING:
    from mcp.server import MCPServer

ASK_DESCRIPTION = (
    "Ask a coding agent (Claude Code, Gemini CLI, opencode or codex, as configured) a question about "
    "some indexed sources: libraries' repositories, docs, local folders, or 'project'. The agent "
    "runs in a scratch folder holding only those sources, with the index's best search hits in its "
    "prompt, and cannot call MCP servers. Slow (it may take minutes): prefer search for lookups, "
    "use this for questions that need reading and reasoning across files. Returns its answer."
)


def register_source_tools(server: MCPServer, settings: Settings, *, allow_agents: bool) -> list[str]:
    """Add the sources tools to `server`; ask_codebase only when agents are allowed. The names added."""
    if not allow_agents:
        return []
    from mcp.types import ToolAnnotations

    from ctxlake.serve.api import source_queries
    from ctxlake.serve.mcp.base import tool_errors

    def ask_codebase(
        question: Annotated[str, Field(description="the question, in full sentences, with names you know")],
        sources: Annotated[list[str] | None, Field(
            description="source names to give the agent (see list_sources); omit for the project and all sources",
        )] = None,
        agent: Annotated[str | None, Field(
            description="agent to run (claude-code, gemini, opencode, codex); omit for the configured default",
        )] = None,
    ) -> AskResult:
        source_queries.check_names(settings, sources)
        result = source_queries.ask(settings, sources, question, agent)
        if result.exit_code != 0:
            tail = result.stderr.strip().splitlines()[-1:] or ["no stderr"]
            raise AgentError(f"agent {result.agent!r} exited with {result.exit_code}: {tail[0]}")
        return result

    server.add_tool(
        tool_errors(ask_codebase), name="ask_codebase", title="Ask an agent about sources", description=ASK_DESCRIPTION,
        # It starts a process but changes no table or file outside its own scratch folder.
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=True),
    )
    return ["ask_codebase"]
