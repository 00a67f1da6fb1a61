"""The `ctx` Typer commands. `app` is the entry module and imports its parts, never the reverse;
shared pieces live in `base`."""

from __future__ import annotations


def main() -> None:
    """`python -c "from ctxlake.serve.cli import main; main()"` is the command agents' MCP configs
    hold (`ctx mcp init` wrote it): it stays valid whatever module holds the app."""
    from ctxlake.serve.cli.app import main as run

    run()
