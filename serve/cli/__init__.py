"""The `ctx` Typer commands. `app` is the entry module and imports its parts, never the reverse;
shared pieces live in `base`."""

from __future__ import annotations

# The most rows a `-n/--limit` may ask for: past it a number only reached LanceDB, which failed on
# one over 2**31 with a traceback.
MAX_LIMIT = 1000


def main() -> None:
    """`python -c "from ctxlake.serve.cli import main; main()"` is the command agents' MCP configs
    hold (`ctx mcp init` wrote it): it stays valid whatever module holds the app."""
    from ctxlake.serve.cli.app import main as run

    run()
