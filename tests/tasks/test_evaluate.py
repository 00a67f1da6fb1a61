"""Eval stage: task files with bad lines, repositories found in mirrors, commits materialised (even damaged ones)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import git

from ctxlake.errors import InputError
from ctxlake.tasks.evaluate import (
    EvalTask,
    _safe_parts,
    git_dir_for,
    load_tasks,
    materialise,
    resolve_commit,
    slug,
)


def test_task_file_lines(tmp_path: Path) -> None:
    repo = tmp_path / "checkout"
    repo.mkdir()
    lines = [
        json.dumps({"instance_id": "a", "repo": "owner/name", "base_commit": "abc1234", "problem_statement": " q ",
                    "gold_files": ["/x.py", "x.py", "y.py"]}),
        json.dumps({"repo_path": "checkout", "query": "local", "gold_files": ["z.py"]}),  # relative to the file
        json.dumps({"instance_id": "a", "repo": "owner/name", "base_commit": "abc1234", "problem_statement": "dup",
                    "gold_files": ["x.py"]}),
        '{"repo": "owner/name", "problem_statement": "no commit", "gold_files": ["x.py"]}',
        b"\xff\xfe not utf-8".decode("latin-1"),
        "",
        '{"repo": "cut off',
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    loaded = load_tasks(path)
    first, second = loaded.tasks
    assert first == EvalTask("a", "owner/name", "owner/name", "abc1234", "q", ("x.py", "y.py"))
    assert second.source == str(repo.resolve()) and second.base_commit is None and second.repo == "checkout"
    assert loaded.skipped[0] == "line 3: duplicate instance_id a"
    assert loaded.skipped[1] == "line 4: a remote repository needs a base_commit"
    assert loaded.skipped[2].startswith("line 5: not UTF-8")
    assert loaded.skipped[3] == "line 7: invalid JSON (Unterminated string starting at column 10)"
    assert [t.instance_id for t in load_tasks(path, only=["checkout"]).tasks] == [second.instance_id]
    assert len(load_tasks(path, limit=1).tasks) == 1


def test_mirror_lookup_and_commits(make_repo: Callable[..., Path], tmp_path: Path) -> None:
    repo = make_repo({"a.py": "x = 1\n"})
    head = git(repo, "rev-parse", "HEAD")
    mirrors = tmp_path / "mirrors"
    (mirrors / "acme").mkdir(parents=True)
    git(tmp_path, "clone", "-q", "--bare", str(repo), str(mirrors / "acme" / "shop"))
    task = EvalTask("t", "acme/shop", "github:acme/shop", head[:10], "q", ("a.py",))
    git_dir = git_dir_for(task, [tmp_path / "empty", mirrors])
    assert git_dir == mirrors / "acme" / "shop"
    assert resolve_commit(git_dir, head[:10]) == head
    with pytest.raises(InputError, match="is not in"):
        resolve_commit(git_dir, "deadbeef")
    local = EvalTask("t", "repo", str(repo), head, "q", ("a.py",))
    assert git_dir_for(local, []) == repo / ".git"
    assert slug("swe-bench/django__django") == "swe-bench+django__django"


def test_materialise_skips_blobs_the_repository_lacks(make_repo: Callable[..., Path], tmp_path: Path) -> None:
    repo = make_repo({"src/a.py": "A = 1\n", "data/big.bin": "not really big\n", "run.sh": "#!/bin/sh\n"})
    (repo / "run.sh").chmod(0o755)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "exec bit")
    head = git(repo, "rev-parse", "HEAD")
    # A mirror that lost one blob, as snapshots without their large files do.
    blob = git(repo, "rev-parse", "HEAD:data/big.bin")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    done = materialise.fn(repo / ".git", head, tmp_path / "trees" / "shop@x")
    assert done.missing == ["data/big.bin"] and done.unsafe == []
    assert (done.tree / "src" / "a.py").read_text() == "A = 1\n"
    assert not (done.tree / "data" / "big.bin").exists()
    assert (done.tree / "run.sh").stat().st_mode & 0o111
    # Extracted once: a second call reuses the tree and remembers what was missing.
    (done.tree / "marker").write_text("kept")
    again = materialise.fn(repo / ".git", head, tmp_path / "trees" / "shop@x")
    assert (again.tree / "marker").exists() and again.missing == ["data/big.bin"]
    assert not list((tmp_path / "trees").glob(".*tmp*"))


@pytest.mark.parametrize("path", ["/etc/passwd", "a/../../b", ".git/config", "a//b", "./a"])
def test_paths_that_would_escape_the_tree_are_refused(path: str) -> None:
    assert _safe_parts(path) is None


def test_safe_paths_pass() -> None:
    assert _safe_parts("src/pkg/a.py") == ["src", "pkg", "a.py"]
