"""MCP tools `list_configs` and `get_config` over a project's .ctx/registry/ (through the SDK's in-memory Client)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_helpers import call_error, call_ok

from ctxlake.schemas.config import load_settings
from ctxlake.schemas.registry import ConfigItem
from ctxlake.serve.mcp.server import build_server
from ctxlake.tasks.registry import save_item


def test_list_and_get_config(tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    save_item(tmp_path, ConfigItem(kind="rule", name="py-style", description="Python style", globs=["**/*.py"],
                                   body="Use type hints.\n"))
    save_item(tmp_path, ConfigItem(kind="command", name="review", description="Review the diff", body="Review.\n"))
    server = build_server(load_settings(tmp_path, {"mcp": {"stale_check_s": 0}}, env=dict(os.environ)))

    async def main() -> None:
        async with Client(server) as client:
            listed = await call_ok(client, "list_configs")
            assert [(i["kind"], i["name"]) for i in listed["items"]] == [("command", "review"), ("rule", "py-style")]
            rules = await call_ok(client, "list_configs", {"kind": "rule"})
            assert [i["source"] for i in rules["items"]] == [".ctx/registry/rules/py-style.md"]
            got = await call_ok(client, "get_config", {"name": "py-style"})
            assert got["globs"] == ["**/*.py"] and got["body"] == "Use type hints.\n"
            assert "no registry item" in await call_error(client, "get_config", {"name": "nope"})
            assert "invalid registry name" in await call_error(client, "get_config", {"name": "../etc"})
            assert "unknown kind" in await call_error(client, "list_configs", {"kind": "bogus"})

    anyio.run(main)


def tool_preferences(root: Path) -> dict[str, Any]:
    """The tool_preferences answer for a project, through a server of its own."""
    server = build_server(load_settings(root, {"mcp": {"stale_check_s": 0}}, env=dict(os.environ)))

    async def main() -> dict[str, Any]:
        async with Client(server) as client:
            return await call_ok(client, "tool_preferences")

    return anyio.run(main)


def test_tool_preferences_reports_each_tools_wiring_rules_and_sync_state(tmp_path: Path) -> None:
    import json

    from ctxlake.serve.agents import hook_files
    from ctxlake.tasks.registry import sync

    (tmp_path / ".ctx").mkdir()
    save_item(tmp_path, ConfigItem(kind="rule", name="py-style", description="Python style", body="Use type hints.\n"))
    (tmp_path / ".mcp.json").write_text(json.dumps({"mcpServers": {"ctx": {"command": "ctx", "args": ["serve"]}}}))
    (tmp_path / ".cursor").mkdir()
    (tmp_path / ".cursor" / "mcp.json").write_text(json.dumps({"mcpServers": {"other": {"command": "x"}}}))
    hook_files.install("claude", tmp_path)
    got = tool_preferences(tmp_path)
    tools = {t["tool"]: t for t in got["tools"]}
    assert (tools["claude"]["mcp"], tools["claude"]["hooks"]) == (".mcp.json", "installed")
    assert (tools["cursor"]["mcp"], tools["cursor"]["hooks"]) == ("no", "missing")
    assert (tools["antigravity"]["mcp"], tools["antigravity"]["hooks"]) == ("user-wide only", "none")
    assert all(t["sessions"] == 0 for t in tools.values()) and got["used_most"] == []
    assert [r["name"] for r in got["rules"]] == ["py-style"]
    assert got["registry_stale"], "nothing synced yet: the native files are to be written"
    sync(tmp_path)
    assert tool_preferences(tmp_path)["registry_stale"] == []


def test_tool_preferences_reads_codex_as_toml_and_survives_files_it_cannot_read(tmp_path: Path) -> None:
    # Codex's entry written by hand as a key of [mcp_servers] (no [mcp_servers.ctx] header), and a
    # Gemini settings file that is not UTF-8: the answer reports both, it does not fail on either.
    (tmp_path / ".ctx").mkdir()
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text('[mcp_servers]\nctx = { command = "ctx", args = ["serve"] }\n')
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_bytes(b'{"mcpServers": {"ctx": {"command": "\xff"}}}')
    (tmp_path / ".vscode").mkdir()
    (tmp_path / ".vscode" / "mcp.json").write_text('{"servers": {"ctx": {"command": "ctx"}}}')
    tools = {t["tool"]: t["mcp"] for t in tool_preferences(tmp_path)["tools"]}
    assert tools["codex"] == ".codex/config.toml"
    assert tools["gemini"] == "no"  # unreadable: not registered as far as ctx can tell
    assert tools["copilot"] == ".vscode/mcp.json"

    (tmp_path / ".codex" / "config.toml").write_bytes(b"[mcp_servers.ctx]\ncommand = \"\xff\"\n")
    assert {t["tool"]: t["mcp"] for t in tool_preferences(tmp_path)["tools"]}["codex"] == "no"


@pytest.mark.timeout(120)
def test_tool_preferences_does_not_block_on_fifos_a_cloned_project_holds(tmp_path: Path) -> None:
    # A clone can carry a FIFO where a tool's file is expected; opening one for reading blocks until
    # a writer comes, so an agent's call would never return. Each reads as unreadable instead.
    (tmp_path / ".ctx").mkdir()
    for rel in (".mcp.json", ".codex/config.toml", ".opencode/plugins/ctx-hooks.js", "AGENTS.md",
                ".claude/settings.json"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(tmp_path / rel)
    tools = {t["tool"]: t for t in tool_preferences(tmp_path)["tools"]}
    assert (tools["claude"]["mcp"], tools["claude"]["hooks"]) == ("no", "skipped")  # unread, not known to be missing
    assert (tools["codex"]["mcp"], tools["opencode"]["hooks"], tools["cursor"]["hooks"]) == ("no", "missing", "missing")
