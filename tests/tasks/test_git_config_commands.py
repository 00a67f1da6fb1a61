"""A project that arrives with its own `.git/config` (an archive, a shared folder) cannot make ctx's
git calls run its commands: core.fsmonitor, filter drivers, text conversion, external diff, and
gpg.program under log.showSignature."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ctxlake.errors import ConfigError
from ctxlake.schemas.git import NO_DIFF_DRIVERS, git_args
from ctxlake.schemas.roots import check_ctx_links, git_toplevel
from ctxlake.serve.api.handoff import git_diff_stat
from ctxlake.tasks.cochange import commits
from ctxlake.tasks.compact import git_commits

HOOKS = ("fsmonitor", "clean", "process", "textconv", "external", "gpg")


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env).stdout


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, Path]:
    """(repo, markers): a repository whose config names a script per hook; each script leaves a
    file named after its hook in `markers` when git runs it. HEAD is a commit carrying a signature,
    the work tree has a change, and .ctx/knowledge is a committed link out of the project."""
    repo, markers, outside = tmp_path / "archive", tmp_path / "markers", tmp_path / "outside"
    for folder in (repo, markers, outside):
        folder.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    (repo / "app.py").write_text("x = 1\n")
    (repo / ".ctx").mkdir()
    (repo / ".ctx" / "knowledge").symlink_to(outside)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    tree = _git(repo, "rev-parse", "HEAD^{tree}").strip()
    parent = _git(repo, "rev-parse", "HEAD").strip()
    stamp = int((datetime.now(UTC) - timedelta(hours=1)).timestamp())
    signed = (f"tree {tree}\nparent {parent}\nauthor t <t@t> {stamp} +0000\ncommitter t <t@t> {stamp} +0000\n"
              "gpgsig -----BEGIN PGP SIGNATURE-----\n \n wsBcBAABCAAQBQJ\n -----END PGP SIGNATURE-----\n\nsigned\n")
    sha = subprocess.run(["git", "-C", str(repo), "hash-object", "-t", "commit", "-w", "--stdin"], input=signed,
                         capture_output=True, text=True, check=True).stdout.strip()
    _git(repo, "update-ref", "HEAD", sha)
    scripts = repo / "tools"
    scripts.mkdir()
    for hook in HOOKS:
        script = scripts / f"{hook}.sh"
        # A clean filter must pass the content through; the rest may fail once they have run.
        script.write_text(f"#!/bin/sh\ntouch '{markers / hook}'\n" + ("cat\n" if hook == "clean" else "exit 1\n"))
        script.chmod(0o755)
    (repo / ".gitattributes").write_text("*.py filter=evil diff=conv\n")
    for key, hook in [("core.fsmonitor", "fsmonitor"), ("filter.evil.clean", "clean"), ("filter.evil.process", "process"),
                      ("diff.conv.textconv", "textconv"), ("diff.external", "external"), ("gpg.program", "gpg")]:
        _git(repo, "config", key, str(scripts / f"{hook}.sh"))
    _git(repo, "config", "log.showSignature", "true")
    (repo / "app.py").write_text("x = 2\ny = 3\n")
    return repo, markers


def ran(markers: Path) -> list[str]:
    return sorted(p.name for p in markers.iterdir())


def test_the_hostile_repository_runs_its_commands_under_plain_git(hostile: tuple[Path, Path]) -> None:
    """The fixture is live: the calls below would run these without git_args."""
    repo, markers = hostile
    subprocess.run(["git", "-C", str(repo), "diff", "HEAD~1"], capture_output=True, check=False)
    subprocess.run(["git", "-C", str(repo), "log", "-n", "1"], capture_output=True, check=False)
    subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=False)
    assert {"fsmonitor", "gpg", "process"} <= set(ran(markers))
    # The failing process filter stops a diff before its drivers: without it, they run too.
    subprocess.run(["git", "-C", str(repo), "-c", "filter.evil.process=", "diff", "HEAD~1"], capture_output=True, check=False)
    subprocess.run(["git", "-C", str(repo), "-c", "filter.evil.process=", "diff", "--no-ext-diff", "HEAD~1"],
                   capture_output=True, check=False)
    assert {"external", "textconv"} <= set(ran(markers))


def test_ctxs_git_calls_run_none_of_the_repositorys_commands(hostile: tuple[Path, Path]) -> None:
    repo, markers = hostile
    now = datetime.now(UTC)
    stat = git_diff_stat(str(repo), now - timedelta(minutes=30), now)  # the work tree against the last commit
    assert "app.py" in stat
    with pytest.raises(ConfigError, match="symlink committed"):  # found through `git ls-files`
        check_ctx_links(repo)
    assert [c.sha for c in commits(repo, None)][:1] == [_git(repo, "rev-parse", "HEAD").strip()]  # the signed one
    assert git_commits(str(repo), [(now - timedelta(hours=2), now)]) != [[]]
    assert git_toplevel(repo) == repo.resolve()
    # A patch of the work tree, as a later caller might ask for one: no drivers either.
    patch = subprocess.run(git_args(repo, "diff", *NO_DIFF_DRIVERS, "HEAD~1", work_tree=True),
                           capture_output=True, text=True, check=False)
    assert patch.returncode == 0 and "+y = 3" in patch.stdout, patch.stderr
    assert ran(markers) == []


def test_only_the_repositorys_own_filter_drivers_are_emptied_and_only_for_work_tree_calls(
        hostile: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver the repository's config defines, or includes from another file, is emptied; the
    user's own (global) ones, such as git-lfs's, still apply."""
    repo, _ = hostile
    included = tmp_path / "included.cfg"
    included.write_text('[filter "side"]\n\tprocess = ./tools/process.sh\n')
    _git(repo, "config", "include.path", str(included))
    user = tmp_path / "user.gitconfig"
    user.write_text('[filter "lfs"]\n\tclean = git-lfs clean -- %f\n\tprocess = git-lfs filter-process\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(user))
    assert "filter.evil.clean=" not in git_args(repo, "log")
    work = git_args(repo, "diff", work_tree=True)
    assert {"filter.evil.clean=", "filter.evil.smudge=", "filter.evil.process=", "filter.side.process="} <= set(work)
    assert not any(arg.startswith("filter.lfs.") for arg in work)
    assert work[-1] == "diff" and "core.fsmonitor=false" in work
