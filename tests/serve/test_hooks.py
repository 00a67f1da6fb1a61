"""`ctx hooks`: install/uninstall/status per tool into tmp projects, merges that keep others' keys, JSONC refused
with exit 3, the session-start output each tool parses, session-end ingesting a transcript, and session ordering
when some logs have no timestamps (Cursor transcripts stamped with their file's time)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import git
from memlogs import claude, slug, tool_result, tool_use, write_jsonl

from ctxlake.serve.agents import hook_files
from ctxlake.serve.cli.app import run


def call(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = run(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "proj"
    (root / ".ctx").mkdir(parents=True)
    monkeypatch.chdir(root)
    return root


def test_install_all_then_status_then_uninstall_leaves_only_what_was_there(
        repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / ".claude").mkdir()
    foreign_hook = {"hooks": [{"type": "command", "command": "echo lint"}]}
    (repo / ".claude" / "settings.json").write_text(json.dumps(
        {"permissions": {"allow": ["Bash(ls)"]}, "hooks": {"SessionStart": [foreign_hook], "PreToolUse": [foreign_hook]}}))
    (repo / "AGENTS.md").write_text("# Agents\n\nRun the tests with make.\n")
    (repo / ".gemini").mkdir()
    (repo / ".gemini" / "settings.json").write_text(json.dumps({"theme": "Dracula"}))
    code, out, _ = call(capsys, "hooks", "install", "--client", "all", "--json")
    assert code == 0
    changes = json.loads(out)["changes"]
    assert {c["client"] for c in changes} == set(hook_files.HOOK_CLIENTS)

    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert settings["permissions"] == {"allow": ["Bash(ls)"]}
    assert settings["hooks"]["PreToolUse"] == [foreign_hook]
    assert settings["hooks"]["SessionStart"][0] == foreign_hook
    ours = settings["hooks"]["SessionStart"][1]["hooks"][0]
    assert ours["type"] == "command" and ours["command"].endswith("hooks session-start --client claude")
    assert "session-end --client claude" in settings["hooks"]["SessionEnd"][0]["hooks"][0]["command"]
    codex = json.loads((repo / ".codex" / "hooks.json").read_text())
    assert set(codex["hooks"]) == {"SessionStart", "Stop"}
    gemini = json.loads((repo / ".gemini" / "settings.json").read_text())
    assert gemini["hooks"]["SessionStart"][0]["hooks"][0]["name"] == "ctx-session-start"
    assert gemini["hooks"]["SessionStart"][0]["hooks"][0]["timeout"] == 10_000  # milliseconds in Gemini CLI
    cursor = json.loads((repo / ".cursor" / "hooks.json").read_text())
    assert cursor["version"] == 1 and set(cursor["hooks"]) == {"sessionStart", "stop"}
    copilot = json.loads((repo / ".github" / "hooks" / "ctx.json").read_text())
    assert copilot["version"] == 1 and copilot["hooks"]["sessionEnd"][0]["bash"].endswith("--client copilot")
    assert "session.idle" in (repo / ".opencode" / "plugins" / "ctx-hooks.js").read_text()
    agents = (repo / "AGENTS.md").read_text()
    assert agents.startswith("# Agents\n\nRun the tests with make.\n") and agents.count(hook_files.SECTION_START) == 1
    assert "handoff_brief" in (repo / ".github" / "copilot-instructions.md").read_text()

    # A second install changes nothing.
    code, out, _ = call(capsys, "hooks", "install", "--client", "all", "--json")
    assert code == 0 and {c["action"] for c in json.loads(out)["changes"]} == {"unchanged"}
    code, out, _ = call(capsys, "hooks", "status", "--json")
    assert {c["client"]: c["action"] for c in json.loads(out)["changes"]} == dict.fromkeys(hook_files.HOOK_CLIENTS, "installed")

    code, out, _ = call(capsys, "hooks", "uninstall", "--json")
    assert code == 0
    settings = json.loads((repo / ".claude" / "settings.json").read_text())
    assert settings == {"permissions": {"allow": ["Bash(ls)"]},
                        "hooks": {"SessionStart": [foreign_hook], "PreToolUse": [foreign_hook]}}
    assert json.loads((repo / ".gemini" / "settings.json").read_text()) == {"theme": "Dracula"}
    assert (repo / "AGENTS.md").read_text() == "# Agents\n\nRun the tests with make.\n"
    # The files install created, and the folders it created for them, are gone: no `{}` stubs stay behind.
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == [
        ".claude", ".claude/settings.json", ".ctx", ".gemini", ".gemini/settings.json", "AGENTS.md"]
    code, out, _ = call(capsys, "hooks", "status", "--json")
    assert {c["action"] for c in json.loads(out)["changes"]} == {"missing"}


def test_uninstalling_one_tool_keeps_the_section_another_still_uses(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert call(capsys, "hooks", "install", "--client", "cursor,opencode")[0] == 0
    assert call(capsys, "hooks", "uninstall", "--client", "opencode")[0] == 0
    assert hook_files.SECTION_START in (repo / "AGENTS.md").read_text()
    assert call(capsys, "hooks", "uninstall", "--client", "cursor")[0] == 0
    assert not (repo / "AGENTS.md").exists()


def test_a_commented_settings_file_is_left_alone_with_exit_3_and_the_entry_to_paste(
        repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / ".gemini").mkdir()
    text = '{\n  // my theme\n  "theme": "dark"\n}\n'
    (repo / ".gemini" / "settings.json").write_text(text)
    code, out, err = call(capsys, "hooks", "install", "--client", "gemini,claude")
    assert code == 3
    assert (repo / ".gemini" / "settings.json").read_text() == text
    assert "not plain JSON" in err and '"SessionStart"' in err and "session-start --client gemini" in err
    # The other client was still installed.
    assert "Claude Code: created" in out and (repo / ".claude" / "settings.json").is_file()
    # Uninstall leaves the commented file alone too, and says so with exit 3 after removing the rest.
    code, out, err = call(capsys, "hooks", "uninstall")
    assert code == 3 and (repo / ".gemini" / "settings.json").read_text() == text
    assert not (repo / ".claude").exists()  # the file it had created held only its hooks


def test_a_foreign_opencode_plugin_of_the_same_name_is_not_overwritten(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = repo / ".opencode" / "plugins" / "ctx-hooks.js"
    plugin.parent.mkdir(parents=True)
    plugin.write_text("export const Mine = async () => ({})\n")
    assert call(capsys, "hooks", "install", "--client", "opencode")[0] == 3
    assert plugin.read_text() == "export const Mine = async () => ({})\n"


@pytest.mark.timeout(120)
def test_a_fifo_or_a_non_utf8_file_where_ctx_would_write_is_exit_3_not_a_hang(
        repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A clone may hold a FIFO where the plugin or AGENTS.md goes: reading it would block forever.
    plugin = repo / ".opencode" / "plugins" / "ctx-hooks.js"
    plugin.parent.mkdir(parents=True)
    os.mkfifo(plugin)
    os.mkfifo(repo / "AGENTS.md")
    code, _, err = call(capsys, "hooks", "install", "--client", "opencode")
    assert code == 3 and "cannot read" in err and "Traceback" not in err
    assert call(capsys, "hooks", "uninstall", "--client", "opencode")[0] == 3

    plugin.unlink()
    (repo / "AGENTS.md").unlink()
    (repo / "AGENTS.md").write_bytes(b"# Agents\n\xff\n")
    code, _, err = call(capsys, "hooks", "install", "--client", "cursor")
    assert code == 3 and "cannot read" in err and (repo / "AGENTS.md").read_bytes() == b"# Agents\n\xff\n"


def test_hook_command_is_portable_when_ctx_on_path_is_this_install(tmp_path: Path) -> None:
    import sys

    beside = Path(sys.executable).parent / "ctx"
    env = {"PATH": str(beside.parent), "CTX_HOME": "/tmp/my ctx"}
    command = hook_files.hook_command("claude", "session-start", env)
    assert command == "CTX_HOME='/tmp/my ctx' ctx hooks session-start --client claude"
    elsewhere = hook_files.hook_command("claude", "session-start", {"PATH": str(tmp_path)})
    assert elsewhere == f"{beside} hooks session-start --client claude"


def test_without_client_it_wires_claude_and_the_tools_the_project_uses(repo: Path) -> None:
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".cursor").mkdir()
    (repo / "opencode.json").write_text("{}")
    assert hook_files.parse_hook_clients(None, repo) == ["claude", "cursor", "opencode"]


def test_unknown_client_is_an_input_error(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = call(capsys, "hooks", "install", "--client", "vim")
    assert code == 2 and "unknown client 'vim'" in err


def test_a_badly_typed_knowledge_file_is_a_warning_and_the_others_still_reach_the_agent(
        repo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(repo.parent / "home"))
    folder = repo / ".ctx" / "knowledge" / "decisions"
    folder.mkdir(parents=True)
    (folder / "bad.md").write_text("---\nid: decision-x\ntype: decision\ntitle: tagged badly\ntags: 7\n---\nbody\n")
    (folder / "broken.md").write_text("---\nid: [unclosed\n---\nbody\n")
    (folder / "good.md").write_text("---\ntitle: Deploys use a dedicated key\ntags: ops\n---\nCI loads it with ssh-add.\n")
    code, out, _ = call(capsys, "knowledge", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [(r["id"], r["tags"]) for r in listed["records"]] == [("good", ["ops"])]
    assert len(listed["warnings"]) == 2
    assert any("bad.md" in w and "tags must be a list" in w for w in listed["warnings"])
    assert any("broken.md" in w and "not valid YAML" in w for w in listed["warnings"])
    code, out, err = call(capsys, "hooks", "session-start", "--client", "claude")
    assert code == 0 and "TypeError" not in err and "bad.md" in err
    assert "Deploys use a dedicated key" in json.loads(out)["hookSpecificOutput"]["additionalContext"]


# -- with a real lake ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, prefect_server: None) -> Iterator[dict[str, Any]]:
    """A project with a timestamped Claude session (2026-03-02 09:00-09:05) and two Cursor transcripts without
    timestamps: one whose file time is later that same day, one from the next day."""
    base = tmp_path_factory.mktemp("hooks")
    repo = base / "app"
    (repo / ".ctx").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    cwd = str(repo)
    home = base / "home"
    write_jsonl(home / ".claude" / "projects" / slug(cwd) / "c1.jsonl", [
        claude("user", "u1", 0, "Make the importer skip blank rows", session="c1", cwd=cwd),
        claude("assistant", "a1", 1, [{"type": "text", "text": "We decided to strip rows before parsing."},
                                      tool_use("Edit", file_path=f"{cwd}/importer.py")], session="c1", cwd=cwd),
        claude("user", "u2", 2, tool_result("ok"), session="c1", cwd=cwd),
        claude("assistant", "a2", 5, "Done: blank rows are skipped.", session="c1", cwd=cwd),
    ])
    transcripts = home / ".cursor" / "projects" / slug(cwd).strip("-") / "agent-transcripts"
    for name, when in (("same-day", datetime(2026, 3, 2, 18, 0, tzinfo=UTC)),
                       ("next-day", datetime(2026, 3, 3, 8, 0, tzinfo=UTC))):
        path = write_jsonl(transcripts / f"{name}.jsonl", [
            {"role": "user", "message": {"content": [{"type": "text", "text": f"cursor question {name}"}]}},
            {"role": "assistant", "message": {"content": [{"type": "text", "text": f"cursor answer {name}"}]}},
        ])
        os.utime(path, (when.timestamp(), when.timestamp()))
    env = {"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash", "HOME": str(home),
           "CTX_HOME": str(base / "ctx-home")}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(repo)
        assert run(["run", "ingest", "--no-embed", "--tool", "claude", "--tool", "cursor", "--json"]) == 0
    yield {"repo": repo, "env": env, "home": home, "cwd": cwd}


@pytest.fixture
def here(lake: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    for key, value in lake["env"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(lake["repo"])
    return lake


def test_sessions_without_timestamps_never_outrank_a_timestamped_one_of_the_same_day(
        here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = call(capsys, "sessions", "--json")
    assert code == 0
    found = [(s["session_ref"], s["time_estimated"]) for s in json.loads(out)]
    assert found == [("cursor:next-day", True), ("claude:c1", False), ("cursor:same-day", True)]
    code, out, _ = call(capsys, "sessions")
    assert "time from the file" in out
    # The hand-off follows the same order: the next day's transcript is the latest by date.
    code, out, _ = call(capsys, "handoff", "--json")
    assert json.loads(out)["session_ref"] == "cursor:next-day" and json.loads(out)["time_estimated"] is True
    code, out, _ = call(capsys, "handoff", "--from", "claude", "--json")
    assert json.loads(out)["session_ref"] == "claude:c1" and json.loads(out)["time_estimated"] is False


def test_an_unknown_tool_is_named_and_the_handoff_hint_gives_options_that_exist(
        here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (("sessions", "--tool", "bogus"), ("handoff", "--from", "bogus"),
                 ("context", "search", "importer", "--tool", "bogus")):
        code, out, err = call(capsys, *argv)
        assert code == 2 and out == "", argv
        assert "unknown agent tool 'bogus'" in err and "claude, codex" in err, (argv, err)
    code, _, err = call(capsys, "handoff", "--from", "codex")  # a known tool with no session here
    assert code == 2 and "no session to hand off from for codex" in err
    assert "--all-projects" not in err.replace("ctx sessions --all-projects", "")  # `ctx handoff` has no such flag
    assert "--session" in err


def test_session_start_prints_the_brief_in_each_tools_shape(here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    for client in ("claude", "codex", "gemini"):
        code, out, _ = call(capsys, "hooks", "session-start", "--client", client)
        assert code == 0
        data = json.loads(out)
        assert data["hookSpecificOutput"]["hookEventName"] == "SessionStart"
        assert "# Hand-off: cursor session cursor:next-day" in data["hookSpecificOutput"]["additionalContext"]
    code, out, _ = call(capsys, "hooks", "session-start", "--client", "cursor")
    assert "cursor question next-day" in json.loads(out)["additional_context"]
    code, out, _ = call(capsys, "hooks", "session-start", "--client", "copilot")
    assert out.startswith("# Hand-off:")


def test_session_start_fails_open_outside_any_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = call(capsys, "hooks", "session-start", "--client", "claude")
    assert code == 0
    assert json.loads(out)["hookSpecificOutput"]["additionalContext"] == ""
    assert "no hand-off brief" in err


def test_session_end_ingests_the_new_transcript_in_the_background(
        here: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    cwd = here["cwd"]
    write_jsonl(here["home"] / ".claude" / "projects" / slug(cwd) / "c2.jsonl", [
        claude("user", "v1", 600, "Add a --dry-run flag to the importer", session="c2", cwd=cwd),
        claude("assistant", "b1", 601, "Added --dry-run; nothing is written with it.", session="c2", cwd=cwd),
    ])
    code, out, err = call(capsys, "hooks", "session-end", "--client", "claude")
    assert code == 0 and "ingest started" in err and json.loads(out) == {}
    # A second call at once is debounced (Stop hooks fire every turn).
    assert "skipped" in call(capsys, "hooks", "session-end", "--client", "claude")[2]
    deadline = time.monotonic() + 180
    refs: list[str] = []
    while time.monotonic() < deadline:
        code, out, _ = call(capsys, "sessions", "--tool", "claude", "--json")
        refs = [s["session_ref"] for s in json.loads(out)] if code == 0 else []
        if "claude:c2" in refs:
            break
        time.sleep(1)
    log = (here["repo"] / ".ctx" / "lake" / "hooks-ingest.log").read_text()
    assert "claude:c2" in refs, f"background ingest did not land within 180 s; log:\n{log[-3000:]}"
    assert "run ingest --no-embed" in log
