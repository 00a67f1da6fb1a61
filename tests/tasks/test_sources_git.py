"""Git sources against real bare repositories in tmp (file:// URLs): refs, pins, sparse paths, updates, limits, shared clones."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import git, write_files

from ctxlake.errors import ConfigError, InputError, SourceError
from ctxlake.schemas.config import IndexSettings, SourcesSettings
from ctxlake.schemas.sources import (
    SourceSpec,
    clean_path,
    origin_path,
    trust_sources,
    validate_name,
)
from ctxlake.tasks.sources import (
    check_access,
    classify_origin,
    fetch_git,
    fetch_local,
    name_for,
    overlap_with_project,
    release_storage,
    storage_dir,
    storage_key,
)

LIB = {
    "libs/core/tools.py": "def make_tool(name):\n    return {'name': name}\n",
    "libs/core/graph.py": "class Graph:\n    pass\n",
    "docs/guide.md": "# Guide\n\nMake a tool.\n",
    "tests/test_tools.py": "def test_tool():\n    assert True\n",
    "README.md": "# lib\n",
}


def files_in(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file() and ".git" not in p.parts}


@pytest.fixture
def remote(make_repo: Callable[..., Path], tmp_path: Path) -> tuple[Path, str]:
    """A work repo with a tag v1 (annotated) and one more commit, pushed to a bare repo."""
    work = make_repo(LIB, name="lib")
    git(work, "tag", "-a", "v1", "-m", "release 1")
    write_files(work, {"libs/core/tools.py": LIB["libs/core/tools.py"] + "\n\ndef v2():\n    return 2\n"})
    git(work, "commit", "-qam", "v2")
    bare = tmp_path / "lib.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    git(bare, "config", "uploadpack.allowFilter", "true")
    return work, f"file://{bare}"


def spec(url: str, **kw: object) -> SourceSpec:
    return SourceSpec(name="lib", type="git", origin=url, **kw)  # type: ignore[arg-type]


def fetch(s: SourceSpec, home: Path, limits: SourcesSettings | None = None, user: Path | None = None):  # type: ignore[no-untyped-def]
    return fetch_git.fn(s, storage_dir(home, s), limits or SourcesSettings(), user or home / "project")


def test_default_branch_is_shallow_and_resolved(remote: tuple[Path, str], tmp_path: Path) -> None:
    work, url = remote
    got = fetch(spec(url), tmp_path / "home")
    assert got.ref_kind == "default" and got.changed and got.status == "ok"
    assert got.resolved == git(work, "rev-parse", "HEAD")
    assert files_in(got.root) == set(LIB)
    assert git(got.root, "rev-parse", "--is-shallow-repository") == "true"
    assert git(got.root, "rev-list", "--count", "HEAD") == "1"


def test_tag_and_commit_are_pinned(remote: tuple[Path, str], tmp_path: Path) -> None:
    work, url = remote
    tagged = fetch(spec(url, ref="v1"), tmp_path / "home")
    # The annotated tag is recorded as the commit it points at, not the tag object.
    assert tagged.ref_kind == "tag" and tagged.resolved == git(work, "rev-parse", "v1^{commit}")
    assert "def v2" not in (tagged.root / "libs/core/tools.py").read_text()
    first = git(work, "rev-parse", "HEAD~1")
    pinned = fetch(spec(url, ref=first), tmp_path / "home")
    assert pinned.ref_kind == "commit" and pinned.resolved == first
    assert git(pinned.root, "rev-list", "--count", "HEAD") == "1"
    # A pinned commit needs no remote once it is here: the remote can even be gone.
    bare = Path(url.removeprefix("file://"))
    bare.rename(bare.with_name("moved.git"))
    again = fetch(spec(url, ref=first), tmp_path / "home")
    assert not again.changed and again.resolved == first


def test_sparse_paths_check_out_only_those(remote: tuple[Path, str], tmp_path: Path) -> None:
    _, url = remote
    got = fetch(spec(url, paths=["libs/core", "docs/guide.md"]), tmp_path / "home")
    assert files_in(got.root) == {"libs/core/tools.py", "libs/core/graph.py", "docs/guide.md"}
    assert git(got.root, "config", "remote.origin.partialclonefilter") == "blob:none"
    # The index narrows to the same paths (anchored, so a bare folder name cannot miss).
    include = spec(url, paths=["libs/core"]).index_settings(IndexSettings()).include
    assert include == ["/libs/core", "/libs/core/**"]


def test_a_missing_paths_entry_is_an_error_for_git_as_for_local(remote: tuple[Path, str], tmp_path: Path) -> None:
    """A mistyped --paths made a git source of 0 files with status ok; a local one failed."""
    _, url = remote
    with pytest.raises(SourceError, match=r"--paths 'does/not/exist', 'lib' not found in .* at its default branch"):
        fetch(spec(url, paths=["libs/core", "does/not/exist", "lib"]), tmp_path / "home")
    assert not (storage_dir(tmp_path / "home", spec(url, paths=["libs/core", "does/not/exist", "lib"])) / "tree").exists()
    notes = tmp_path / "notes"
    notes.mkdir()
    with pytest.raises(SourceError, match=r"--paths 'does/not/exist' not found in"):
        fetch_local.fn(SourceSpec(name="n", type="local", origin=str(notes), paths=["does/not/exist"]), tmp_path)


def test_update_after_new_commit_touches_only_changed_files(remote: tuple[Path, str], tmp_path: Path) -> None:
    work, url = remote
    home = tmp_path / "home"
    first = fetch(spec(url), home)
    before = {p: (first.root / p).stat().st_mtime_ns for p in LIB}
    unchanged = fetch(spec(url), home)
    assert not unchanged.changed and unchanged.resolved == first.resolved
    write_files(work, {"docs/guide.md": "# Guide\n\nMake two tools.\n"})
    git(work, "commit", "-qam", "docs")
    git(work, "push", "-q", url.removeprefix("file://"), "main")
    updated = fetch(spec(url), home)
    assert updated.changed and updated.resolved == git(work, "rev-parse", "HEAD") != first.resolved
    after = {p: (updated.root / p).stat().st_mtime_ns for p in LIB}
    assert [p for p in LIB if after[p] != before[p]] == ["docs/guide.md"]
    assert git(updated.root, "rev-list", "--count", "HEAD") == "1"  # still depth 1


def test_bad_refs_and_remotes_are_clear_errors(remote: tuple[Path, str], tmp_path: Path) -> None:
    work, url = remote
    with pytest.raises(InputError, match="no branch or tag 'nope'"):
        fetch(spec(url, ref="nope"), tmp_path / "home")
    short = git(work, "rev-parse", "--short", "HEAD")
    with pytest.raises(InputError, match="full 40-character sha"):
        fetch(spec(url, ref=short), tmp_path / "home")
    with pytest.raises(SourceError, match=r"`git ls-remote` failed"):
        fetch(spec(f"file://{tmp_path}/missing.git"), tmp_path / "home")
    # A failed first fetch leaves no half-made clone behind.
    assert not (storage_dir(tmp_path / "home", spec(f"file://{tmp_path}/missing.git")) / "tree").exists()
    with pytest.raises(InputError, match="invalid --ref"):
        spec(url, ref="--upload-pack=evil")


def test_file_count_limit_refuses_before_checkout(remote: tuple[Path, str], tmp_path: Path) -> None:
    _, url = remote
    with pytest.raises(SourceError, match=r"has 5 files, over the limit of 3") as err:
        fetch(spec(url), tmp_path / "home", SourcesSettings(max_files=3))
    assert err.value.hint and "--paths" in err.value.hint
    assert not (storage_dir(tmp_path / "home", spec(url)) / "tree").exists()
    got = fetch(spec(url, paths=["libs/core"]), tmp_path / "home", SourcesSettings(max_files=3))
    assert len(files_in(got.root)) == 2
    with pytest.raises(SourceError, match="checks out to"):
        fetch(spec(url, ref="v1"), tmp_path / "home", SourcesSettings(max_bytes=10))


def test_clone_is_shared_between_projects_until_the_last_leaves(remote: tuple[Path, str], tmp_path: Path) -> None:
    _, url = remote
    home = tmp_path / "home"
    a, b = tmp_path / "a", tmp_path / "b"
    for project in (a, b):
        (project / ".ctx").mkdir(parents=True)
    first = fetch(spec(url), home, user=a)
    second = fetch(spec(url), home, user=b)
    assert first.root == second.root and not second.changed
    folder = storage_dir(home, spec(url))
    assert release_storage(folder, a) is False and first.root.is_dir()
    assert release_storage(folder, b) is True and not folder.exists()
    # Different refs or paths are different clones.
    assert storage_key(spec(url)) != storage_key(spec(url, ref="v1")) != storage_key(spec(url, paths=["docs"]))


def test_local_source_and_origin_classification(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    assert classify_origin(str(notes)) == ("local", str(notes.resolve()))
    assert classify_origin("https://github.com/org/repo/") == ("git", "https://github.com/org/repo")
    assert classify_origin("git@github.com:org/repo.git")[0] == "git"
    assert classify_origin("https://docs.example.com/llms.txt")[0] == "web"
    assert classify_origin("https://docs.example.com/guide/", docs=True)[0] == "web"
    assert classify_origin("https://github.com/org/repo.git", docs=True)[0] == "git"
    with pytest.raises(InputError, match="neither an existing folder nor a URL"):
        classify_origin(str(tmp_path / "nope"))
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        classify_origin(str(tmp_path / "file.txt"))
    local = SourceSpec(name="notes", type="local", origin=str(notes))
    assert fetch_local.fn(local, tmp_path).root == notes
    os.rmdir(notes)
    with pytest.raises(SourceError, match="is gone"):
        fetch_local.fn(local, tmp_path)


@pytest.mark.parametrize(("kind", "origin", "docs", "name"), [
    ("git", "https://github.com/pallets/flask", False, "flask"),
    ("git", "git@github.com:pallets/flask.git", False, "flask"),
    ("git", "file:///srv/mirrors/django.git", True, "django-docs"),
    ("local", "/srv/shared/team notes", False, "team-notes"),
    ("local", "/srv/project/docs", True, "docs"),
    ("web", "https://www.example.org/llms.txt", False, "example.org"),
    ("web", "http://127.0.0.1:8765/llms.txt", True, "127.0.0.1-docs"),
])
def test_a_source_added_without_a_name_is_named_after_its_origin(kind: str, origin: str, docs: bool, name: str) -> None:
    assert name_for(kind, origin, docs) == name
    validate_name(name)


def test_a_local_source_may_not_be_the_project_and_overlapping_it_is_a_warning(tmp_path: Path) -> None:
    project = tmp_path / "mono" / "service"
    (project / "vendor").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(InputError, match="is the project itself"):
        overlap_with_project(project / "vendor" / "..", project)
    inside = overlap_with_project(project / "vendor", project)
    assert inside is not None and "inside the project" in inside
    holding = overlap_with_project(tmp_path / "mono", project)
    assert holding is not None and "holds the project" in holding and "--exclude" in holding
    assert overlap_with_project(tmp_path / "elsewhere", project) is None


def test_an_origin_with_no_usable_name_asks_for_one() -> None:
    with pytest.raises(InputError, match="cannot take a source name") as caught:
        name_for("git", "https://example.org/...git")
    assert caught.value.hint is not None and "ctx add NAME ORIGIN" in caught.value.hint
    with pytest.raises(InputError, match="cannot take a source name"):  # the project's own rows' name
        name_for("local", "/srv/code/project")


@pytest.mark.parametrize("name", ["../x", "a/b", "project", ".hidden", "", "x" * 65, "a b"])
def test_source_names_are_one_safe_path_component(name: str) -> None:
    with pytest.raises(InputError):
        validate_name(name)


@pytest.mark.parametrize("path", ["../up", "/abs", "a/../../b", "", "!neg"])
def test_paths_cannot_leave_the_source(path: str) -> None:
    with pytest.raises(InputError):
        clean_path(path)


def test_a_local_source_never_reads_a_system_folder_whoever_declared_it(tmp_path: Path) -> None:
    """`ctx add x /etc` was refused, but the same folder written into sources.toml was synced."""
    project, home = tmp_path / "p", tmp_path / "home"
    (project / ".ctx").mkdir(parents=True)
    for origin in ("/etc", "/proc/self", "/", "../../../../../../../etc"):
        local = SourceSpec(name="sys", type="local", origin=origin)
        with pytest.raises(InputError, match="system folder"):
            fetch_local.fn(local, project)
        trust_sources(project, home, [local])  # not even a trusted entry reads them
        with pytest.raises(InputError, match="system folder"):
            check_access(local, project, home)


@pytest.mark.parametrize("origin", ["file://localhost{}", "file://{}"])
def test_a_file_url_names_the_folder_it_reads_with_or_without_localhost(tmp_path: Path, origin: str) -> None:
    """file://localhost/abs is /abs: it was taken for <project>/localhost/abs, so the trust prompt
    and the system-folder check looked at a path that git would not read."""
    from ctxlake.schemas.sources import reads_outside

    project, repo = tmp_path / "p", tmp_path / "elsewhere" / "repo"
    (project / ".ctx").mkdir(parents=True)
    spec = SourceSpec(name="r", type="git", origin=origin.format(repo))
    assert reads_outside(spec, project) == repo.resolve()


def test_a_declared_folder_outside_the_project_is_read_once_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   remote: tuple[Path, str]) -> None:
    project, home = tmp_path / "p", tmp_path / "home"
    write_files(project, {".ctx/config.toml": "", "vendor/lib/a.md": "# A\n", "src/app.py": "x = 1\n"})
    write_files(tmp_path, {"notes/n.md": "# N\n", "userhome/private/p.md": "# P\n"})
    monkeypatch.setenv("HOME", str(tmp_path / "userhome"))
    monkeypatch.chdir(project / "src")  # the current folder plays no part
    inside = SourceSpec(name="vendored", type="local", origin="vendor/lib")
    relative = SourceSpec(name="notes", type="local", origin="../notes")
    tilde = SourceSpec(name="private", type="local", origin="~/private")
    by_path = SourceSpec(name="lib", type="git", origin=remote[1])
    assert origin_path(relative, project) == (tmp_path / "notes").resolve()
    assert origin_path(tilde, project) == (tmp_path / "userhome" / "private").resolve()
    assert fetch_local.fn(relative, project).root == (tmp_path / "notes").resolve()
    assert fetch_local.fn(tilde, project).root == (tmp_path / "userhome" / "private").resolve()
    check_access(inside, project, home)  # inside the project: nothing to trust
    assert origin_path(SourceSpec(name="gh", type="git", origin="https://github.com/o/r"), project) is None
    for spec in (relative, tilde, by_path):
        with pytest.raises(ConfigError, match=f"source '{spec.name}' reads .*not trusted") as refused:
            check_access(spec, project, home)
        assert "ctx trust" in str(refused.value)
    trust_sources(project, home, [relative, tilde, by_path])
    for spec in (relative, tilde, by_path):
        check_access(spec, project, home)
    # A pull that points a trusted name somewhere else is a new, untrusted entry.
    moved = relative.model_copy(update={"origin": "../../elsewhere"})
    with pytest.raises(ConfigError, match="not trusted"):
        check_access(moved, project, home)
