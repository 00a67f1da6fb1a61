"""What both watch loops (flows/watch_code.py, the service's watchers) make of a batch of events."""

from __future__ import annotations

from pathlib import Path

from ctxlake.tasks.watching import changed_paths


def test_a_batch_keeps_project_paths_and_drops_the_root_git_and_the_lake(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    events = {
        (2, str(root / "pkg" / "mod.py")),
        (1, str(root / "README.md")),
        (2, str(root)),  # the folder itself: its mtime moved
        (2, str(root / ".git" / "index")),
        (1, str(root / ".ctx" / "lake" / "chunks.lance" / "data" / "x.lance")),
        (2, str(tmp_path / "elsewhere" / "a.py")),  # not under the root
        (2, str(tmp_path / "proj-other" / "b.py")),  # a sibling whose name starts like the root
    }
    assert changed_paths(root, events) == {"pkg/mod.py", "README.md"}


def test_a_file_named_like_the_noise_folders_is_a_change(tmp_path: Path) -> None:
    # Only the folders are noise: `.gitignore` and `.ctxrc` are project files.
    events = {(2, str(tmp_path / ".gitignore")), (2, str(tmp_path / ".ctxrc"))}
    assert changed_paths(tmp_path, events) == {".gitignore", ".ctxrc"}
