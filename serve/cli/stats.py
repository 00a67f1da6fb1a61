"""`ctx stats`: the lake's and the agents' headline figures and top lists (serve/api/stats.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from ctxlake.schemas.config import load_settings
from ctxlake.schemas.roots import resolve_root


def stats(
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="rows in each top list")] = 10,
    all_projects: Annotated[bool, typer.Option("--all-projects", help="conversation figures of every project, not just this one's")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
) -> None:
    """Headline figures: files, chunks, embedded share, lake size, sessions, messages, knowledge; top lists."""
    from rich.table import Table

    from ctxlake.serve.api.stats import lake_stats
    from ctxlake.serve.cli.render import human_bytes, plain, print_json, stdout_console

    figures = lake_stats(load_settings(resolve_root(None, for_write=False)), top=top, all_projects=all_projects)
    if as_json:
        print_json(figures.model_dump(mode="json"))
        return
    console = stdout_console()
    console.print(plain(figures.project), style="bold")
    if figures.code_indexed:
        console.print(f"  files {figures.files:,}  chunks {figures.chunks:,}  embedded {figures.embedded_share:.0%}  "
                      f"lake {human_bytes(figures.lake_bytes)}  last index run {figures.last_index_run or 'never'}",
                      markup=False)
    else:
        console.print("  code not indexed (`ctx run index`)", markup=False)
    console.print(f"  sessions {figures.sessions:,}  messages {figures.messages:,}  knowledge records "
                  f"{figures.knowledge:,}  ({figures.scope})", markup=False)
    lists = [("Chunks per language", figures.chunks_per_language), ("Files most touched in sessions", figures.touched_files),
             ("Most frequent errors", figures.frequent_errors)]
    for title, rows in lists:
        if not rows:
            continue
        table = Table(title=title, title_justify="left", show_edge=False)
        table.add_column("", overflow="fold")
        table.add_column("n", justify="right")
        for row in rows:
            table.add_row(plain(row.label), f"{row.count:,}")
        console.print(table)
    if figures.activity:
        days = sorted({a.day for a in figures.activity})
        console.print(f"Activity: {sum(a.sessions for a in figures.activity):,} sessions over {len(days)} day(s), "
                      f"{days[0]} .. {days[-1]}")


def register(app: typer.Typer) -> None:
    """Add `ctx stats` to the CLI."""
    app.command("stats")(stats)
