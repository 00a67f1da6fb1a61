"""`ctx remember --file`: paths typed in a shell are read from the current folder, agents' from the root."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api.context import remember
from ctxlake.tasks.knowledge import parse_record

pytestmark = pytest.mark.usefixtures("fake_embedder")


@pytest.fixture
def project(make_repo: Callable[..., Path]) -> Path:
    repo = make_repo({"src/pkg/a.py": "A = 1\n", "top.txt": "top\n"}, name="proj")
    (repo / ".ctx").mkdir()
    return repo


def remembered_files(cli: Callable[..., Any], project: Path, cwd: Path, title: str, *files: str) -> list[str]:
    args = [arg for f in files for arg in ("--file", f)]
    result = cli("remember", "insight", title, *args, "--json", cwd=cwd)
    assert result.exit_code == 0, result.stderr
    written = json.loads(result.stdout)
    assert written["status"] == "created"
    return parse_record(project / written["path"], project).files


def test_remember_reads_file_paths_from_the_current_folder(cli: Callable[..., Any], project: Path) -> None:
    sub = project / "src" / "pkg"
    assert remembered_files(cli, project, sub, "Constants live in a", "a.py") == ["src/pkg/a.py"]
    assert remembered_files(cli, project, sub, "The top file is plain text", "../../top.txt") == ["top.txt"]
    assert remembered_files(cli, project, project, "Paths from the root still work", "src/pkg/a.py") == ["src/pkg/a.py"]
    absolute = str(sub / "a.py")
    assert remembered_files(cli, project, project / "src", "Absolute paths too", absolute) == ["src/pkg/a.py"]


def test_remember_refuses_a_file_outside_the_project_in_one_line(cli: Callable[..., Any], project: Path) -> None:
    result = cli("remember", "insight", "Outside", "--file", "../../../elsewhere.txt", cwd=project / "src" / "pkg")
    assert result.exit_code == 2
    assert "'../../../elsewhere.txt' is outside the project" in result.stderr
    assert "relative to the current folder" in result.stderr
    assert not list((project / ".ctx" / "knowledge").rglob("*.md"))


def test_agents_and_the_ui_still_name_files_from_the_root(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project / "src" / "pkg")  # a face without a shell's folder: the cwd must not count
    written = remember(load_settings(project), "insight", "Named from the root", files=["top.txt"])
    assert parse_record(project / written.path, project).files == ["top.txt"]  # type: ignore[operator]
