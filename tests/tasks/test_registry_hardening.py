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
