"""`ctx remember --file`: paths typed in a shell are read from the current folder, agents' from the root."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api.context_search import remember
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


def test_a_secret_in_a_tag_is_masked_like_one_in_the_body(cli: Callable[..., Any], project: Path) -> None:
    key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    result = cli("remember", "error", "Deploy failed", "--tag", "password: hunter2xyz",
                 "--tag", f"AWS_SECRET_ACCESS_KEY={key}", "--tag", "deploy", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    text = (project / json.loads(result.stdout)["path"]).read_text(encoding="utf-8")
    assert "hunter2xyz" not in text and key not in text
    record = parse_record(project / json.loads(result.stdout)["path"], project)
    assert "deploy" in record.tags and sum("[REDACTED:" in t for t in record.tags) == 2


def test_control_characters_and_undecodable_bytes_in_a_title_are_stored_as_plain_text(
        cli: Callable[..., Any], project: Path) -> None:
    # "\udcff" is how Python hands over an argument byte that is not UTF-8 (0xff).
    result = cli("remember", "insight", "Bell\a and \x1b[31mred\x1b[0m tit\udcffle", "--json", cwd=project)
    assert result.exit_code == 0, result.stderr
    title = parse_record(project / json.loads(result.stdout)["path"], project).title
    assert title == "Bell and [31mred [0m tit\ufffdle"
