"""What ctxlake knows about the agent tools themselves: where each keeps its MCP config
(`clients`) and its session hooks (`hook_files`). Both the CLI and the MCP server read these, so
they live outside `serve.cli` (importing them never pulls in the Typer app)."""
