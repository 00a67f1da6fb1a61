"""MCP tool `handoff_brief` and prompt `continue_work`: the hand-off brief for an agent starting a session."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from ctxlake.serve.api.memory_models import DEFAULT_BUDGET, Brief
from ctxlake.serve.mcp.base import READ_ONLY, tool_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from ctxlake.serve.mcp.base import ServerState


def register_handoff(server: MCPServer[ServerState], state: ServerState) -> None:
    """Read-only: the brief is built from stored rows and git; nothing is written."""
    from ctxlake.serve.mcp.resources import _domain_errors

    def brief_of(tool: str | None, ref: str | None = None, budget: int = DEFAULT_BUDGET) -> Brief:
        from ctxlake.serve.api.handoff import build_brief

        return build_brief(state.memory(), tool=tool, ref=ref, budget=budget)

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def handoff_brief(from_tool: str | None = None, session_ref: str | None = None,
                      budget: int = DEFAULT_BUDGET) -> Brief:
        """Call this first when starting work: where the last agent session in this project stopped (any
        tool), as a short brief: the goal in the user's words, files changed (with git diff --stat), decisions,
        errors and their fixes, the last request and reply, a failing command, open tasks and a suggested next
        step. from_tool: only that tool's latest session (claude, codex, gemini, cursor, ...). budget: most
        tokens (estimated as characters/4)."""
        return brief_of(from_tool, session_ref, budget)

    @server.prompt(description="Continue the work the last agent session in this project left off")
    @_domain_errors
    def continue_work(
        from_tool: Annotated[str | None, Field(description="only this tool's latest session")] = None,
    ) -> str:
        brief = brief_of(from_tool)
        return ("You are continuing work another agent session started. Read the hand-off below, check the "
                "working tree matches it (git status), then carry on with the suggested next step; ask the user "
                "only if the goal is unclear.\n\n" + brief.text)
