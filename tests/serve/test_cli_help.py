"""What the CLI tells a person: `ctx --help` texts survive Rich (a config section named in help, `[ui]
port`, is escaped, or Rich reads it as a style tag and drops it), and hints name CLI commands."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer
from rich.text import Text
from typer.testing import CliRunner

from ctxlake.serve.cli.app import app


def help_texts(command: Any, path: str = "ctx") -> Iterator[tuple[str, str]]:
    """Every command's help and every option's and argument's, down the tree (typer's own click types)."""
    for text in (command.help, command.short_help):
        if text:
            yield path, text
    for param in command.params:
        if getattr(param, "help", None):
            yield f"{path} {param.name}", str(param.help)
    for name, sub in (getattr(command, "commands", None) or {}).items():
        yield from help_texts(sub, f"{path} {name}")


def test_no_help_text_has_brackets_that_rich_would_eat() -> None:
    texts = list(help_texts(typer.main.get_command(app)))
    assert len(texts) > 100  # the whole tree was walked
    eaten = [(where, text) for where, text in texts if Text.from_markup(text).plain.count("[") != text.count("[")]
    assert not eaten


def test_the_rendered_help_shows_the_config_sections() -> None:
    runner = CliRunner()
    for args, words in [(["ui", "--help"], "[ui] port"), (["--help"], "documentation ([docs] paths"),
                        (["schedule", "set", "--help"], "[schedule]")]:
        result = runner.invoke(app, args, env={"COLUMNS": "250", "NO_COLOR": "1"})
        assert result.exit_code == 0 and words in " ".join(result.output.split()), (args, result.output)


def test_ctx_docs_hints_name_the_cli_command_not_the_mcp_tool(cli: Callable[..., Any], tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n")
    for path in ("nosuch.md", "docs/release-checklist-for-mobile.md", "docs/.hidden.md"):
        result = cli("docs", path, cwd=tmp_path)
        assert result.exit_code == 2 and "`ctx docs`" in result.stderr, (path, result.stderr)
        assert "docs_index" not in result.stderr


def test_ctx_docs_says_when_it_finds_no_documentation(cli: Callable[..., Any], tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    (tmp_path / "app.py").write_text("print('hi')\n")
    result = cli("docs", cwd=tmp_path)
    assert result.exit_code == 0 and result.stdout == ""
    assert "No documentation found in the [docs] paths or at the top level" in result.stderr


def test_version_flag_answers_in_both_paths(capsys: Any) -> None:
    """`ctx --version` / `-V`, as users of other CLIs type it: the thin client answers without the
    service or the full CLI, and the full CLI (the fallback path) answers the same."""
    from ctxlake import __version__
    from ctxlake.serve.service import client

    for flag in ("--version", "-V"):
        assert client.run([flag]) == 0
        assert capsys.readouterr().out == f"ctxlake {__version__}\n"
        result = CliRunner().invoke(app, [flag])
        assert result.exit_code == 0 and result.output == f"ctxlake {__version__}\n"
