"""MCP tools `list_configs` and `get_config`: the project's portable skills, commands, agents and rules (read-only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from ctxlake.serve.mcp.base import READ_ONLY, tool_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from ctxlake.serve.mcp.base import ServerState


class ConfigSummary(BaseModel):
    kind: str
    name: str
    description: str
    source: str = Field(description="the registry file, relative to the project root")


class ConfigList(BaseModel):
    items: list[ConfigSummary]


class ConfigDetail(ConfigSummary):
    body: str
    argument_hint: str | None = None
    tools: list[str] = Field(default_factory=list)
    model: str | None = None
    globs: list[str] = Field(default_factory=list)
    always_apply: bool = False


class ToolSetup(BaseModel):
    tool: str = Field(description="claude, codex, gemini, cursor, copilot, opencode or antigravity")
    mcp: str = Field(description="where ctx's MCP server is registered for this project, or 'no' / 'user-wide only'")
    hooks: str = Field(description="ctx's session hooks: installed, partial, missing, skipped (its file links out of the project, unread, or cannot be parsed), or 'none' when the tool has none")
    sessions: int = Field(description="this project's sessions of this tool in the conversation lake")
    last_session: str | None = Field(default=None, description="when the newest one ended (ISO time)")


class ToolPreferences(BaseModel):
    tools: list[ToolSetup]
    used_most: list[str] = Field(description="tools with sessions here, most sessions first")
    rules: list[ConfigSummary] = Field(description="the registry's rules: what the project asks of every agent")
    registry_stale: list[str] = Field(description="native files `ctx sync` would change (empty: in sync)")


TOOLS = ("claude", "codex", "gemini", "cursor", "copilot", "opencode", "antigravity")
# The `ctx init` client whose project file holds a tool's MCP entry, where its name differs (Copilot
# in VS Code reads .vscode/mcp.json); Antigravity has no project file.
_INIT_CLIENT = {"copilot": "vscode"}


def tool_setup(root: Path, sessions: dict[str, tuple[int, str | None]]) -> list[ToolSetup]:
    """Each agent tool as this project has it wired: MCP entry, session hooks, sessions seen."""
    from ctxlake.serve.agents import clients, hook_files

    out = []
    for tool in TOOLS:
        if tool == "antigravity":
            mcp = "user-wide only"
        else:
            mcp = clients.registered_file(root, _INIT_CLIENT.get(tool, tool)) or "no"
        hooks = hook_files.status(tool, root).action if tool in hook_files.HOOK_CLIENTS else "none"
        count, last = sessions.get(tool, (0, None))
        out.append(ToolSetup(tool=tool, mcp=mcp, hooks=hooks, sessions=count, last_session=last))
    return out


def register_registry_tools(server: MCPServer[ServerState], state: ServerState) -> None:
    """Read-only: the tools read .ctx/registry/ and write nothing."""
    from ctxlake.serve.api.registry import get_config as api_get
    from ctxlake.serve.api.registry import list_configs as api_list

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def list_configs(kind: str | None = None) -> ConfigList:
        """The project's portable agent configs in .ctx/registry/: skills, commands (reusable prompts), agents
        and rules, each with its description. kind: only skill, command, agent or rule."""
        return ConfigList(items=[ConfigSummary(**i) for i in api_list(state.settings.root, kind)])

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def get_config(name: str, kind: str | None = None) -> ConfigDetail:
        """One registry item in full (its instructions or prompt text and fields). name: as list_configs gives it;
        kind: needed only when two kinds share the name."""
        return ConfigDetail(**api_get(state.settings.root, name, kind))

    @server.tool(annotations=READ_ONLY, structured_output=True)
    @tool_errors
    def tool_preferences() -> ToolPreferences:
        """Which agent tools this project uses and how each is wired for ctx: its MCP entry, session hooks and
        sessions here (most used first), the registry's rules every agent should follow, and whether the tools'
        generated config files are in sync. Call it to learn the project's conventions before changing them."""
        from ctxlake.serve.api.memory_sessions import session_counts
        from ctxlake.tasks.registry import sync

        root = state.settings.root
        counts = session_counts(state.memory())
        tools = tool_setup(root, counts)
        used = [t.tool for t in sorted(tools, key=lambda t: (-t.sessions, t.tool)) if t.sessions]
        rules = [ConfigSummary(**i) for i in api_list(root, "rule")]
        check = sync(root, check=True)
        stale = sorted({c.path for c in check.pending})
        return ToolPreferences(tools=tools, used_most=used, rules=rules, registry_stale=stale)
