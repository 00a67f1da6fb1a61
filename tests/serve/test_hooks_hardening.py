"""`ctx hooks install|uninstall` and `ctx init` on hostile or odd project files: symlinks that lead out of the
project, a user's hook beside ours, a section marker without its end, FIFOs and folders where files go, the home
folder, values of the wrong type, and another tool's server named `ctx`. Each ends in a clear line, never a
write outside the project, a lost user line or a traceback. A settings file in the user's own layout (4 spaces,
tabs, one line, CRLF) keeps it: a committed file shows only ctx's lines in its diff."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import write_files

from ctxlake.serve.agents import hook_files

Cli = Callable[..., Any]


@pytest.fixture
def repo(make_repo: Callable[..., Path]) -> Path:
    return make_repo({"README.md": "# app\n"}, name="proj")


def test_a_symlinked_tool_folder_leads_nowhere_outside_the_project(repo: Path, tmp_path: Path, cli: Cli) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "settings.json").write_text('{"theme":"dark"}\n')
    (repo / ".claude").symlink_to(outside)
    result = cli("hooks", "install", "--client", "claude", cwd=repo)
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    assert f"{repo / '.claude'} is a symlink out of the project; ctx does not read it" in result.stderr
    assert "session-start --client claude" in result.stderr  # the entry to add by hand
    assert (outside / "settings.json").read_text() == '{"theme":"dark"}\n'
    # Nothing ctx wrote can be out there, so uninstall has nothing to do and says why it did not look.
    result = cli("hooks", "uninstall", "--client", "claude", "--json", cwd=repo)
    assert result.exit_code == 0
    [change] = json.loads(result.stdout)["changes"]
    assert change["action"] == "skipped" and "symlink out of the project" in change["detail"]


def test_hook_files_that_link_out_of_the_project_are_not_read_by_install_or_uninstall(
        repo: Path, tmp_path: Path, cli: Cli) -> None:
    """Before, install read the linked file first: one already holding ctx's hooks read as "unchanged" (exit 0),
    and uninstall parsed whatever it found before refusing to write through the link."""
    other = tmp_path / "other"
    other.mkdir()
    assert cli("hooks", "install", "--client", "claude,opencode", cwd=other).exit_code == 0
    for rel in (".claude/settings.json", ".opencode/plugins/ctx-hooks.js", "AGENTS.md"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).symlink_to(other / rel)
    before = {rel: (other / rel).read_bytes() for rel in (".claude/settings.json", "AGENTS.md")}
    result = cli("hooks", "install", "--client", "claude,opencode", "--json", cwd=repo)
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    changes = json.loads(result.stdout)["changes"]
    assert {c["action"] for c in changes} == {"skipped"}
    assert all("symlink out of the project; ctx does not read it" in c["detail"] for c in changes)
    result = cli("hooks", "uninstall", "--client", "claude,opencode", "--json", cwd=repo)
    assert result.exit_code == 0, result.stderr
    changes = json.loads(result.stdout)["changes"]
    assert len(changes) == 3 and {c["action"] for c in changes} == {"skipped"}
    assert {rel: (other / rel).read_bytes() for rel in before} == before  # the other project keeps its hooks


def test_status_skips_a_hook_file_it_cannot_parse_instead_of_calling_the_hooks_missing(repo: Path, cli: Cli) -> None:
    assert cli("hooks", "install", "--client", "gemini", cwd=repo).exit_code == 0
    settings = repo / ".gemini" / "settings.json"
    settings.write_text("// the user's note\n" + settings.read_text())  # JSONC: Gemini reads it, ctx cannot merge it
    result = cli("hooks", "status", "--client", "gemini", "--json", cwd=repo)
    [change] = json.loads(result.stdout)["changes"]
    assert change["action"] == "skipped" and "not plain JSON" in change["detail"]


def test_a_symlinked_instruction_file_stays_a_link_to_the_file_it_names(repo: Path, cli: Cli) -> None:
    (repo / "CLAUDE.md").write_text("# Claude\n")
    (repo / "AGENTS.md").symlink_to("CLAUDE.md")
    result = cli("hooks", "install", "--client", "cursor", cwd=repo)
    assert result.exit_code == 3 and "AGENTS.md is a symlink" in result.stderr
    assert hook_files.SECTION_END in result.stderr  # the section to paste
    assert (repo / "AGENTS.md").is_symlink() and (repo / "CLAUDE.md").read_text() == "# Claude\n"


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


def test_init_reads_no_client_file_or_gitignore_that_links_out_of_the_project(
        repo: Path, tmp_path: Path, cli: Cli) -> None:
    """Before, init read them first: a linked .gitignore that already ignored the lake answered "unchanged"."""
    from ctxlake.serve.agents.clients import registered_file

    other = tmp_path / "other"
    other.mkdir()
    assert cli("init", "--client", "claude,codex,gemini", cwd=other).exit_code == 0
    files = (".mcp.json", ".codex/config.toml", ".gemini/settings.json", ".gitignore")
    for rel in files:
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).symlink_to(other / rel)
    before = {rel: (other / rel).read_bytes() for rel in files}
    result = cli("init", "--client", "claude,codex,gemini", "--json", cwd=repo)
    assert result.exit_code == 3 and "Traceback" not in result.stderr
    changes = {c["client"]: c for c in json.loads(result.stdout)["changes"]}
    for client in ("claude", "codex", "gemini", "git"):
        assert changes[client]["action"] == "skipped", changes[client]
        assert "symlink out of the project; ctx does not read it" in changes[client]["detail"]
        assert changes[client]["paste"]
    assert {rel: (other / rel).read_bytes() for rel in files} == before
    # What tool_preferences shows: the other project's registrations are not read as this one's.
    assert [registered_file(other, c) for c in ("claude", "codex", "gemini")] == [".mcp.json", ".codex/config.toml",
                                                                                 ".gemini/settings.json"]
    assert [registered_file(repo, c) for c in ("claude", "codex", "gemini")] == [None, None, None]


def test_uninstall_keeps_a_hook_the_user_added_to_ctxs_own_group(repo: Path, cli: Cli) -> None:
    assert cli("hooks", "install", "--client", "claude", cwd=repo).exit_code == 0
    settings = repo / ".claude" / "settings.json"
    data = json.loads(settings.read_text())
    mine = {"type": "command", "command": "./scripts/setup-env.sh"}
    data["hooks"]["SessionStart"][0]["hooks"].append(mine)
    settings.write_text(json.dumps(data))
    # A second install replaces only ctx's inner hook; the user's stays where they put it.
    assert cli("hooks", "install", "--client", "claude", cwd=repo).exit_code == 0
    starts = json.loads(settings.read_text())["hooks"]["SessionStart"]
    assert [h for group in starts for h in group["hooks"]].count(mine) == 1
    assert cli("hooks", "uninstall", "--client", "claude", cwd=repo).exit_code == 0
    assert json.loads(settings.read_text()) == {
        "hooks": {"SessionStart": [{"matcher": "startup|resume|clear|compact", "hooks": [mine]}]}}


def test_a_start_marker_without_its_end_is_refused_and_the_lines_after_it_survive(repo: Path, cli: Cli) -> None:
    text = f"# Agents\nIntro.\n{hook_files.SECTION_START}\n## My rules\nNever push to main.\n"
    (repo / "AGENTS.md").write_text(text)
    installed = cli("hooks", "install", "--client", "cursor", cwd=repo)
    assert installed.exit_code == 3 and "markers do not make one section" in installed.stderr
    removed = cli("hooks", "uninstall", "--client", "cursor", cwd=repo)
    assert removed.exit_code == 3 and "by hand" in removed.stderr
    assert (repo / "AGENTS.md").read_text() == text
    # Two sections (a bad merge) are not guessed at either.
    twice = f"{hook_files.SECTION_START}\na\n{hook_files.SECTION_END}\nmine\n{hook_files.SECTION_START}\nb\n{hook_files.SECTION_END}\n"
    (repo / "AGENTS.md").write_text(twice)
    assert cli("hooks", "uninstall", "--client", "cursor", cwd=repo).exit_code == 3
    assert (repo / "AGENTS.md").read_text() == twice


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


def test_hooks_refuse_the_home_folder_unless_allowed(tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for verb in ("install", "uninstall"):
        result = cli("hooks", verb, "--client", "claude,cursor", cwd=home)
        assert result.exit_code == 2 and "it is your home folder" in result.stderr and "--allow-home" in result.stderr
    assert sorted(p.name for p in home.iterdir()) == []
    assert cli("hooks", "install", "--client", "claude", "--allow-home", cwd=home).exit_code == 0
    assert (home / ".claude" / "settings.json").is_file()


def test_a_hook_group_whose_hooks_is_no_list_is_left_as_it_is(repo: Path, cli: Cli) -> None:
    write_files(repo, {".claude/settings.json": '{"hooks": {"SessionStart": [{"hooks": 5}]}}'})
    for verb in ("install", "status", "uninstall"):
        result = cli("hooks", verb, "--client", "claude", cwd=repo)
        assert result.exit_code == 0 and "Traceback" not in result.stderr, (verb, result.stderr)
    assert json.loads((repo / ".claude" / "settings.json").read_text()) == {"hooks": {"SessionStart": [{"hooks": 5}]}}


def test_a_codex_ctx_entry_that_is_no_table_is_a_one_line_error(repo: Path, cli: Cli) -> None:
    for value in ("5", '"abc"'):
        write_files(repo, {".codex/config.toml": f"[mcp_servers]\nctx = {value}\n"})
        result = cli("init", "--client", "codex", cwd=repo)
        assert result.exit_code == 2 and "mcp_servers.ctx is not a table" in result.stderr, result.stderr
        assert "[mcp_servers.ctx]" in result.stderr  # the table to paste


def test_a_file_where_a_tool_folder_goes_is_skipped_by_hooks_install_with_the_paste(repo: Path, cli: Cli) -> None:
    (repo / ".claude").write_text("notes\n")
    hooks = cli("hooks", "install", "--client", "claude", cwd=repo)
    assert hooks.exit_code == 3 and ".claude is not a folder" in hooks.stderr and "Traceback" not in hooks.stderr
    assert '"SessionStart"' in hooks.stderr and (repo / ".claude").read_text() == "notes\n"


def test_a_file_where_a_client_folder_goes_is_skipped_by_init_with_the_paste(repo: Path, cli: Cli) -> None:
    (repo / ".cursor").write_text("notes\n")
    (repo / ".codex").write_text("notes\n")
    init = cli("init", "--client", "cursor,codex", cwd=repo)
    assert init.exit_code == 3 and "Traceback" not in init.stderr
    assert ".cursor is not a folder" in init.stderr and ".codex is not a folder" in init.stderr
    assert '"mcpServers"' in init.stderr and "[mcp_servers.ctx]" in init.stderr
    assert (repo / ".cursor").read_text() == (repo / ".codex").read_text() == "notes\n"


def test_json_output_lists_the_file_that_could_not_be_merged_with_its_paste(repo: Path, cli: Cli) -> None:
    write_files(repo, {".claude/settings.json": "[1]\n"})
    result = cli("hooks", "install", "--client", "claude,codex", "--json", cwd=repo)
    assert result.exit_code == 3
    changes = {c["client"]: c for c in json.loads(result.stdout)["changes"]}
    assert changes["codex"]["action"] == "created"
    assert changes["claude"]["action"] == "skipped" and changes["claude"]["path"].endswith(".claude/settings.json")
    assert "session-start --client claude" in json.loads(changes["claude"]["paste"])["hooks"]["SessionStart"][0][
        "hooks"][0]["command"]


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


USER_SETTINGS: dict[str, Any] = {
    "permissions": {"allow": ["Bash(git status)"], "deny": []},
    "hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "./lint.sh"}]}]},
    "env": {"GREETING": "café"},
}
LAYOUTS: dict[str, tuple[dict[str, Any], str, str]] = {  # json.dumps arguments, line ending, end of file
    "4 spaces": ({"indent": 4, "ensure_ascii": False}, "\n", "\n"),
    "tabs": ({"indent": "\t", "ensure_ascii": False}, "\n", "\n"),
    "one compact line, no final newline": ({"separators": (",", ":"), "ensure_ascii": False}, "\n", ""),
    "one line with spaces": ({"ensure_ascii": False}, "\n", "\n"),
    "CRLF and \\u escapes": ({"indent": 2, "ensure_ascii": True}, "\r\n", "\r\n"),
}


def _laid_out(data: dict[str, Any], layout: str) -> bytes:
    kwargs, newline, end = LAYOUTS[layout]
    return (json.dumps(data, **kwargs).replace("\n", newline) + end).encode()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_install_keeps_the_settings_files_layout_and_uninstall_gives_back_its_bytes(
        repo: Path, cli: Cli, layout: str) -> None:
    settings = repo / ".claude" / "settings.json"
    original = _laid_out(USER_SETTINGS, layout)
    write_files(repo, {".claude/settings.json": original})
    assert cli("hooks", "install", "--client", "claude", cwd=repo).exit_code == 0
    installed = settings.read_bytes()
    data = json.loads(installed)
    assert list(data) == ["permissions", "hooks", "env"]  # key order as it was
    assert list(data["hooks"]) == ["PreToolUse", "SessionStart", "SessionEnd"]
    assert installed == _laid_out(data, layout)
    assert cli("hooks", "uninstall", "--client", "claude", cwd=repo).exit_code == 0
    assert settings.read_bytes() == original


def test_a_new_or_empty_hook_file_gets_two_spaces_and_a_final_newline(repo: Path, cli: Cli) -> None:
    write_files(repo, {".claude/settings.json": "{}"})
    assert cli("hooks", "install", "--client", "claude,codex", cwd=repo).exit_code == 0
    for file in (".claude/settings.json", ".codex/hooks.json"):
        text = (repo / file).read_text()
        assert text == json.dumps(json.loads(text), indent=2) + "\n"


def _status(cli: Cli, repo: Path, clients: str) -> dict[str, dict[str, Any]]:
    result = cli("hooks", "status", "--client", clients, "--json", cwd=repo)
    assert result.exit_code == 0 and "Traceback" not in result.stderr, result.stderr
    return {c["client"]: c for c in json.loads(result.stdout)["changes"]}


def test_status_does_not_read_hook_files_that_link_out_of_the_project(
        repo: Path, tmp_path: Path, make_repo: Callable[..., Path], cli: Cli) -> None:
    # Files outside that hold ctx's hooks: read through the links, status would call them installed.
    other = make_repo({"README.md": "# other\n"}, name="other")
    assert cli("hooks", "install", "--client", "claude,cursor,opencode", cwd=other).exit_code == 0
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").symlink_to(other / ".claude" / "settings.json")
    (repo / ".cursor").symlink_to(other / ".cursor")
    (repo / "AGENTS.md").symlink_to(other / "AGENTS.md")
    (repo / ".opencode" / "plugins").mkdir(parents=True)
    (repo / ".opencode" / "plugins" / "ctx-hooks.js").symlink_to(other / ".opencode" / "plugins" / "ctx-hooks.js")
    status = _status(cli, repo, "claude,cursor,opencode")
    link = "is a symlink out of the project; ctx does not read it"
    assert status["claude"]["action"] == "skipped"
    assert status["claude"]["detail"] == f"{repo / '.claude' / 'settings.json'} {link}"
    assert status["cursor"]["action"] == "skipped" and status["cursor"]["detail"].startswith(f"{repo / '.cursor'} {link}")
    assert status["opencode"]["action"] == "skipped"
    assert status["opencode"]["detail"] == f"{repo / '.opencode' / 'plugins' / 'ctx-hooks.js'} {link}; " \
        f"AGENTS.md section: not read ({repo / 'AGENTS.md'} {link})"
    assert status["claude"]["events"] == status["opencode"]["events"] == []
    # A link inside the project is read, as the tool reads it: a section pasted by hand into CLAUDE.md counts.
    (repo / "AGENTS.md").unlink()
    (repo / "CLAUDE.md").write_text(hook_files._section())
    (repo / "AGENTS.md").symlink_to("CLAUDE.md")
    assert _status(cli, repo, "opencode")["opencode"]["detail"].endswith("AGENTS.md section: yes")


@pytest.mark.timeout(60)
def test_status_on_a_fifo_in_or_out_of_the_project_answers_without_a_hang(repo: Path, tmp_path: Path, cli: Cli) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (repo / ".claude").mkdir()
    (repo / ".claude" / "settings.json").symlink_to(fifo)
    os.mkfifo(repo / "AGENTS.md")
    status = _status(cli, repo, "claude,cursor")
    assert status["claude"] == {**status["claude"], "action": "skipped",
                                "detail": f"{repo / '.claude' / 'settings.json'} is a symlink out of the project; "
                                          "ctx does not read it"}
    assert status["cursor"]["action"] == "missing" and status["cursor"]["detail"].endswith("AGENTS.md section: no")
