"""Data that looks like Rich markup or emoji codes is printed as it is by every CLI reader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

DANGER = 'def bracketmarker():\n    console.print("[bold red]error:[/] disk full")\n    return "root:x:0:0"\n'


@pytest.fixture
def indexed(make_repo: Callable[..., Path], cli: Callable[..., Any]) -> Path:
    # A project folder whose own name is markup: `ctx status` prints it.
    repo = make_repo({"qa/[red]danger.py": DANGER, "README.md": "# [bold]title[/bold] :x:\n"}, name="[blue]proj")
    result = cli("run", "index", cwd=repo)
    assert result.exit_code == 0, result.stderr
    return repo


def test_hostile_strings_print_verbatim(indexed: Path, cli: Callable[..., Any]) -> None:
    def out(*args: str) -> str:
        result = cli(*args, cwd=indexed)
        assert result.exit_code == 0, (args, result.stderr)
        assert "Traceback" not in result.stderr
        return str(result.stdout)

    assert "[/]" in out("sql", "select '[/]' as x")
    assert "[/]" in out("sql", "select 1 as \"[/]\"")  # a column name too
    assert "root:x:0:0" in out("sql", "select 'root:x:0:0' as l")
    assert '"[bold red]error:[/] disk full"' in out("sql", "select text from chunks where path like 'qa/%'")
    assert "qa/[red]danger.py" in out("files", "bracketmarker", "--mode", "keyword")
    searched = out("search", "bracketmarker", "--mode", "keyword")
    assert "qa/[red]danger.py" in searched and "[bold red]error:[/] disk full" in searched
    assert "root:x:0:0" in searched
    assert "[blue]proj" in out("status")
    assert "[blue]proj" in out("stats")
    assert "[bold]title[/bold] :x:" in out("show", "README.md")
    assert "qa/[red]danger.py" in out("def", "bracketmarker")
    no_hits = cli("search", "[/] :cross_mark: nothingmatches", "--mode", "keyword", cwd=indexed)
    assert no_hits.exit_code == 0 and "[/] :cross_mark: nothingmatches" in no_hits.stdout
