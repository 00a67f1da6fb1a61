"""Co-change from a real git history: pairs, recency weighting, bulk commits, incremental runs, rewritten history."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ctxlake.schemas.config import load_settings
from ctxlake.serve.api.graph import GraphReader
from ctxlake.tasks.cochange import MAX_FILES

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")
DAY = 86400
T0 = 1_700_000_000


def commit(repo: Path, files: dict[str, str], when: int, message: str = "change") -> None:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": f"@{when} +0000", "GIT_COMMITTER_DATE": f"@{when} +0000",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", message], cwd=repo, check=True, env=env)


class Pair:
    def __init__(self, commits: int, strength: float) -> None:
        self.commits, self.strength = commits, strength


def related(repo: Path, path: str) -> dict[str, Pair]:
    """The co-changed files of path, as ctx related / MCP related_files answer them."""
    settings = load_settings(repo)
    answer = GraphReader(settings.lake_dir, settings.root).related_files(path, 50)
    return {r.path: Pair(r.commits or 0, r.weight) for r in answer.related if r.relation == "cochange"}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    commit(root, {"a.py": "a = 1\n", "b.py": "b = 1\n", "c.py": "c = 1\n", "d.py": "d = 1\n"}, T0)
    commit(root, {"a.py": "a = 2\n", "b.py": "b = 2\n"}, T0 + 10 * DAY)  # old pair a-b
    commit(root, {"a.py": "a = 3\n", "c.py": "c = 3\n"}, T0 + 400 * DAY)  # newer pair a-c
    commit(root, {f"gen/f{i}.py": f"x = {i}\n" for i in range(MAX_FILES + 1)} | {"a.py": "a = 4\n"}, T0 + 401 * DAY)
    return root


def test_pairs_are_weighted_by_recency_and_bulk_commits_skipped(repo: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=repo).exit_code == 0
    rel = related(repo, "a.py")
    assert not any(p.startswith("gen/") for p in rel), "a bulk commit made pairs"
    # a-b and a-c were each changed together once (the root commit, which adds the files, does not
    # count); a-c's commit is newer, so it weighs more.
    assert rel["b.py"].commits == 1 and rel["c.py"].commits == 1 and "d.py" not in rel
    assert rel["c.py"].strength > rel["b.py"].strength
    assert related(repo, "c.py")["a.py"].commits == 1  # both directions stored
    assert 0 < rel["b.py"].strength < 1


def test_new_commits_are_added_incrementally(repo: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=repo).exit_code == 0
    before = related(repo, "a.py")
    commit(repo, {"a.py": "a = 5\n", "b.py": "b = 5\n"}, T0 + 402 * DAY)
    result = json.loads(cli("run", "index", "--json", cwd=repo).stdout)
    assert result["cochange_commits"] == 1  # only the new commit was read
    after = related(repo, "a.py")
    assert after["b.py"].commits == before["b.py"].commits + 1 and after["b.py"].strength > before["b.py"].strength
    assert after["c.py"].commits == before["c.py"].commits
    # The same numbers as a lake built from scratch on this history.
    (repo / "e.py").write_text("e = 1\n")  # (an uncommitted file: the next run indexes but reads no commit)
    assert json.loads(cli("run", "index", "--json", cwd=repo).stdout)["cochange_commits"] == 0
    assert cli("clean", "--yes", cwd=repo).exit_code == 0
    assert cli("run", "index", cwd=repo).exit_code == 0
    rebuilt = related(repo, "a.py")
    assert {p: (r.commits, r.strength) for p, r in rebuilt.items()} == {p: (r.commits, r.strength) for p, r in after.items()}


def test_a_lost_table_is_built_again_though_no_commit_came(repo: Path, cli: Callable[..., Any]) -> None:
    """`ctx run index --force` drops a table it cannot read; the co-change state still names HEAD,
    which used to mean "up to date" and left `ctx related` without co-change until a new commit."""
    import shutil

    assert cli("run", "index", cwd=repo).exit_code == 0
    shutil.rmtree(repo / ".ctx" / "lake" / "cochange.lance")
    assert cli("run", "index", "--force", cwd=repo).exit_code == 0
    assert related(repo, "a.py")["b.py"].commits == 1


def test_rewritten_history_is_rebuilt(repo: Path, cli: Callable[..., Any]) -> None:
    assert cli("run", "index", cwd=repo).exit_code == 0
    subprocess.run(["git", "reset", "-q", "--hard", "HEAD~2"], cwd=repo, check=True)  # a-c's commit is gone
    commit(repo, {"b.py": "b = 9\n", "d.py": "d = 9\n"}, T0 + 500 * DAY)
    assert cli("run", "index", cwd=repo).exit_code == 0
    rel = related(repo, "a.py")
    assert "c.py" not in rel and rel["b.py"].commits == 1  # the a-c commit is gone with the history
    assert related(repo, "d.py")["b.py"].commits == 1


def test_outside_git_there_is_no_cochange(tmp_path: Path, cli: Callable[..., Any]) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "x.py").write_text("import y\n")
    (plain / "y.py").write_text("z = 1\n")
    assert cli("run", "index", cwd=plain).exit_code == 0
    out = json.loads(cli("related", "x.py", "--json", cwd=plain).stdout)
    assert [r["relation"] for r in out["related"]] == ["imports"]  # the import link, no co-change



def test_history_from_a_bare_mirror_stops_at_the_given_commit(repo: Path, tmp_path: Path) -> None:
    """What `ctx eval` gives a task's lake: a mirror's history up to the base commit, not past it."""
    from ctxlake.schemas.tables import COCHANGE_TABLE
    from ctxlake.tasks.cochange import head, update_cochange
    from ctxlake.tasks.lake import connect

    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(repo), str(mirror)], check=True)
    base = head(mirror, "HEAD~2")  # before the a-c commit (and the bulk one)
    assert base is not None and head(mirror, "no-such-rev") is None
    lake_dir = tmp_path / "lake"
    assert update_cochange(connect(lake_dir, create=True), lake_dir, mirror, "project", rev=base) == 1
    assert update_cochange(connect(lake_dir), lake_dir, mirror, "project", rev=base) == 0  # already there
    rows = connect(lake_dir).open_table(COCHANGE_TABLE).to_arrow().to_pylist()
    assert sorted((r["path"], r["other"]) for r in rows) == [("a.py", "b.py"), ("b.py", "a.py")]


def test_a_project_inside_a_larger_repository_pairs_its_own_paths(tmp_path: Path, cli: Callable[..., Any]) -> None:
    """A project that is one folder of a repository (a monorepo's package): pairs use the paths
    the index has, relative to the project, and leave the rest of the repository out."""
    mono = tmp_path / "mono"
    (mono / "pkg").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=mono, check=True)
    commit(mono, {"pkg/a.py": "a = 1\n", "pkg/b.py": "b = 1\n", "other/c.py": "c = 1\n"}, T0)
    commit(mono, {"pkg/a.py": "a = 2\n", "pkg/b.py": "b = 2\n", "other/c.py": "c = 2\n"}, T0 + DAY)
    assert cli("run", "index", str(mono / "pkg"), cwd=mono / "pkg").exit_code == 0  # the folder as its own project
    rel = related(mono / "pkg", "a.py")
    assert set(rel) == {"b.py"} and rel["b.py"].commits == 1
    # A lake built before pairs were relative (its state has no "paths") is rebuilt once.
    state_file = load_settings(mono / "pkg").lake_dir / "cochange.json"
    state = json.loads(state_file.read_text())
    del state["project"]["paths"]
    state_file.write_text(json.dumps(state))
    (mono / "pkg" / "d.py").write_text("d = 1\n")  # an edit, so the next run is not a no-op
    again = json.loads(cli("run", "index", "--json", str(mono / "pkg"), cwd=mono / "pkg").stdout)
    assert again["cochange_commits"] == 1 and set(related(mono / "pkg", "a.py")) == {"b.py"}
    (mono / "pkg" / "d.py").write_text("d = 2\n")
    assert json.loads(cli("run", "index", "--json", str(mono / "pkg"), cwd=mono / "pkg").stdout)["cochange_commits"] == 0
