"""MCP tools `list_configs` and `get_config`: the project's portable skills, commands, agents and rules (read-only)."""

from __future__ import annotations

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
