"""`ctx init`: client config files written or merged (never clobbered), Codex only on request, the lake gitignored."""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import write_files
from mcp import Client, StdioServerParameters
from mcp_helpers import PROJECT


@pytest.fixture
def repo(make_repo: Callable[..., Path]) -> Path:
    return make_repo(PROJECT)


@pytest.fixture
def codex_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "codex-home"
    monkeypatch.setenv("CODEX_HOME", str(home))
    return home


def test_default_registers_claude_and_the_clients_the_project_uses(
    repo: Path, cli: Callable[..., Any], codex_home: Path
) -> None:
    write_files(repo, {".vscode/settings.json": "{}\n"})
    result = cli("init", cwd=repo)
    assert result.exit_code == 0, result.stderr
    claude = json.loads((repo / ".mcp.json").read_text())["mcpServers"]["ctx"]
    # A committed file names no folder of this machine: the client starts the server in the project.
    assert claude["type"] == "stdio" and claude["args"] == ["serve"] and str(repo) not in json.dumps(claude)
    assert claude["command"] == "ctx" or Path(claude["command"]).exists()
    vscode = json.loads((repo / ".vscode" / "mcp.json").read_text())
    assert vscode["servers"]["ctx"]["args"] == ["serve", "--root", "${workspaceFolder}"]
    assert not (repo / ".cursor").exists() and not (repo / ".gemini").exists()
    assert not codex_home.exists(), "Codex is only written when asked for by name"
    assert ".ctx/lake/" in (repo / ".gitignore").read_text().splitlines()
    assert (repo / ".ctx" / "config.toml").is_file()
    assert "Claude Code: created" in result.stdout and "VS Code / GitHub Copilot: created" in result.stdout
    assert "Next: `ctx run index`" in result.stdout
    again = cli("init", "--json", cwd=repo)
    changes = json.loads(again.stdout)["changes"]
    assert {c["action"] for c in changes} == {"unchanged"}, changes


def test_merges_into_existing_files_without_clobbering(repo: Path, cli: Callable[..., Any]) -> None:
    other = {"command": "npx", "args": ["-y", "some-server"]}
    write_files(repo, {
        ".mcp.json": json.dumps({"mcpServers": {"other": other}, "extra": [1, 2]}),
        ".gemini/settings.json": json.dumps({"theme": "Dracula", "mcpServers": {"other": other}}),
        ".gitignore": "node_modules/\n.ctx/\n",
    })
    result = cli("init", "--client", "all", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    actions = {c["client"]: c["action"] for c in json.loads(result.stdout)["changes"]}
    assert actions == {"claude": "updated", "cursor": "created", "gemini": "updated", "vscode": "created",
                       "opencode": "created", "codex": "created", "git": "unchanged"}
    claude = json.loads((repo / ".mcp.json").read_text())
    assert claude["mcpServers"]["other"] == other and claude["extra"] == [1, 2] and "ctx" in claude["mcpServers"]
    gemini = json.loads((repo / ".gemini" / "settings.json").read_text())
    assert gemini["theme"] == "Dracula" and gemini["mcpServers"]["other"] == other
    assert gemini["mcpServers"]["ctx"]["args"][-1] == "serve"
    cursor = json.loads((repo / ".cursor" / "mcp.json").read_text())
    assert list(cursor) == ["mcpServers"] and cursor["mcpServers"]["ctx"]["args"][-1] == "${workspaceFolder}"
    opencode = json.loads((repo / "opencode.json").read_text())
    assert opencode["mcp"]["ctx"]["type"] == "local" and opencode["mcp"]["ctx"]["command"][-1] == "serve"
    codex = tomllib.loads((repo / ".codex" / "config.toml").read_text())["mcp_servers"]["ctx"]
    assert codex["args"] == ["serve"] and codex["startup_timeout_sec"] == 30
    for file in (".mcp.json", ".cursor/mcp.json", ".gemini/settings.json", ".vscode/mcp.json", "opencode.json",
                 ".codex/config.toml"):
        assert str(repo) not in (repo / file).read_text(), file
    assert (repo / ".gitignore").read_text() == "node_modules/\n.ctx/\n"  # already covered by .ctx/


def test_merged_files_keep_their_own_layout(
        repo: Path, cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ctx init` wrote every merged file back with 2-space indents: a committed `.vscode/mcp.json`
    indented with tabs (VS Code's default) came back as a diff of every line, and so did a user's
    own 4-space config."""
    home = tmp_path / "user-home"
    monkeypatch.setenv("HOME", str(home))
    other = {"command": "npx", "args": ["-y", "some-server"]}
    tabbed = json.dumps({"servers": {"other": other}, "inputs": []}, indent="\t") + "\n"
    spaced = json.dumps({"mcpServers": {"other": other}, "theme": "dark"}, indent=4)  # no final newline
    write_files(repo, {".vscode/mcp.json": tabbed})
    write_files(home, {".copilot/mcp-config.json": spaced})
    result = cli("init", "--client", "vscode,copilot", "--yes", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    vscode = (repo / ".vscode" / "mcp.json").read_text()
    assert vscode == json.dumps(json.loads(vscode), indent="\t") + "\n"
    assert tabbed.splitlines()[:3] == vscode.splitlines()[:3]  # the user's lines are as they were
    assert "ctx" in json.loads(vscode)["servers"]
    copilot = (home / ".copilot" / "mcp-config.json").read_text()
    assert copilot == json.dumps(json.loads(copilot), indent=4)
    assert list(json.loads(copilot)) == ["mcpServers", "theme"]


def test_a_file_with_comments_is_left_alone(repo: Path, cli: Callable[..., Any]) -> None:
    jsonc = '{\n  // my servers\n  "servers": {}\n}\n'
    write_files(repo, {".vscode/mcp.json": jsonc})
    result = cli("init", "--client", "vscode,claude", cwd=repo)
    assert result.exit_code == 3  # not a success, though the other client was written
    assert (repo / ".vscode" / "mcp.json").read_text() == jsonc
    assert (repo / ".mcp.json").is_file()
    assert "VS Code / GitHub Copilot: skipped" in result.stdout and "not plain JSON (comments?)" in result.stderr
    assert '"ctx": {' in result.stderr  # the entry to paste by hand


def test_a_cut_off_file_is_named_with_its_line(repo: Path, cli: Callable[..., Any]) -> None:
    write_files(repo, {".vscode/mcp.json": '{\n  "servers": "cut off'})
    result = cli("init", "--client", "vscode", cwd=repo)
    assert result.exit_code == 3 and "Unterminated string starting at line 2" in result.stderr, result.stderr
    assert "at at" not in result.stderr


def test_codex_shows_the_change_and_needs_consent(repo: Path, cli: Callable[..., Any], codex_home: Path) -> None:
    codex_home.mkdir()
    config = codex_home / "config.toml"
    original = '# my codex settings\nmodel = "o4"\n\n[mcp_servers.other]\ncommand = "other-server"\n'
    config.write_text(original)
    refused = cli("init", "--client", "codex-user", cwd=repo)
    assert refused.exit_code == 2 and "without --yes" in refused.stderr
    assert "+[mcp_servers.ctx]" in refused.stderr and config.read_text() == original
    done = cli("init", "--client", "codex-user", "--yes", cwd=repo)
    assert done.exit_code == 0, done.stderr
    text = config.read_text()
    assert text.startswith(original) and "# my codex settings" in text
    data = tomllib.loads(text)
    assert data["model"] == "o4" and data["mcp_servers"]["other"] == {"command": "other-server"}
    ctx = data["mcp_servers"]["ctx"]
    assert ctx["args"] == ["serve"] and ctx["startup_timeout_sec"] == 30
    assert "Codex (user-wide): updated" in done.stdout
    assert cli("init", "--client", "codex-user", cwd=repo).exit_code == 0  # unchanged: nothing to ask


def test_copilot_cli_and_antigravity_user_files_carry_ctx_home(
        repo: Path, cli: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "user-home"
    monkeypatch.setenv("HOME", str(home))
    ctx_home = os.environ["CTX_HOME"]
    result = cli("init", "--client", "copilot,antigravity", "--yes", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    copilot = json.loads((home / ".copilot" / "mcp-config.json").read_text())["mcpServers"]["ctx"]
    assert copilot["type"] == "local" and copilot["args"] == ["serve"] and copilot["env"] == {"CTX_HOME": ctx_home}
    antigravity = json.loads((home / ".gemini" / "antigravity" / "mcp_config.json").read_text())["mcpServers"]["ctx"]
    assert antigravity["args"] == ["serve", "--root", str(repo)]  # a user-wide file: the project is named
    vscode = json.loads((repo / ".vscode" / "mcp.json").read_text())["servers"]["ctx"]
    assert vscode["env"] == {"CTX_HOME": ctx_home}


def test_a_commented_codex_project_config_is_merged_keeping_its_comments(repo: Path, cli: Callable[..., Any]) -> None:
    original = '# team settings\nmodel = "o4"  # keep\n'
    write_files(repo, {".codex/config.toml": original})
    assert cli("init", "--client", "codex", cwd=repo).exit_code == 0
    text = (repo / ".codex" / "config.toml").read_text()
    assert text.startswith(original) and tomllib.loads(text)["mcp_servers"]["ctx"]["args"] == ["serve"]


def test_another_tools_ctx_server_in_a_codex_config_is_left_alone(
        repo: Path, cli: Callable[..., Any], codex_home: Path) -> None:
    """As in the JSON clients' files: a `ctx` server that is not ctxlake's (another tool took the
    name) is not replaced; the entry to paste is printed and init exits 3."""
    theirs = '[mcp_servers.ctx]\ncommand = "context-helper"\nargs = ["--stdio"]\n'
    write_files(repo, {".codex/config.toml": theirs})
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(theirs)
    for client, path in (("codex", repo / ".codex" / "config.toml"), ("codex-user", codex_home / "config.toml")):
        result = cli("init", "--client", client, "--yes", cwd=repo)
        assert result.exit_code == 3, (client, result.stdout, result.stderr)
        said = result.stdout + result.stderr
        assert "another server (context-helper --stdio)" in said and "args = [\"serve\"]" in said, said
        assert path.read_text() == theirs
    # An earlier ctx init's entry, with another path to ctx, is ctxlake's own: it is refreshed.
    write_files(repo, {".codex/config.toml": '[mcp_servers.ctx]\ncommand = "/old/bin/ctx"\nargs = ["serve"]\n'})
    assert cli("init", "--client", "codex", cwd=repo).exit_code == 0
    assert tomllib.loads((repo / ".codex" / "config.toml").read_text())["mcp_servers"]["ctx"]["command"] != "/old/bin/ctx"


def test_unknown_client_is_a_usage_error(repo: Path, cli: Callable[..., Any]) -> None:
    result = cli("init", "--client", "emacs", cwd=repo)
    assert result.exit_code == 2 and "unknown client 'emacs'" in result.stderr
    assert not (repo / ".mcp.json").exists()


@pytest.mark.usefixtures("prefect_server")
def test_the_registered_command_starts_a_working_server(
    repo: Path, cli: Callable[..., Any], fake_embedder: Any
) -> None:
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert cli("init", "--client", "claude", cwd=repo).exit_code == 0
    entry = json.loads((repo / ".mcp.json").read_text())["mcpServers"]["ctx"]
    # Launched the way Claude Code does: in the project folder, with the entry's command and arguments only.
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=dict(os.environ),
                                   cwd=str(repo / "src"))

    async def main() -> None:
        async with Client(params) as client:
            result = await client.call_tool("search_code", {"query": "getUserById", "search_type": "keyword"})
            assert not result.is_error and result.structured_content is not None
            assert result.structured_content["hits"][0]["path"] == "src/users/service.py"

    anyio.run(main)


@pytest.mark.timeout(300)
def test_a_client_file_that_is_a_fifo_or_not_utf8_is_one_clear_error(repo: Path, cli: Callable[..., Any]) -> None:
    # A clone may hold a FIFO where a client's file goes: opening it for reading would block forever.
    (repo / ".codex").mkdir()
    os.mkfifo(repo / ".codex" / "config.toml")
    os.mkfifo(repo / ".mcp.json")
    fifo = cli("init", "--client", "codex", cwd=repo)
    assert fifo.exit_code == 2 and "cannot read" in fifo.stderr and "Traceback" not in fifo.stderr
    skipped = cli("init", "--client", "claude", cwd=repo)  # a JSON file: left alone with the entry to paste
    assert skipped.exit_code == 3 and "not a regular file" in skipped.stdout + skipped.stderr

    (repo / ".codex" / "config.toml").unlink()
    (repo / ".codex" / "config.toml").write_bytes(b'model = "\xff"\n')
    latin = cli("init", "--client", "codex", cwd=repo)
    assert latin.exit_code == 2 and "cannot read" in latin.stderr and "Traceback" not in latin.stderr
