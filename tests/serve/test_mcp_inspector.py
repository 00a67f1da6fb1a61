"""The MCP Inspector CLI (pinned @modelcontextprotocol/inspector@2.12.0, via npx) against `ctx serve` over stdio."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp_helpers import PROJECT

pytestmark = [pytest.mark.network_tools, pytest.mark.usefixtures("prefect_server")]

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
CTX = str(Path(sys.executable).parent / "ctx")


@pytest.fixture(scope="module")
def npx_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Install the pinned Inspector once (npx cache); skip, saying why, only when npm is unreachable."""
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("SKIPPED LOUDLY: npx is not on PATH, so the MCP Inspector CLI test cannot run")
    state = tmp_path_factory.mktemp("inspector")
    # The Inspector writes a catalog and client config under ~ by default: keep them in tmp.
    env = {**os.environ, "MCP_CATALOG_PATH": str(state / "catalog.json"),
           "MCP_CLIENT_CONFIG_PATH": str(state / "client.json")}
    probe = subprocess.run([npx, "-y", INSPECTOR, "--cli", "--version"], capture_output=True, text=True,
                           timeout=600, env=env)
    if probe.returncode != 0:
        ping = subprocess.run(["npm", "ping"], capture_output=True, text=True, timeout=60, env=env)
        if ping.returncode != 0:
            pytest.skip(f"SKIPPED LOUDLY: the npm registry is unreachable, so {INSPECTOR} cannot be "
                        f"installed: {(ping.stderr or ping.stdout).strip()[-300:]}")
        pytest.fail(f"npx {INSPECTOR} failed although npm is reachable: {probe.stderr[-1500:]}")
    return env


def inspect(env: dict[str, str], repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    server_env = [f"-e{key}={env[key]}" for key in ("CTX_HOME", "CTX_EMBED_PROVIDER", "CTX_EMBED_MODEL")]
    return subprocess.run(
        ["npx", "-y", INSPECTOR, "--cli", *server_env, CTX, "serve", "--root", str(repo), *args],
        capture_output=True, text=True, timeout=300, env=env,
    )


def test_inspector_lists_and_calls_tools(
    npx_env: dict[str, str], make_repo: Callable[..., Path], cli: Callable[..., Any], fake_embedder: Any
) -> None:
    repo = make_repo(PROJECT)
    assert cli("run", "index", cwd=repo).exit_code == 0
    env = {**npx_env, **{k: v for k, v in os.environ.items() if k.startswith("CTX_")}}

    listed = inspect(env, repo, "--method", "tools/list")
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert {"search_code", "find_files", "fuzzy_find", "get_file_context", "get_stale_status", "list_sources",
            "docs_index", "docs_content", "search_context", "recent_sessions", "session_detail",
            "project_knowledge", "handoff_brief", "find_definition", "find_references", "related_files",
            "file_outline", "list_configs", "get_config", "tool_preferences"} == names

    called = inspect(env, repo, "--method", "tools/call", "--tool-name", "search_code",
                     "--tool-arg", "query=getUserById", "--tool-arg", "search_type=keyword", "--format", "json")
    assert called.returncode == 0, called.stderr[-2000:]
    result = json.loads(called.stdout)["result"]
    assert result["structuredContent"]["hits"][0]["path"] == "src/users/service.py"

    unknown = inspect(env, repo, "--method", "tools/call", "--tool-name", "no_such_tool")
    assert unknown.returncode != 0, (unknown.stdout, unknown.stderr[-1000:])  # a protocol error now
    assert "no_such_tool" in unknown.stdout + unknown.stderr

    refused = inspect(env, repo, "--method", "tools/call", "--tool-name", "docs_content",
                      "--tool-arg", "path=../../../etc/passwd")
    assert refused.returncode == 5 and "path traversal not allowed" in refused.stdout
