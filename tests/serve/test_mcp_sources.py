"""MCP ask_codebase on a bare MCPServer through the SDK's in-memory Client, with a stub agent; no Prefect on this path."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from stub_agent import install_stub, read_record

from ctxlake.schemas import trust
from ctxlake.schemas.config import Settings, load_settings
from ctxlake.schemas.roots import default_home
from ctxlake.schemas.sources import SourceSpec, registry_path, save_source, trust_sources
from ctxlake.serve.mcp.sources import register_source_tools

CONFIG = """[agents]
default_agent = "stub"
sandbox_dir = "{sandboxes}"
pass_env = ["STUB_*"]

[agents.commands]
stub = "stub-agent {{prompt_file}}"
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    bin_dir = tmp_path / "bin"
    install_stub(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STUB_RECORD", str(tmp_path / "record.json"))
    root = tmp_path / "proj"
    (root / ".ctx").mkdir(parents=True)
    (root / ".ctx" / "config.toml").write_text(CONFIG.format(sandboxes=tmp_path / "sandboxes"))
    trust.trust(root / ".ctx" / "config.toml", default_home())  # agent commands need a trusted config
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "tools.md").write_text("# Tools\n\nmake_tool builds a tool.\n")
    spec = SourceSpec(name="notes", type="local", origin=str(notes))
    save_source(root, spec)
    trust_sources(root, default_home(), [spec])  # as `ctx add` does: a folder outside the project
    return load_settings(root)


def call(settings: Settings, allow: bool, tool: str | None, args: dict[str, Any]) -> tuple[list[str], Any]:
    from mcp import Client
    from mcp.server import MCPServer

    async def go() -> tuple[list[str], Any]:
        server = MCPServer("test")
        register_source_tools(server, settings, allow_agents=allow)
        async with Client(server) as client:
            names = [t.name for t in (await client.list_tools()).tools]
            result = await client.call_tool(tool, args) if tool else None
        return names, result

    return asyncio.run(go())


def test_ask_codebase_only_with_allow_agents(project: Settings) -> None:
    assert call(project, False, None, {})[0] == []
    names, _ = call(project, True, None, {})
    assert names == ["ask_codebase"]


def test_ask_codebase_runs_the_agent_in_a_sandbox(project: Settings, tmp_path: Path) -> None:
    _, result = call(project, True, "ask_codebase", {"question": "How is a tool built?", "sources": ["notes"]})
    assert not result.is_error, result.content
    answer = result.structured_content
    assert answer["agent"] == "stub" and answer["sources"] == ["notes"] and answer["exit_code"] == 0
    assert answer["answer"].strip() == "ANSWER from stub: see notes"
    seen = read_record(tmp_path / "record.json")
    assert seen["links"]["notes"]["files"] == ["tools.md"]
    assert seen["configs"][".mcp.json"] == {"mcpServers": {}}
    assert "How is a tool built?" in seen["prompt"]
    assert not Path(seen["cwd"]).exists()


@pytest.mark.parametrize(("args", "env", "message"), [
    ({"question": "q", "sources": ["nope"]}, {}, "unknown source(s): nope"),
    ({"question": "  ", "sources": ["notes"]}, {}, "empty question"),
    ({"question": "q", "sources": ["notes"]}, {"STUB_MODE": "fail"}, "exited with 3: stub: model quota exceeded"),
    ({"question": "q", "sources": ["notes"], "agent": "gemini"}, {"PATH": "/nonexistent"}, "runs `gemini`, which is not on PATH"),
])
def test_ask_codebase_errors_are_tool_errors(project: Settings, monkeypatch: pytest.MonkeyPatch,
                                             args: dict[str, Any], env: dict[str, str], message: str) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _, result = call(project, True, "ask_codebase", args)
    assert result.is_error
    assert message in result.content[0].text


def test_mcp_ask_path_never_imports_prefect(project: Settings, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        from pathlib import Path
        from mcp import Client
        from mcp.server import MCPServer
        from ctxlake.schemas.config import load_settings
        from ctxlake.serve.mcp.sources import register_source_tools

        async def main():
            server = MCPServer("t")
            register_source_tools(server, load_settings(Path({str(project.root)!r})), allow_agents=True)
            async with Client(server) as client:
                result = await client.call_tool("ask_codebase", {{"question": "q", "sources": ["notes"]}})
            print(json.dumps({{"error": result.is_error, "prefect": "prefect" in sys.modules}}))

        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "CTX_HOME": str(project.home)})  # where the config is trusted
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"error": False, "prefect": False}


def test_an_untrusted_outside_folder_is_never_linked_into_a_sandbox(project: Settings) -> None:
    from ctxlake.errors import ConfigError
    from ctxlake.serve.api.source_queries import resolve_links

    assert [link.name for link in resolve_links(project, None)] == ["project", "notes"]
    trust.revoke_sources(registry_path(project.root), project.home)  # as a clone's sources.toml is
    assert [link.name for link in resolve_links(project, None)] == ["project"]
    with pytest.raises(ConfigError, match="not trusted"):
        resolve_links(project, ["notes"])
