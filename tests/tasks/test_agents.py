"""Subagent sandboxes with a real stub agent process: what it sees, timeouts, output caps, cleanup and sweeping."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from stub_agent import install_stub, read_record

from ctxlake.errors import AgentError, InputError
from ctxlake.schemas.config import AgentsSettings
from ctxlake.tasks.agents import (
    MARKER_FILE,
    PromptHit,
    SourceLink,
    ask_agent,
    build_prompt,
    chat_agent,
    make_sandbox,
    sweep_leftovers,
)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    bin_dir = tmp_path / "bin"
    install_stub(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record = tmp_path / "record.json"
    monkeypatch.setenv("STUB_RECORD", str(record))
    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "pkg" / "tools.py").write_text("def make_tool(name):\n    return name\n")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "ideas.md").write_text("# Ideas\n")
    return {"record": record, "lib": lib, "notes": notes, "sandboxes": tmp_path / "sandboxes"}


def agents(env: dict[str, Path], **kw: object) -> AgentsSettings:
    commands = {"stub": "stub-agent {prompt_file} --mcp-config {mcp_config}", **kw.pop("commands", {})}  # type: ignore[dict-item]
    kw.setdefault("pass_env", ["STUB_*"])  # the stub's own switches, passed like any extra name
    return AgentsSettings(default_agent="stub", sandbox_dir=env["sandboxes"], commands=commands, **kw)  # type: ignore[arg-type]


def links(env: dict[str, Path]) -> list[SourceLink]:
    return [SourceLink("lib", "git", "file:///x/lib.git", "abc123", env["lib"]),
            SourceLink("notes", "local", str(env["notes"]), None, env["notes"])]


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger where PID 1 does not reap)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


HITS = [PromptHit("lib", "pkg/tools.py", 1, 2, "make_tool", "def make_tool(name):\n    return name\n")]


def test_agent_sees_only_linked_sources_empty_configs_and_the_prompt(env: dict[str, Path]) -> None:
    run = ask_agent.fn("How do I make a tool?", links(env), HITS, agents(env))
    assert run.exit_code == 0, run.stderr
    assert run.stdout.strip() == "ANSWER from stub: see lib, notes"
    seen = read_record(env["record"])
    sandbox = Path(seen["cwd"])
    assert sandbox.parent == env["sandboxes"] and sandbox.name.startswith("ctx-")
    assert seen["links"] == {
        "lib": {"is_symlink": True, "target": str(env["lib"].resolve()), "files": ["pkg/tools.py"]},
        "notes": {"is_symlink": True, "target": str(env["notes"].resolve()), "files": ["ideas.md"]},
    }
    assert seen["configs"] == {
        ".mcp.json": {"mcpServers": {}}, ".gemini/settings.json": {"mcpServers": {}},
        ".cursor/mcp.json": {"mcpServers": {}}, "mcp-config.json": {"mcpServers": {}},
        "opencode.json": {"$schema": "https://opencode.ai/config.json", "mcp": {}},
    }
    assert seen["argv"] == [str(sandbox / "prompt.md"), "--mcp-config", str(sandbox / "mcp-config.json")]
    assert seen["stdin_is_tty"] is False
    prompt = seen["prompt"]
    assert prompt.startswith("# Question\n\nHow do I make a tool?\n")
    assert "| lib | git | file:///x/lib.git | abc123 |" in prompt and "| notes | local |" in prompt
    assert "## 1. lib/pkg/tools.py:1-2 (make_tool)" in prompt and "def make_tool(name):" in prompt
    assert run.hits_in_prompt == 1
    # Cleaned up: the sandbox is gone, the sources it linked are intact.
    assert not sandbox.exists()
    assert (env["lib"] / "pkg" / "tools.py").is_file() and (env["notes"] / "ideas.md").is_file()


def test_agent_gets_a_filtered_environment(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {"AWS_SECRET_ACCESS_KEY": "aws-secret", "GITHUB_TOKEN": "ghp_x", "DATABASE_URL": "postgres://u:p@h/db"}
    kept = {"ANTHROPIC_API_KEY": "sk-ant", "CLAUDE_CONFIG_DIR": "/c", "OPENAI_API_KEY": "sk-o",
            "GEMINI_API_KEY": "g", "GOOGLE_CLOUD_PROJECT": "p", "HTTPS_PROXY": "http://proxy:3128",
            "no_proxy": "localhost", "SSL_CERT_FILE": "/ca.pem", "NODE_EXTRA_CA_CERTS": "/ca.pem",
            "LC_ALL": "C.UTF-8", "HOME": str(env["lib"].parent), "MY_TEAM_FLAG": "on"}
    for key, value in {**secrets, **kept}.items():
        monkeypatch.setenv(key, value)
    run = ask_agent.fn("q", links(env), [], agents(env, pass_env=["STUB_*", "MY_TEAM_FLAG"]))
    assert run.exit_code == 0, run.stderr
    seen = read_record(env["record"])["env"]
    assert not set(secrets) & set(seen)
    assert {k: seen.get(k) for k in kept} == kept
    assert seen["PATH"] == os.environ["PATH"]
    # Without the extra name it is not passed.
    ask_agent.fn("q", links(env), [], agents(env))
    assert "MY_TEAM_FLAG" not in read_record(env["record"])["env"]


def test_chat_hands_the_agent_the_environment_ask_does(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_x")
    monkeypatch.setenv("MY_TEAM_FLAG", "on")
    settings = agents(env, pass_env=["STUB_*", "MY_TEAM_FLAG"], chat_commands={"stub": "stub-agent {prompt_file}"})
    assert ask_agent.fn("q", links(env), [], settings).exit_code == 0
    asked = read_record(env["record"])["env"]
    assert chat_agent(links(env), settings) == 0
    chatted = read_record(env["record"])["env"]
    assert chatted == asked and "GITHUB_TOKEN" not in chatted and chatted["MY_TEAM_FLAG"] == "on"
    # An environment handed in replaces this process's, filtered the same way.
    assert chat_agent(links(env), settings, environ={**os.environ, "MY_TEAM_FLAG": "off"}) == 0
    assert read_record(env["record"])["env"] == {**asked, "MY_TEAM_FLAG": "off"}


def test_background_jobs_end_with_the_agent_and_the_prompt_claims_no_read_only(env: dict[str, Path],
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_MODE", "background")
    started = time.monotonic()
    run = ask_agent.fn("q", links(env), [], agents(env))
    assert run.exit_code == 0 and "ANSWER from stub" in run.stdout
    assert time.monotonic() - started < 15  # not held by the job's copy of the output pipes
    seen = read_record(env["record"])
    assert not running(seen["grandchild"])
    # The links are plain symlinks: an agent can write through them, so the prompt asks it not
    # to and claims nothing more (README, "Asking an agent", says what is and is not isolated).
    assert (env["notes"] / "written-by-agent.txt").is_file()
    assert "read-only" not in seen["prompt"] and "do not create, change or delete anything" in seen["prompt"]


def test_timeout_kills_the_agent_and_its_children(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_MODE", "sleep")
    started = time.monotonic()
    with pytest.raises(AgentError, match="did not answer within 2 s"):
        ask_agent.fn("q", links(env), [], agents(env), timeout_s=2)
    assert time.monotonic() - started < 30
    seen = read_record(env["record"])
    for pid in (seen["pid"], seen["grandchild"]):
        assert not running(pid)
    assert not Path(seen["cwd"]).exists()


def test_output_is_capped_and_failures_keep_their_output(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STUB_MODE", "flood")
    run = ask_agent.fn("q", links(env), [], agents(env, max_output_bytes=10_000))
    assert len(run.stdout) == 10_000 and run.stdout_dropped == 3_000_000 - 10_000
    monkeypatch.setenv("STUB_MODE", "fail")
    failed = ask_agent.fn("q", links(env), [], agents(env))
    assert failed.exit_code == 3 and failed.stdout == "partial answer\n"
    assert "model quota exceeded" in failed.stderr


def test_missing_binary_unknown_agent_and_bad_links_are_clear(env: dict[str, Path]) -> None:
    settings = agents(env, commands={"ghost": "no-such-agent-binary -p {prompt_file}"})
    with pytest.raises(AgentError, match="agent 'ghost' runs `no-such-agent-binary`, which is not on PATH"):
        ask_agent.fn("q", links(env), [], settings, agent="ghost")
    with pytest.raises(InputError, match="unknown agent 'nope'"):
        ask_agent.fn("q", links(env), [], agents(env), agent="nope")
    gone = SourceLink("gone", "local", "/x", None, env["lib"] / "missing")
    with pytest.raises(InputError, match="has no folder"):
        ask_agent.fn("q", [gone], [], agents(env))
    evil = SourceLink("../escape", "local", "/x", None, env["lib"])
    with pytest.raises(InputError, match="invalid source name"):
        ask_agent.fn("q", [evil], [], agents(env))
    # No sandbox survives any of these.
    assert [p for p in env["sandboxes"].iterdir() if p.name.startswith("ctx-")] == []


def test_leftovers_older_than_a_day_are_swept_only_if_ours(env: dict[str, Path]) -> None:
    parent = env["sandboxes"]
    old = make_sandbox(parent, links(env))
    fresh = make_sandbox(parent, links(env))
    stranger = parent / "ctx-not-ours"
    stranger.mkdir()
    day_ago = time.time() - 25 * 3600
    os.utime(old / MARKER_FILE, (day_ago, day_ago))
    os.utime(stranger, (day_ago, day_ago))
    run = ask_agent.fn("q", links(env), [], agents(env))
    assert run.swept == 1
    assert not old.exists() and fresh.exists() and stranger.exists()
    assert (env["lib"] / "pkg" / "tools.py").is_file()  # the old sandbox's links were not followed
    assert sweep_leftovers(parent) == 0


def test_prompt_respects_the_token_budget() -> None:
    hits = [PromptHit("lib", f"f{i}.py", 1, 50, None, f"# file {i}\n" + "x = 1\n" * 300) for i in range(10)]
    src = [SourceLink("lib", "git", "u", None, Path("/"))]
    text, used = build_prompt("why?", src, hits, budget_tokens=1500)
    assert 0 < used < 10 and len(text) / 4 <= 1500 + 50
    small, none = build_prompt("why?", src, hits, budget_tokens=10)
    assert none == 0 and "# Search hits" in small and "## 1." not in small
    fenced, _ = build_prompt("q", src, [PromptHit("lib", "a.md", 1, 3, None, "```py\nx\n```\n")], 1000)
    assert "````\n```py\nx\n```\n````" in fenced
