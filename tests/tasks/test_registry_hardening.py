"""The registry against what a cloned repository can plant: links at the names ctx writes, a
manifest that names files ctx never wrote, YAML built to blow up, markers left half-deleted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ctxlake.schemas.registry import ConfigItem
from ctxlake.tasks.lake import write_atomic
from ctxlake.tasks.registry import save_item, sync

COMMAND = ConfigItem(kind="command", name="deploy", description="Deploy", body="echo deploy\n")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / ".ctx").mkdir(parents=True)
    return root


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("ORIGINAL\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("planted", [
    ".claude/commands/deploy.md.ctx-tmp",  # the generated file's old temp name
    ".ctx/registry/.sync.tmp",  # the manifest's
])
def test_a_link_planted_at_an_old_temp_name_redirects_no_sync_write(project: Path, victim: Path, planted: str) -> None:
    save_item(project, COMMAND)
    link = project / planted
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(victim, link.parent))
    sync(project, ["claude"])
    assert victim.read_text(encoding="utf-8") == "ORIGINAL\n"
    written = project / ".claude/commands/deploy.md"
    assert not written.is_symlink() and "echo deploy" in written.read_text(encoding="utf-8")


def test_a_link_planted_at_an_items_old_temp_name_redirects_no_save(project: Path, victim: Path) -> None:
    folder = project / ".ctx/registry/commands"
    folder.mkdir(parents=True)
    (folder / "deploy.md.tmp").symlink_to(victim)
    path = save_item(project, COMMAND)
    assert victim.read_text(encoding="utf-8") == "ORIGINAL\n"
    assert not path.is_symlink() and "echo deploy" in path.read_text(encoding="utf-8")


def test_a_rewritten_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path: Path) -> None:
    kept = tmp_path / "AGENTS.md"
    kept.write_text("# Agents\n", encoding="utf-8")
    kept.chmod(0o644)
    write_atomic(kept, "# Agents\nmore\n")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644
    old = os.umask(0o027)
    try:
        fresh = tmp_path / "new.json"
        write_atomic(fresh, "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640


def test_a_committed_manifest_cannot_make_sync_delete_a_file_no_writer_produces(project: Path) -> None:
    import hashlib
    import json

    head = project / ".git" / "HEAD"
    head.parent.mkdir()
    head.write_text("ref: refs/heads/main\n", encoding="utf-8")
    readme = project / "README.md"
    readme.write_text("# Project\n", encoding="utf-8")
    files = {rel: {"sha256": hashlib.sha256((project / rel).read_bytes()).hexdigest(), "client": "claude"}
             for rel in (".git/HEAD", "README.md")}
    manifest = project / ".ctx/registry/.sync.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"version": 1, "files": files}), encoding="utf-8")
    result = sync(project, ["claude"])
    assert not [c for c in result.changes if c.action == "delete"]
    assert head.read_text(encoding="utf-8") == "ref: refs/heads/main\n" and readme.is_file()


def test_a_manifest_without_a_table_of_files_is_one_clear_error(project: Path) -> None:
    from ctxlake.errors import InputError

    manifest = project / ".ctx/registry/.sync.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text('{"files": []}', encoding="utf-8")
    with pytest.raises(InputError, match="unreadable sync manifest"):
        sync(project, ["claude"])


BOMB = "".join(["---\nname: bomb\ndescription: [&a [x, x, x, x, x, x, x, x, x]",
                *(f", &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi", strict=True)),
                "]\n---\nx\n"])


def test_yaml_aliases_in_an_items_front_matter_are_refused_not_expanded(project: Path) -> None:
    from ctxlake.errors import InputError
    from ctxlake.tasks.registry import load_registry

    folder = project / ".ctx/registry/commands"
    folder.mkdir(parents=True)
    (folder / "bomb.md").write_text(BOMB, encoding="utf-8")
    with pytest.raises(InputError, match="aliases"):
        load_registry(project)


def test_yaml_aliases_in_a_knowledge_record_are_refused_not_expanded(project: Path) -> None:
    from ctxlake.errors import InputError
    from ctxlake.tasks.knowledge import parse_record

    path = project / ".ctx/knowledge/insights/bomb.md"
    path.parent.mkdir(parents=True)
    path.write_text(BOMB.replace("name: bomb\ndescription", "title: bomb\ntags"), encoding="utf-8")
    with pytest.raises(InputError, match="aliases"):
        parse_record(path, project)


RULE = ConfigItem(kind="rule", name="style", description="Style", always_apply=True, body="Use type hints.\n")


@pytest.mark.parametrize("force", [False, True])
def test_a_section_whose_end_marker_was_deleted_is_left_alone_even_with_force(project: Path, force: bool) -> None:
    from ctxlake.tasks.registry import SECTION_END

    save_item(project, RULE)
    sync(project, ["claude"])
    claude = project / "CLAUDE.md"
    damaged = claude.read_text(encoding="utf-8").replace(SECTION_END, "") + "## My notes\nNever push to main.\n"
    claude.write_text(damaged, encoding="utf-8")
    result = sync(project, ["claude"], force=force)
    assert [(c.path, c.action) for c in result.conflicts] == [("CLAUDE.md", "conflict")]
    assert "markers are damaged" in result.conflicts[0].detail
    assert claude.read_text(encoding="utf-8") == damaged


def test_an_item_holding_the_section_marker_is_refused(project: Path) -> None:
    from ctxlake.errors import InputError
    from ctxlake.tasks.registry import SECTION_END, load_registry

    save_item(project, ConfigItem(kind="rule", name="sneaky", description="d", always_apply=True,
                                  body=f"text\n{SECTION_END}\nmore\n"))
    with pytest.raises(InputError, match="section marker"):
        load_registry(project)


def test_a_folder_where_a_generated_file_goes_is_a_conflict_not_a_traceback(project: Path) -> None:
    save_item(project, COMMAND)
    (project / ".claude/commands/deploy.md").mkdir(parents=True)
    result = sync(project, ["claude"])
    assert [(c.path, c.action) for c in result.conflicts] == [(".claude/commands/deploy.md", "conflict")]
    assert not list((project / ".claude/commands").glob("*tmp*"))


def test_import_reads_nothing_through_a_linked_client_folder(project: Path, tmp_path: Path) -> None:
    from ctxlake.tasks.registry import import_native

    outside = tmp_path / "elsewhere"
    (outside / "notes").mkdir(parents=True)
    (outside / "notes/SKILL.md").write_text("---\nname: notes\ndescription: private\n---\ntoken=abc123\n",
                                            encoding="utf-8")
    (project / ".claude/skills").mkdir(parents=True)
    (project / ".claude/skills/notes").symlink_to(outside / "notes", target_is_directory=True)
    result = import_native(project, ["claude"])
    assert result.imported == []
    assert [s["path"] for s in result.skipped] == [".claude/skills/notes/SKILL.md"]
    assert not (project / ".ctx/registry/skills").exists()


def test_a_name_with_a_trailing_line_break_is_refused() -> None:
    from ctxlake.errors import InputError
    from ctxlake.schemas.registry import check_name

    with pytest.raises(InputError, match="invalid registry name"):
        check_name("ab\n")


def test_a_section_added_to_a_users_file_says_the_rest_of_it_stays(project: Path) -> None:
    (project / "CLAUDE.md").write_text("# My notes\n", encoding="utf-8")
    save_item(project, RULE)
    added = {c.path: c for c in sync(project, ["claude"]).changes}["CLAUDE.md"]
    assert (added.action, added.detail) == ("create", "adds its section; the rest of the file stays")
    (project / ".ctx/registry/rules/style.md").unlink()
    removed = {c.path: c for c in sync(project, ["claude"]).changes}["CLAUDE.md"]
    assert (removed.action, removed.detail) == ("delete", "removes its section; the rest of the file stays")
    assert (project / "CLAUDE.md").read_text(encoding="utf-8") == "# My notes\n"


def test_a_file_where_a_client_folder_goes_is_a_conflict_not_a_traceback(project: Path) -> None:
    save_item(project, RULE)
    (project / ".cursor").mkdir()
    (project / ".cursor/rules").write_text("not a folder\n", encoding="utf-8")
    result = sync(project, ["cursor"])
    assert [(c.path, c.action, c.detail) for c in result.conflicts] == [
        (".cursor/rules/style.mdc", "conflict", ".cursor/rules is a file, where ctx sync needs a folder")]
    assert (project / ".cursor/rules").read_text(encoding="utf-8") == "not a folder\n"
