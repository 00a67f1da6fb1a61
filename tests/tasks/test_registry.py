"""Config registry: `ctx sync` writes every client's native files, idempotently, and never clobbers a person's edit."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml

from ctxlake.errors import InputError
from ctxlake.schemas.registry import ConfigItem, parse_item, split_front_matter
from ctxlake.serve.cli.app import run
from ctxlake.tasks.registry import (
    SECTION_END,
    SECTION_START,
    import_native,
    load_registry,
    save_item,
    sync,
)

ITEMS = [
    ConfigItem(kind="skill", name="release-notes", description="Draft release notes from the git log",
               body="Read `git log` since the last tag.\nGroup by feature.\n"),
    ConfigItem(kind="command", name="review", description="Review the current diff", argument_hint="[focus]",
               body="Review the staged diff, focusing on $ARGUMENTS.\n"),
    ConfigItem(kind="agent", name="tester", description="Runs and fixes failing tests", tools=["Read", "Bash"],
               model="sonnet", body="You run the test suite and fix what fails.\n"),
    ConfigItem(kind="rule", name="py-style", description="Python style", globs=["**/*.py"],
               body="Use type hints on every public function.\n"),
    ConfigItem(kind="rule", name="no-secrets", description="Never commit secrets", always_apply=True,
               body="Never write API keys into files.\n"),
]

EXPECTED = {
    ".claude/skills/release-notes/SKILL.md", ".claude/commands/review.md", ".claude/agents/tester.md", "CLAUDE.md",
    "AGENTS.md", ".gemini/commands/review.toml", "GEMINI.md", ".cursor/rules/py-style.mdc",
    ".cursor/rules/no-secrets.mdc", ".github/instructions/py-style.instructions.md",
    ".github/instructions/no-secrets.instructions.md", ".github/prompts/review.prompt.md",
}


class Out:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.exit_code, self.stdout, self.output = code, out, out + err


def _ctx(capsys: pytest.CaptureFixture[str], *args: str) -> Out:
    capsys.readouterr()
    code = run(list(args))
    got = capsys.readouterr()
    return Out(code, got.out, got.err)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / ".ctx").mkdir()
    for item in ITEMS:
        save_item(tmp_path, item)
    return tmp_path


def _front(path: Path) -> dict[str, object]:
    text = path.read_text(encoding="utf-8")
    assert text.startswith("---\n"), path
    fm, _ = split_front_matter(text, str(path))
    # Also through a plain YAML parser, as the tools would.
    assert yaml.safe_load(text.split("---\n")[1]) == fm
    return fm


def test_sync_writes_every_client_and_each_parses(project: Path) -> None:
    result = sync(project)
    assert {c.path for c in result.changes if c.action == "create"} == EXPECTED
    assert _front(project / ".claude/skills/release-notes/SKILL.md") == {
        "name": "release-notes", "description": "Draft release notes from the git log"}
    assert _front(project / ".claude/commands/review.md")["argument-hint"] == "[focus]"
    assert _front(project / ".claude/agents/tester.md")["tools"] == "Read, Bash"
    toml = tomllib.loads((project / ".gemini/commands/review.toml").read_text(encoding="utf-8"))
    assert toml["description"] == "Review the current diff" and "$ARGUMENTS" in toml["prompt"]
    assert "{{args}}" in toml["prompt"]
    cur = _front(project / ".cursor/rules/py-style.mdc")
    assert cur == {"description": "Python style", "globs": "**/*.py", "alwaysApply": False}
    assert _front(project / ".cursor/rules/no-secrets.mdc")["alwaysApply"] is True
    assert _front(project / ".github/instructions/py-style.instructions.md")["applyTo"] == "**/*.py"
    assert _front(project / ".github/instructions/no-secrets.instructions.md")["applyTo"] == "**"
    assert _front(project / ".github/prompts/review.prompt.md")["description"] == "Review the current diff"
    for rel in EXPECTED:
        text = (project / rel).read_text(encoding="utf-8")
        assert "ctx sync" in text and ".ctx/registry" in text, rel  # the header names the source
    agents = (project / "AGENTS.md").read_text(encoding="utf-8")
    assert "Use type hints" in agents and "`review` (command)" in agents
    manifest = json.loads((project / ".ctx/registry/.sync.json").read_text(encoding="utf-8"))
    assert set(manifest["files"]) == EXPECTED


def test_second_sync_writes_nothing_and_check_exit_codes(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _ctx(capsys, "sync", "--check", "--root", str(project)).exit_code == 1
    sync(project)
    before = {rel: (project / rel).stat().st_mtime_ns for rel in EXPECTED}
    again = sync(project)
    assert not again.written and all(c.action == "unchanged" for c in again.changes)
    assert before == {rel: (project / rel).stat().st_mtime_ns for rel in EXPECTED}
    res = _ctx(capsys, "sync", "--check", "--json", "--root", str(project))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["conflicts"] == 0
    # A registry change makes --check fail again, and sync updates only that file.
    save_item(project, ITEMS[3].model_copy(update={"body": "Use type hints everywhere.\n"}))
    assert _ctx(capsys, "sync", "--check", "--root", str(project)).exit_code == 1
    changed = {c.path for c in sync(project).changes if c.action == "update"}
    assert changed == {".cursor/rules/py-style.mdc", ".github/instructions/py-style.instructions.md", "CLAUDE.md",
                       "AGENTS.md", "GEMINI.md"}


def test_edited_file_is_a_conflict_until_force(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sync(project)
    mdc = project / ".cursor/rules/py-style.mdc"
    mdc.write_text(mdc.read_text(encoding="utf-8") + "My own line.\n", encoding="utf-8")
    save_item(project, ITEMS[3].model_copy(update={"description": "Python style guide"}))
    res = _ctx(capsys, "sync", "--root", str(project))
    assert res.exit_code == 1 and "conflict .cursor/rules/py-style.mdc" in res.stdout
    assert "My own line." in mdc.read_text(encoding="utf-8")  # left alone
    # The other files were still brought up to date.
    assert "Python style guide" in (project / ".github/instructions/py-style.instructions.md").read_text()
    res = _ctx(capsys, "sync", "--force", "--root", str(project))
    assert res.exit_code == 0, res.output
    assert "My own line." not in mdc.read_text(encoding="utf-8")
    assert sync(project, check=True).pending == []


def test_section_keeps_other_content_and_file_without_manifest_is_a_conflict(tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    save_item(tmp_path, ITEMS[3])
    (tmp_path / "CLAUDE.md").write_text("# My notes\n\nKeep this.\n", encoding="utf-8")
    (tmp_path / ".cursor/rules").mkdir(parents=True)
    (tmp_path / ".cursor/rules/py-style.mdc").write_text("mine\n", encoding="utf-8")
    result = sync(tmp_path)
    assert [c.path for c in result.conflicts] == [".cursor/rules/py-style.mdc"]
    claude = (tmp_path / "CLAUDE.md").read_text(encoding="utf-8")
    assert claude.startswith("# My notes\n\nKeep this.\n") and SECTION_START in claude and SECTION_END in claude
    assert (tmp_path / ".cursor/rules/py-style.mdc").read_text() == "mine\n"
    # Removing the rule removes our section and files, keeps the person's text.
    (tmp_path / ".ctx/registry/rules/py-style.md").unlink()
    sync(tmp_path)
    assert (tmp_path / "CLAUDE.md").read_text(encoding="utf-8").strip() == "# My notes\n\nKeep this."
    assert not (tmp_path / ".github/instructions/py-style.instructions.md").exists()
    assert not (tmp_path / ".github").exists()  # the folders it made for that file went with it
    assert (tmp_path / ".cursor/rules/py-style.mdc").read_text() == "mine\n"


def test_a_deleted_skill_takes_its_folder_with_it(project: Path) -> None:
    sync(project)
    (project / ".ctx/registry/skills/release-notes.md").unlink()
    deleted = {c.path for c in sync(project).changes if c.action == "delete"}
    assert deleted == {".claude/skills/release-notes/SKILL.md"}
    assert not (project / ".claude/skills").exists()
    assert (project / ".claude/commands/review.md").is_file()


def _write_native(root: Path) -> None:
    files = {
        ".claude/skills/release-notes/SKILL.md":
            "---\nname: release-notes\ndescription: Draft release notes\n---\nRead the git log.\n",
        ".claude/commands/review.md": "---\ndescription: Review the diff\nargument-hint: '[focus]'\n---\nReview $ARGUMENTS\n",
        ".claude/agents/tester.md": "---\nname: tester\ndescription: Runs tests\ntools: Read, Bash\nmodel: haiku\n---\nRun.\n",
        ".cursor/rules/py-style.mdc": "---\ndescription: Python style\nglobs: '**/*.py'\nalwaysApply: false\n---\nHints.\n",
        ".gemini/commands/deploy.toml": 'description = "Deploy"\nprompt = "Deploy {{args}} now."\n',
        ".github/instructions/docs.instructions.md": "---\napplyTo: 'docs/**'\n---\nWrite plainly.\n",
        ".github/prompts/explain.prompt.md": "---\ndescription: Explain code\n---\nExplain the selection.\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_import_sync_import_round_trip(tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    _write_native(tmp_path)
    first = import_native(tmp_path)
    assert len(first.imported) == 7, first
    registry = load_registry(tmp_path)
    by_name = {i.name: i for i in registry}
    assert by_name["tester"].tools == ["Read", "Bash"] and by_name["tester"].model == "haiku"
    assert by_name["py-style"].globs == ["**/*.py"] and by_name["docs"].globs == ["docs/**"]
    assert by_name["review"].argument_hint == "[focus]" and by_name["deploy"].body == "Deploy {{args}} now.\n"
    result = sync(tmp_path)
    assert result.conflicts == []  # imported files were adopted, not treated as a person's edits
    assert "generated by `ctx sync`" in (tmp_path / ".claude/agents/tester.md").read_text()
    second = import_native(tmp_path)
    assert second.imported == []
    assert load_registry(tmp_path) == registry
    # The generated files, read back as a fresh import would, give the same items.
    fresh = tmp_path / "fresh"
    (fresh / ".ctx").mkdir(parents=True)
    for rel in (".claude/agents/tester.md", ".claude/commands/review.md", ".cursor/rules/py-style.mdc"):
        text = (tmp_path / rel).read_text(encoding="utf-8")
        text = "\n".join(line for line in text.split("\n") if "generated by `ctx sync`" not in line)
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        (fresh / rel).write_text(text, encoding="utf-8")
    import_native(fresh)
    again = {i.name: i for i in load_registry(fresh)}
    for name in ("tester", "review", "py-style"):
        assert again[name] == by_name[name], name


def test_bad_names_and_front_matter_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("../x", "a/b", "..", "Upper", "", "x" * 65):
        with pytest.raises(ValueError):
            ConfigItem(kind="rule", name=bad)
    with pytest.raises(InputError, match="invalid registry name"):
        parse_item("rule", "---\nname: ../../etc/passwd\n---\nx\n", "t.md")
    with pytest.raises(InputError, match="unknown front matter"):
        parse_item("rule", "---\nname: ok\nrm: -rf\n---\nx\n", "t.md")
    (tmp_path / ".ctx/registry/rules").mkdir(parents=True)
    (tmp_path / ".ctx/registry/rules/ok.md").write_text("---\nname: ../evil\n---\nx\n", encoding="utf-8")
    res = _ctx(capsys, "sync", "--root", str(tmp_path))
    assert res.exit_code == 2 and "invalid registry name" in res.output
    assert not (tmp_path / ".cursor").exists()
    # A native file with a traversal-looking or bad name is skipped on import, nothing written outside.
    (tmp_path / ".ctx/registry/rules/ok.md").unlink()
    (tmp_path / ".cursor/rules").mkdir(parents=True)
    (tmp_path / ".cursor/rules/Bad Name!.mdc").write_text("---\ndescription: x\n---\nx\n", encoding="utf-8")
    res_imp = import_native(tmp_path)
    assert res_imp.imported == [] and "invalid registry name" in res_imp.skipped[0]["why"]


def test_registry_list_and_show_cli(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = _ctx(capsys, "registry", "list", "--json", "--root", str(project))
    assert res.exit_code == 0, res.output
    assert {(i["kind"], i["name"]) for i in json.loads(res.stdout)["items"]} == {(i.kind, i.name) for i in ITEMS}
    res = _ctx(capsys, "registry", "show", "tester", "--json", "--root", str(project))
    assert json.loads(res.stdout)["model"] == "sonnet"
    res = _ctx(capsys, "registry", "show", "nope", "--root", str(project))
    assert res.exit_code == 2


def test_coexists_with_hooks_section_and_refuses_symlinked_folders(tmp_path: Path) -> None:
    from ctxlake.serve.agents.hook_files import SECTION_END as HOOK_END
    from ctxlake.serve.agents.hook_files import SECTION_START as HOOK_START

    (tmp_path / ".ctx").mkdir()
    save_item(tmp_path, ITEMS[3])
    hooks = f"# Agents\n\n{HOOK_START}\nCall handoff_brief first.\n{HOOK_END}\n"
    (tmp_path / "AGENTS.md").write_text(hooks, encoding="utf-8")
    sync(tmp_path, ["codex"])
    text = (tmp_path / "AGENTS.md").read_text(encoding="utf-8")
    assert text.startswith(hooks) and SECTION_START in text and "Use type hints" in text
    (tmp_path / ".ctx/registry/rules/py-style.md").unlink()
    sync(tmp_path, ["codex"])
    assert (tmp_path / "AGENTS.md").read_text(encoding="utf-8") == hooks
    # A client folder that is a symlink to somewhere else is refused, nothing written there.
    outside = tmp_path.parent / (tmp_path.name + "-outside")
    outside.mkdir()
    (tmp_path / ".cursor").symlink_to(outside, target_is_directory=True)
    save_item(tmp_path, ITEMS[3])
    with pytest.raises(InputError, match="outside the project"):
        sync(tmp_path, ["cursor"])
    assert list(outside.iterdir()) == []


def test_symlinked_registry_folder_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path.parent / (tmp_path.name + "-rules")
    elsewhere.mkdir()
    (elsewhere / "x.md").write_text("---\nname: x\n---\nsecret\n", encoding="utf-8")
    (tmp_path / ".ctx/registry").mkdir(parents=True)
    (tmp_path / ".ctx/registry/rules").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match="symlink"):
        load_registry(tmp_path)
