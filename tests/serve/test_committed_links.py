"""What a clone can commit under .ctx/ must not carry ctx's reads or writes out of the project: a
symlinked .ctx/ or lake, a knowledge record linked to a private file, a config.toml that is not a file."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import git

from ctxlake.errors import ConfigError
from ctxlake.schemas.config import load_settings
from ctxlake.tasks.knowledge import MAX_RECORD_BYTES, load_records


def _clone(tmp_path: Path, make_repo: Callable[..., Path], links: dict[str, str], name: str = "repo") -> Path:
    """A repository whose author committed the given symlinks (path -> target), cloned."""
    upstream = make_repo({"app.py": "print('hi')\n"}, name=f"upstream-{name}", commit=False)
    for rel, target in links.items():
        (upstream / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, upstream / rel)
    git(upstream, "add", "-A")
    git(upstream, "commit", "-q", "-m", "links")
    clone = tmp_path / f"clone-{name}"
    git(tmp_path, "clone", "-q", str(upstream), str(clone))
    return clone


@pytest.mark.usefixtures("fake_embedder")
def test_a_committed_ctx_link_out_of_the_project_is_refused_and_nothing_is_written_there(
        tmp_path: Path, make_repo: Callable[..., Path], cli: Callable[..., Any]) -> None:
    outside = tmp_path / "victim"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine\n")
    clone = _clone(tmp_path, make_repo, {".ctx": str(outside)})

    ran = cli("run", "index", "--json", cwd=clone)

    assert ran.exit_code != 0
    assert "symlink committed to the repository" in ran.stderr and "git rm .ctx" in ran.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]  # no lake, config or knowledge made there
    cleaned = cli("clean", "--yes", cwd=clone)
    assert cleaned.exit_code != 0 and (outside / "keep.txt").exists()


def test_a_committed_lake_or_knowledge_link_is_refused_but_one_the_user_made_is_theirs(
        tmp_path: Path, make_repo: Callable[..., Path]) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    for part in ("lake", "knowledge"):
        clone = _clone(tmp_path, make_repo, {f".ctx/{part}": str(outside)}, name=part)
        with pytest.raises(ConfigError, match=f"ctx/{part} is a symlink committed"):
            load_settings(clone)

    # The user's own link (git does not track it): a lake on a bigger disk.
    own = make_repo({"app.py": "x = 1\n", ".ctx/config.toml": ""}, name="own")
    os.symlink(outside, own / ".ctx" / "lake")
    assert load_settings(own).lake_dir.resolve() == outside.resolve()
    # A committed link that stays inside the project is harmless.
    inside = _clone(tmp_path, make_repo, {".ctx/knowledge": "../notes"}, name="inside")
    (inside / "notes").mkdir()
    assert load_settings(inside).knowledge_dir.resolve() == (inside / "notes").resolve()


def test_knowledge_records_are_read_inside_the_knowledge_folder_only(
        tmp_path: Path, make_repo: Callable[..., Path]) -> None:
    secret = tmp_path / "id_rsa"
    secret.write_text("---\ntitle: stolen\n---\nPRIVATE KEY MATERIAL\n")
    clone = _clone(tmp_path, make_repo, {
        ".ctx/knowledge/decisions/leak.md": str(secret),
        ".ctx/knowledge/decisions/climb.md": "../../../../id_rsa",
        ".ctx/knowledge/decisions/alias.md": "../insights/real.md",
    })
    (clone / ".ctx/knowledge/insights").mkdir()
    (clone / ".ctx/knowledge/insights/real.md").write_text("---\ntitle: real fact\n---\nthe build uses make\n")
    fifo = clone / ".ctx/knowledge/insights/pipe.md"
    os.mkfifo(fifo)
    (clone / ".ctx/knowledge/insights/huge.md").write_bytes(b"x" * (MAX_RECORD_BYTES + 1))

    done: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: done.update(result=load_records(clone / ".ctx/knowledge", clone)),
                              daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():  # a FIFO opened for reading blocks until a writer comes: free it
        with open(fifo, "wb"):
            pass
        pytest.fail("reading the knowledge folder blocked on a FIFO")
    records, problems = done["result"]

    assert all("PRIVATE" not in r.body for r in records)
    assert sorted(r.title for r in records) == ["real fact", "real fact"]  # the file and the link to it
    joined = "\n".join(problems)
    for name in ("leak.md", "climb.md", "pipe.md", "huge.md"):
        assert name in joined, (name, problems)
    assert "FIFO" in joined and "KiB" in joined


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_config_that_is_not_a_small_regular_file_is_a_clear_error(
        tmp_path: Path, make_repo: Callable[..., Path], kind: str) -> None:
    repo = make_repo({"app.py": "x = 1\n"}, name=kind)
    config = repo / ".ctx" / "config.toml"
    config.parent.mkdir()
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "device":
        os.symlink("/dev/zero", config)
    else:
        config.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="not a regular file" if kind != "huge" else "larger than"):
        load_settings(repo)
