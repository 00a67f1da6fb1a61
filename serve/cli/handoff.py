"""`ctx handoff`: print the hand-off brief of the latest (or a named) agent session."""

from __future__ import annotations

from typing import Annotated

import typer


def handoff(
    tool: Annotated[str | None, typer.Option("--from", help="the latest session of this tool: claude, codex, ...")] = None,
    session: Annotated[str | None, typer.Option("--session", help="this session ref (or a unique prefix)")] = None,
    budget: Annotated[int, typer.Option("--budget", help="most tokens in the brief (estimated as chars/4)")] = 1500,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
) -> None:
    """Where the last session stopped: goal, what was done, decisions, errors, last state, open tasks, next step."""
    from ctxlake.serve.api.handoff import build_brief
    from ctxlake.serve.cli.memory import _lake, _print_json

    _, lake = _lake()
    brief = build_brief(lake, tool=tool, ref=session, budget=budget)
    if as_json:
        _print_json(brief.to_dict())
        return
    typer.echo(brief.text)


def register(app: typer.Typer) -> None:
    app.command("handoff")(handoff)
