"""`ctx hooks install|uninstall` and `ctx init` on hostile or odd project files: symlinks that lead out of the
project, a user's hook beside ours, a section marker without its end, FIFOs and folders where files go, the home
folder, values of the wrong type, and another tool's server named `ctx`. Each ends in a clear line, never a
write outside the project, a lost user line or a traceback."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import write_files

Cli = Callable[..., Any]


@pytest.fixture
def repo(make_repo: Callable[..., Path]) -> Path:
    return make_repo({"README.md": "# app\n"}, name="proj")


def test_init_keeps_symlinked_client_files_and_gitignore_as_links(repo: Path, tmp_path: Path, cli: Cli) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "g.json").write_text('{"a": 1}\n')
    (outside / "gi").write_text("node_modules/\n")
    (repo / ".gemini").mkdir()
    (repo / ".gemini" / "settings.json").symlink_to(outside / "g.json")
    (repo / ".gitignore").symlink_to(outside / "gi")
    result = cli("init", "--client", "gemini", "--json", cwd=repo)
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    changes = {c["client"]: c for c in json.loads(result.stdout)["changes"]}
    assert changes["gemini"]["action"] == "skipped" and '"ctx"' in changes["gemini"]["paste"]
    assert changes["git"]["action"] == "skipped" and changes["git"]["paste"] == ".ctx/lake/"
    assert (repo / ".gemini" / "settings.json").is_symlink() and (repo / ".gitignore").is_symlink()
    assert (outside / "g.json").read_text() == '{"a": 1}\n' and (outside / "gi").read_text() == "node_modules/\n"


@pytest.mark.timeout(120)
def test_a_fifo_gitignore_and_odd_user_wide_copilot_files_are_skipped_not_a_hang(
        repo: Path, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    os.mkfifo(repo / ".gitignore")
    result = cli("init", "--client", "claude", cwd=repo)
    assert result.exit_code == 3 and "not a regular file" in result.stderr and "Traceback" not in result.stderr
    (repo / ".gitignore").unlink()
    home = tmp_path / "user-home"
    config = home / ".copilot" / "mcp-config.json"
    config.parent.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for make, says in ((os.mkfifo, "not a regular file"), (Path.mkdir, "not a regular file"),
                       (lambda p: p.write_bytes(b"\xff\xfe{}"), "can't decode")):
        make(config)
        result = cli("init", "--client", "copilot-cli", "--yes", cwd=repo)
        assert result.exit_code == 3 and says in result.stderr and "Traceback" not in result.stderr, result.stderr
        assert '"ctx"' in result.stderr  # the entry to paste
        config.rmdir() if config.is_dir() else config.unlink()


def test_a_codex_ctx_entry_that_is_no_table_is_a_one_line_error(repo: Path, cli: Cli) -> None:
    for value in ("5", '"abc"'):
        write_files(repo, {".codex/config.toml": f"[mcp_servers]\nctx = {value}\n"})
        result = cli("init", "--client", "codex", cwd=repo)
        assert result.exit_code == 2 and "mcp_servers.ctx is not a table" in result.stderr, result.stderr
        assert "[mcp_servers.ctx]" in result.stderr  # the table to paste


def test_a_file_where_a_client_folder_goes_is_skipped_by_init_with_the_paste(repo: Path, cli: Cli) -> None:
    (repo / ".cursor").write_text("notes\n")
    (repo / ".codex").write_text("notes\n")
    init = cli("init", "--client", "cursor,codex", cwd=repo)
    assert init.exit_code == 3 and "Traceback" not in init.stderr
    assert ".cursor is not a folder" in init.stderr and ".codex is not a folder" in init.stderr
    assert '"mcpServers"' in init.stderr and "[mcp_servers.ctx]" in init.stderr
    assert (repo / ".cursor").read_text() == (repo / ".codex").read_text() == "notes\n"


def test_init_leaves_another_tools_ctx_server_alone_but_refreshes_its_own(repo: Path, cli: Cli) -> None:
    other = {"mcpServers": {"ctx": {"command": "/opt/other-ctx-tool"}}}
    write_files(repo, {".mcp.json": json.dumps(other)})
    result = cli("init", "--client", "claude", cwd=repo)
    assert result.exit_code == 3 and "is another server (/opt/other-ctx-tool)" in result.stderr
    assert json.loads((repo / ".mcp.json").read_text()) == other
    # An entry an earlier `ctx init` wrote with this machine's path is ctx's own: init brings it up to date.
    old = {"mcpServers": {"ctx": {"type": "stdio", "command": "/opt/venv/bin/ctx", "args": ["serve"]}}}
    write_files(repo, {".mcp.json": json.dumps(old)})
    assert cli("init", "--client", "claude", cwd=repo).exit_code == 0
    assert json.loads((repo / ".mcp.json").read_text())["mcpServers"]["ctx"] != old["mcpServers"]["ctx"]
