"""Calls the server cannot run get one clear message (unknown tool, bad or unknown arguments, a
full or forbidden disk), and the stdio server exits cleanly, every time, when the client closes stdin."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from helpers import write_files
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_helpers import PROJECT, call_error, call_memory_tool

from ctxlake.schemas.config import load_settings
from ctxlake.serve.mcp.server import build_server
from ctxlake.tasks.lake import STORAGE_HINT


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "shop"
    write_files(root, PROJECT)
    (root / ".ctx").mkdir()
    return root


def test_unknown_tool_and_bad_arguments_are_one_clear_line(project: Path) -> None:
    server = build_server(load_settings(project))

    async def main() -> None:
        async with Client(server) as client:
            with pytest.raises(MCPError) as info:
                await client.call_tool("nope", {})
            assert info.value.error.code == -32602
            assert "unknown tool 'nope'" in info.value.error.message
            assert "docs_content" in info.value.error.message  # names the tools there are
            text = await call_error(client, "docs_content", {"path": 5, "chunk": "x"})
            assert text.startswith("invalid arguments for docs_content: path: ")
            assert "chunk: " in text and "(got 'x')" in text
            assert "\n" not in text and "errors.pydantic.dev" not in text, text
            text = await call_error(client, "docs_content", {})
            assert text.startswith("invalid arguments for docs_content: path: field required"), text
            text = await call_error(client, "docs_index", {"sourec": "docs"})
            assert "unknown argument(s) 'sourec'" in text and "takes cursor, source" in text, text
            text = await call_error(client, "docs_content", {"path": "x" * 100_000})
            assert len(text) <= 2_000 and text.endswith("(hint: use a path from docs_index)")  # cut, not echoed whole

    anyio.run(main)



@pytest.mark.parametrize(("code", "words"), [
    (errno.ENOSPC, "the disk is full"),
    (errno.EROFS, "the file system is read-only"),
    (errno.EACCES, "permission denied"),
])
def test_a_full_or_forbidden_disk_is_the_clis_line_as_a_tool_error(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, words: str) -> None:
    # The SDK hid the OSError's text: the agent saw only that save_decision had failed.
    import ctxlake.tasks.knowledge as knowledge

    def refused(path: Path, text: str) -> None:  # fault injection: the disk refuses the record's file
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(knowledge, "write_atomic", refused)
    env = {**os.environ, "HOME": str(tmp_path / "home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}
    result = call_memory_tool(load_settings(project, env=env), "save_decision",
                              {"title": "Keep the lake on local disk", "rationale": "NFS locks misbehave."},
                              allow_writes=True)
    text = result.content[0].text
    assert result.is_error, text
    assert text.startswith(f"Error executing tool save_decision: storage error, {words}: {project}/.ctx/knowledge/decisions/"), text
    assert text.endswith(f"(hint: {STORAGE_HINT})") and "Errno" not in text, text

def test_a_full_or_forbidden_disk_is_the_clis_line_in_a_resource_too(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Resources mapped only ctxlake's own errors: the SDK turned an OSError into a bare "Error
    rendering resource", where a tool says the disk is full and what to do."""
    import ctxlake.serve.api.index_status as index_status

    def refused(settings: object) -> None:  # fault injection: the lake's folder cannot be read
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(project / ".ctx" / "lake"))

    monkeypatch.setattr(index_status, "status", refused)
    server = build_server(load_settings(project))

    async def main() -> None:
        async with Client(server) as client:
            with pytest.raises(MCPError) as info:
                await client.read_resource("ctx://status")
            message = info.value.error.message
            assert message.startswith(f"storage error, permission denied: {project}/.ctx/lake"), message
            assert message.endswith(f"({STORAGE_HINT})") and "Errno" not in message, message

    anyio.run(main)


def _initialize() -> bytes:
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "close-test", "version": "0"}}}
    notice = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    return "".join(json.dumps(m) + "\n" for m in (request, notice, listing)).encode()


def test_stdio_server_exits_cleanly_when_stdin_closes(project: Path, tmp_path: Path) -> None:
    """Closing stdin 20 times after a handshake: exit 0 each time, never a fatal interpreter error."""
    exe = Path(sys.executable).parent / "ctx"
    # CTX_HOME in a fresh folder: no resident service is found, so the server runs in this process.
    env = {**os.environ, "CTX_HOME": str(tmp_path / "home")}
    for run in range(20):
        proc = subprocess.Popen([str(exe), "serve"], cwd=project, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(_initialize())
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]
        assert answers[1]["id"] == 2 and answers[1]["result"]["tools"], answers
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        assert proc.returncode == 0, (run, proc.returncode, stderr[-2000:])
        assert "Fatal Python error" not in stderr and "Traceback" not in stderr, (run, stderr[-2000:])
