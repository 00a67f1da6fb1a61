"""The race-safe opener: no symlink out, nothing hidden or .git through a link, regular files only,
bounded reads, and no escape while a path flips between a file and a link to an outside file."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from ctxlake.errors import InputError
from ctxlake.tasks.safe_io import NotRegularFile, TooLarge, UnsafePath, open_inside

OUTSIDE = b"OUTSIDE-SECRET"


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "docs" / "a.md").write_bytes(b"inside a\n")
    (root / "docs" / "sub" / "b.md").write_bytes(b"inside b\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_bytes(b"[core] git config\n")
    (root / ".env").write_bytes(b"TOKEN=x\n")
    (tmp_path / "outside.txt").write_bytes(OUTSIDE)
    return root


def test_plain_and_inside_links(tree: Path) -> None:
    assert open_inside(tree, "docs/a.md", 100) == b"inside a\n"
    (tree / "docs" / "rel.md").symlink_to("sub/b.md")
    (tree / "docs" / "up.md").symlink_to("../docs/a.md")
    (tree / "docs" / "abs.md").symlink_to(tree / "docs" / "sub" / "b.md")
    (tree / "linkdir").symlink_to("docs/sub")
    assert open_inside(tree, "docs/rel.md", 100) == b"inside b\n"
    assert open_inside(tree, "docs/up.md", 100) == b"inside a\n"
    assert open_inside(tree, "docs/abs.md", 100) == b"inside b\n"
    assert open_inside(tree, "linkdir/b.md", 100) == b"inside b\n"


@pytest.mark.parametrize("rel", ["/etc/passwd", "../outside.txt", "docs/../../outside.txt", "a\0b",
                                 ".git/config", "docs/.hidden.md", ".env", ""])
def test_bad_paths_refused(tree: Path, rel: str) -> None:
    with pytest.raises(InputError):
        open_inside(tree, rel, 100)


def test_links_out_hidden_and_git_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "docs" / "out.md").symlink_to(tmp_path / "outside.txt")
    (tree / "docs" / "out_rel.md").symlink_to("../../outside.txt")
    (tree / "docs" / "git.md").symlink_to("../.git/config")
    (tree / "docs" / "git_abs.md").symlink_to(tree / ".git" / "config")
    (tree / "docs" / "env.md").symlink_to("../.env")
    (tree / "outdir").symlink_to(tmp_path)
    (tree / "docs" / "loop.md").symlink_to("loop.md")
    for rel in ["docs/out.md", "docs/out_rel.md", "docs/git.md", "docs/git_abs.md", "docs/env.md",
                "outdir/outside.txt", "docs/loop.md"]:
        with pytest.raises(UnsafePath):
            open_inside(tree, rel, 1000, allow_hidden=True)
    # allow_hidden lets the asked path hold hidden folders (indexed .github/...), never .git.
    with pytest.raises(UnsafePath):
        open_inside(tree, ".git/config", 1000, allow_hidden=True)
    assert open_inside(tree, ".env", 1000, allow_hidden=True) == b"TOKEN=x\n"
    (tree / ".github").mkdir()
    (tree / ".github" / "ci.yml").write_bytes(b"on: push\n")
    assert open_inside(tree, ".github/ci.yml", 1000, allow_hidden=frozenset({".github"})) == b"on: push\n"
    with pytest.raises(UnsafePath, match="hidden"):
        open_inside(tree, ".env", 1000, allow_hidden=frozenset({".github"}))


def test_fifo_returns_at_once(tree: Path) -> None:
    os.mkfifo(tree / "docs" / "pipe.md")
    (tree / "docs" / "zero.md").symlink_to("/dev/zero")
    (tree / "docs" / "zero_in.md").symlink_to("pipe.md")
    started = time.monotonic()
    with pytest.raises(NotRegularFile, match="FIFO"):
        open_inside(tree, "docs/pipe.md", 100)
    with pytest.raises(NotRegularFile, match="FIFO"):
        open_inside(tree, "docs/zero_in.md", 100)
    with pytest.raises(UnsafePath):
        open_inside(tree, "docs/zero.md", 100)
    with pytest.raises(NotRegularFile, match="folder"):
        open_inside(tree, "docs/sub", 100)
    assert time.monotonic() - started < 2


def test_huge_sparse_file_is_bounded(tree: Path) -> None:
    big = tree / "docs" / "big.md"
    with big.open("wb") as fh:
        fh.truncate(300 * 1024 * 1024)
    started = time.monotonic()
    with pytest.raises(TooLarge) as info:
        open_inside(tree, "docs/big.md", 1_000_000)
    assert info.value.size == 300 * 1024 * 1024
    assert time.monotonic() - started < 1


def test_swap_race_never_reads_outside(tree: Path, tmp_path: Path) -> None:
    path = tree / "docs" / "race.md"
    path.write_bytes(b"inside race\n")
    stop = threading.Event()

    def flip() -> None:
        tmp_link = tree / "docs" / ".race-link"
        tmp_file = tree / "docs" / ".race-file"
        while not stop.is_set():
            tmp_link.unlink(missing_ok=True)
            tmp_link.symlink_to(tmp_path / "outside.txt")
            os.replace(tmp_link, path)
            tmp_file.write_bytes(b"inside race\n")
            os.replace(tmp_file, path)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    outside = served = refused = 0
    try:
        for _ in range(2000):
            try:
                data = open_inside(tree, "docs/race.md", 1000)
            except (InputError, FileNotFoundError):
                refused += 1
                continue
            served += 1
            outside += OUTSIDE in data
    finally:
        stop.set()
        flipper.join()
    assert outside == 0
    assert served > 0 and refused > 0  # the race was really exercised both ways
