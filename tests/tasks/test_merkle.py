"""Scan and Merkle diff over real folders: ignore rules, binary/huge files, symlinks, fast path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import permission_bound, write_files

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks import merkle, safe_io, walk
from ctxlake.tasks import scan as scan_stage
from ctxlake.tasks.merkle import Diff, Tree, diff_trees, load_snapshot, save_snapshot
from ctxlake.tasks.scan import scan_tree


def scan(root: Path, index: IndexSettings | None = None, previous: Tree | None = None) -> Tree:
    tree, _ = scan_tree(root, index or IndexSettings(), previous)
    return tree


def indexed(tree: Tree) -> set[str]:
    return {p for p, e in tree.entries.items() if e.status == "indexed"}


def test_ignore_rules_defaults_gitignore_nested_and_globs(tmp_path: Path) -> None:
    write_files(tmp_path, {
        "src/app.py": "x = 1\n",
        "src/app.log": "log\n",
        "src/keep.log": "kept by negation\n",
        "src/.gitignore": "!keep.log\ngenerated/\n",
        "src/generated/out.py": "y = 2\n",
        ".gitignore": "*.log\n/secret.txt\n",
        "secret.txt": "s\n",
        "docs/secret.txt": "not anchored here\n",
        "node_modules/lib/index.js": "z\n",
        "pkg/__pycache__/m.cpython-311.pyc": "c",
        "myenv/pyvenv.cfg": "home = /usr\n",
        "myenv/lib/site.py": "v\n",
        ".git/config": "[core]\n",
        "notes/todo.md": "# todo\n",
        "vendor/big.py": "v = 1\n",
    })
    tree = scan(tmp_path, IndexSettings(exclude=["vendor/"]))
    assert indexed(tree) == {
        ".gitignore", "src/.gitignore", "src/app.py", "src/keep.log", "docs/secret.txt", "notes/todo.md",
    }
    only_py = scan(tmp_path, IndexSettings(include=["*.py"]))
    assert indexed(only_py) == {"src/app.py", "vendor/big.py"}
    no_gitignore = scan(tmp_path, IndexSettings(respect_gitignore=False))
    assert {"src/app.log", "secret.txt", "src/generated/out.py"} <= indexed(no_gitignore)


def test_ignore_all_then_reinclude_folders_matches_git(tmp_path: Path) -> None:
    # zeromicro/go-zero's idiom: ignore everything, re-include names with a dot and every folder.
    # git keeps core/x/a.go and drops the extensionless core/x/tool; an earlier matcher dropped
    # every folder (and so indexed nothing).
    write_files(tmp_path, {
        ".gitignore": "*\n!*.*\n!*/\nbuild/\n",
        "core/x/a.go": "package x\n",
        "core/x/tool": "binary-ish\n",
        "core/build/gen.go": "package gen\n",
        "main.go": "package main\n",
    })
    kept = indexed(scan(tmp_path))
    assert kept == {".gitignore", "core/x/a.go", "main.go"}
    import shutil
    import subprocess

    if shutil.which("git"):
        subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
        listed = subprocess.run(["git", "ls-files", "-o", "--exclude-standard"], cwd=tmp_path, check=True,
                                capture_output=True, text=True).stdout.split()
        assert set(listed) == kept


def test_binary_huge_and_unreadable_files_are_skipped_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_files(tmp_path, {
        "a.py": "print('hi')\n",
        "image.png": b"\x89PNG\r\n\x1a\n....",
        "blob.dat2": b"abc\x00def",
        "huge.txt": "x" * 5000,
        "locked.py": "secret = 1\n",
    })
    real_read = safe_io.read_regular

    def faulty(path: Path, max_bytes: int) -> bytes:  # root reads anything, so the fault is injected
        if path.name == "locked.py":
            raise PermissionError(13, "Permission denied")
        return real_read(path, max_bytes)

    monkeypatch.setattr(safe_io, "read_regular", faulty)
    tree, stats = scan_tree(tmp_path, IndexSettings(max_file_bytes=4000))
    status = {p: e.status for p, e in tree.entries.items()}
    assert status == {"a.py": "indexed", "image.png": "binary", "blob.dat2": "binary",
                      "huge.txt": "too_large", "locked.py": "unreadable"}
    assert stats.skipped == {"binary": 2, "too_large": 1, "unreadable": 1}


# Run in a child the kernel holds to permissions (see permission_bound): a scan, then the same
# tree after `chmod` gives the rights back (mtimes untouched), then the watcher's path for both ways.
UNREADABLE_SCENARIO = r"""
import json, os, sys
from pathlib import Path
from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks.merkle import diff_trees
from ctxlake.tasks.scan import rehash_paths, scan_tree
from ctxlake.tasks.walk import PathFilter

root, index = Path(sys.argv[1]), IndexSettings()
keep = PathFilter(root, index)

def statuses(tree):
    return {p: e.status for p, e in tree.entries.items()}

def watched(tree, *events):  # the watcher rehashes the event paths only: it must agree with a scan
    new = tree.update(rehash_paths(root, set(events), tree, keep, index.max_file_bytes))
    fresh = scan_tree(root, index)[0]
    assert (new.entries, new.root_hash) == (fresh.entries, fresh.root_hash), (statuses(new), statuses(fresh))
    return new

first, stats = scan_tree(root, index)
out = {"first": statuses(first), "skipped": stats.skipped, "unreadable": getattr(stats, "unreadable", None)}
os.chmod(root / "locked.py", 0o644)
os.chmod(root / "shut", 0o755)
second, _ = scan_tree(root, index, first)
out["second"], out["diff"] = statuses(second), list(diff_trees(first, second))
out["watched_open"] = statuses(watched(first, "locked.py", "shut"))
os.chmod(root / "shut", 0)
out["watched_shut"] = statuses(watched(second, "shut"))
os.chmod(root / "shut", 0o755)
print(json.dumps(out))
"""


def test_unreadable_files_and_folders_are_recorded_and_read_again_once_permitted(tmp_path: Path) -> None:
    write_files(tmp_path, {"ok.py": "x = 1\n", "locked.py": "y = 2\n", "shut/inner.py": "z = 3\n",
                           "open/more.py": "w = 4\n"})
    (tmp_path / "locked.py").chmod(0)
    (tmp_path / "shut").chmod(0)
    via = permission_bound(tmp_path / "locked.py")
    done = subprocess.run([*via, sys.executable, "-c", UNREADABLE_SCENARIO, str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    (tmp_path / "shut").chmod(0o755)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["first"] == {"ok.py": "indexed", "open/more.py": "indexed", "locked.py": "unreadable",
                            "shut": "unreadable_folder"}
    assert out["skipped"] == {"unreadable": 1, "unreadable_folder": 1}
    assert out["unreadable"] == ["locked.py", "shut/"]
    # chmod changes no mtime: the snapshot's "unreadable" must not be taken as still true.
    readable = {"ok.py": "indexed", "open/more.py": "indexed", "locked.py": "indexed", "shut/inner.py": "indexed"}
    assert out["second"] == readable
    assert out["diff"] == [["locked.py", "shut/inner.py"], [], []]
    assert out["watched_open"] == readable
    assert out["watched_shut"] == {**out["first"], "locked.py": "indexed"}


def test_a_folder_entry_taking_its_folders_place_updates_like_a_rebuild() -> None:
    from ctxlake.tasks.merkle import Entry

    inner = Entry("shut/inner.py", 6, 1, "h1", "indexed")
    folder = Entry("shut", 0, 2, "unreadable_folder:0", "unreadable_folder")
    ok = Entry("ok.py", 6, 1, "h0", "indexed")
    listed, closed = Tree.build({"ok.py": ok, "shut/inner.py": inner}), Tree.build({"ok.py": ok, "shut": folder})
    # The watcher hands its changes over in any order; each way the result is the fresh tree's.
    for changes in ({"shut/inner.py": None, "shut": folder}, {"shut": folder, "shut/inner.py": None}):
        assert listed.update(changes).dirs == closed.dirs
    for changes in ({"shut": None, "shut/inner.py": inner}, {"shut/inner.py": inner, "shut": None}):
        assert closed.update(changes).dirs == listed.dirs


def test_symlinks_are_not_followed_and_loops_are_harmless(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_files(outside, {"secret.py": "key = 1\n"})
    root = tmp_path / "root"
    write_files(root, {"a/b.py": "x = 1\n"})
    (root / "a" / "loop").symlink_to(root / "a")
    (root / "escape").symlink_to(outside)
    (root / "link.py").symlink_to(root / "a" / "b.py")
    tree, stats = scan_tree(root, IndexSettings())
    assert indexed(tree) == {"a/b.py"}
    assert stats.symlinks == 3


def test_fifos_are_skipped_and_counted_never_opened(tmp_path: Path) -> None:
    write_files(tmp_path, {"a.py": "x = 1\n", "sub/b.py": "y = 2\n"})
    os.mkfifo(tmp_path / "pipe.py")
    os.mkfifo(tmp_path / "sub" / ".gitignore")  # read for ignore rules: must not block either
    started = time.monotonic()
    tree, stats = scan_tree(tmp_path, IndexSettings())
    assert indexed(tree) == {"a.py", "sub/b.py"}
    assert stats.skipped.get("special") == 2
    assert time.monotonic() - started < 5
    # Listed where skipped files are (`ctx status --skipped`); they were counted and never named.
    save_snapshot(tmp_path / "lake", "project", tree)
    assert [(p, why) for p, why, _ in merkle.not_indexed(tmp_path / "lake", "project")] == [
        ("pipe.py", "special"), ("sub/.gitignore", "special")]
    assert diff_trees(tree, scan(tmp_path, previous=tree)) == Diff([], [], [])  # and the same next time
    # A file swapped for a FIFO between the scan's lstat and the read is refused, not waited on.
    assert scan_stage.hash_file(tmp_path / "pipe.py", 0, 1000) == ("special:0", "special")


def test_empty_folder_has_the_empty_root_hash(tmp_path: Path) -> None:
    tree = scan(tmp_path)
    assert tree.entries == {}
    assert tree.root_hash == Tree.build({}).root_hash


def test_merkle_hashes_are_content_addressed_and_order_free(tmp_path: Path) -> None:
    write_files(tmp_path / "one", {"a/x.py": "1", "a/y.py": "2", "b/z.py": "3"})
    write_files(tmp_path / "two", {"b/z.py": "3", "a/y.py": "2", "a/x.py": "1"})
    one, two = scan(tmp_path / "one"), scan(tmp_path / "two")
    assert one.root_hash == two.root_hash
    (tmp_path / "two" / "a" / "x.py").write_text("changed")
    changed = scan(tmp_path / "two")
    assert changed.root_hash != one.root_hash
    assert changed.dirs["b"] == one.dirs["b"]  # an untouched subtree keeps its hash
    assert changed.dirs["a"] != one.dirs["a"]


def test_diff_reports_added_modified_removed_and_skips_unchanged_subtrees(tmp_path: Path) -> None:
    write_files(tmp_path, {"keep/deep/a.py": "a", "keep/b.py": "b", "mod/c.py": "c", "gone/d.py": "d"})
    old = scan(tmp_path)
    (tmp_path / "mod" / "c.py").write_text("c2")
    (tmp_path / "gone" / "d.py").unlink()
    (tmp_path / "gone").rmdir()
    write_files(tmp_path, {"new/e.py": "e", "mod/f.py": "f"})
    new = scan(tmp_path)

    class Untouchable(dict[str, tuple[bool, str]]):
        def items(self):  # type: ignore[no-untyped-def]
            raise AssertionError("diff descended into an unchanged subtree")

        def keys(self):  # type: ignore[no-untyped-def]
            raise AssertionError("diff descended into an unchanged subtree")

    for tree in (old, new):
        tree.children["keep"] = Untouchable(tree.children["keep"])
    assert diff_trees(old, new) == Diff(added=["mod/f.py", "new/e.py"], modified=["mod/c.py"],
                                        removed=["gone/d.py"])
    assert not diff_trees(new, new)


def test_generated_text_is_skipped_and_counted(tmp_path: Path) -> None:
    # Short lines: skipped by its extension, not by the line-length rules.
    paths = "".join(f'<path d="M{i},{i % 97} L{i + 1},{i % 89} Z"/>\n' for i in range(30_000))
    svg = f'<svg xmlns="http://www.w3.org/2000/svg">\n{paths}</svg>\n'
    minified = ";".join(f"var a{i}=function(b){{return b*{i}}}" for i in range(2_000))
    normal = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(600))
    one_long_line = normal + "BLOB = '" + "ab" * 40_000 + "'\n" + normal
    write_files(tmp_path, {
        "assets/logo.svg": svg,                 # like the 883 KB one that was indexed as text
        "static/app.min.js": "var a=1;\n",     # by name, however small
        "static/app.js.map": '{"version":3}\n',
        "vendor/lib.js": minified,              # by content: one line averaging far over 300
        "src/data.py": one_long_line,           # by content: one 80,000-character line
        "src/app.py": normal,                   # long file, short lines: kept
        "src/table.md": "| a |\n" + "| " + "x" * 2_000 + " |\n" * 3,  # one long-ish line: kept
        "pnpm-lock.yaml": "lockfileVersion: 6\n" * 5_000,  # a lock file over 64 KB
        "go.sum": "example.com/m v1.0.0 h1:abc=\n",         # a small one stays
    })
    tree, stats = scan_tree(tmp_path, IndexSettings())
    assert indexed(tree) == {"src/app.py", "src/table.md", "go.sum"}
    assert stats.skipped == {"generated": 6}
    assert len(svg) > 800_000


def test_file_becoming_binary_counts_as_removed(tmp_path: Path) -> None:
    write_files(tmp_path, {"data.txt": "text"})
    old = scan(tmp_path)
    (tmp_path / "data.txt").write_bytes(b"\x00\x01\x02")
    assert diff_trees(old, scan(tmp_path)) == Diff([], [], ["data.txt"])


def test_fast_path_reuses_hashes_without_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_files(tmp_path, {"a.py": "a", "b/c.py": "c"})
    first = scan(tmp_path)
    # Pretend the previous scan ran well after these files were written (outside the racy window).
    first.scanned_at_ns = time.time_ns() + 10 * scan_stage.RACY_WINDOW_NS
    reads: list[str] = []
    real = scan_stage.hash_file
    monkeypatch.setattr(scan_stage, "hash_file", lambda p, s, m: reads.append(p.name) or real(p, s, m))
    second, stats = scan_tree(tmp_path, IndexSettings(), first)
    assert (stats.reused, stats.hashed, reads) == (2, 0, [])
    assert second.root_hash == first.root_hash


def test_racy_edit_with_same_size_and_mtime_is_still_detected(tmp_path: Path) -> None:
    write_files(tmp_path, {"a.py": "aaaa"})
    before = scan(tmp_path)
    path = tmp_path / "a.py"
    st = path.stat()
    path.write_text("bbbb")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
    after = scan(tmp_path, previous=before)
    assert diff_trees(before, after).modified == ["a.py"]


def test_snapshot_roundtrip(tmp_path: Path) -> None:
    write_files(tmp_path / "src", {"a.py": "a", "img.png": b"\x89PNG", "d/e.md": "# e"})
    tree = scan(tmp_path / "src")
    save_snapshot(tmp_path / "lake", "project", tree)
    loaded = load_snapshot(tmp_path / "lake", "project")
    assert loaded is not None
    assert loaded.entries == tree.entries
    assert loaded.root_hash == tree.root_hash
    assert loaded.scanned_at_ns == tree.scanned_at_ns
    assert load_snapshot(tmp_path / "lake", "other") is None
    (tmp_path / "lake" / "manifest" / "project.arrow").write_bytes(b"garbage")
    assert load_snapshot(tmp_path / "lake", "project") is None


def test_incremental_update_equals_a_full_rebuild(tmp_path: Path) -> None:
    import random

    from ctxlake.tasks.merkle import Entry

    rng = random.Random(7)
    folders = ["", "a", "a/b", "a/b/c", "d", "d/e"]
    entries = {
        f"{f}/f{i}.py".lstrip("/"): Entry(f"{f}/f{i}.py".lstrip("/"), i, i, f"h{i}", "indexed")
        for i, f in enumerate(folders * 3)
    }
    tree = Tree.build(entries)
    for step in range(30):
        changes: dict[str, Entry | None] = {}
        for path in rng.sample(sorted(tree.entries), 3):
            changes[path] = None if rng.random() < 0.4 else tree.entries[path]._replace(hash=f"x{step}{path}")
        new_path = f"{rng.choice([*folders, 'n', 'n/m'])}/new{step}.py".lstrip("/")
        changes[new_path] = Entry(new_path, 1, 1, f"new{step}", "indexed")
        tree = tree.update(changes)
        rebuilt = Tree.build(tree.entries)
        assert tree.dirs == rebuilt.dirs, f"step {step}"
        assert tree.root_hash == rebuilt.root_hash
    # Emptying a folder removes it, exactly as a fresh scan would not see it.
    only = {p: e for p, e in tree.entries.items() if not p.startswith("d/")}
    emptied = tree.update({p: None for p in tree.entries if p.startswith("d/")})
    assert emptied.dirs == Tree.build(only).dirs and "d" not in emptied.dirs


def test_path_filter_agrees_with_the_scan(tmp_path: Path) -> None:
    from ctxlake.tasks.walk import PathFilter

    write_files(tmp_path, {
        ".gitignore": "*.log\nbuild/\n",
        "src/.gitignore": "!keep.log\n",
        "src/a.py": "a", "src/keep.log": "k", "src/x.log": "x", "build/out.py": "o",
        "env/pyvenv.cfg": "v", "env/lib.py": "l", "node_modules/m.js": "m", "docs/r.md": "r",
    })
    scanned = {p for p, e in scan(tmp_path).entries.items()}
    keep = PathFilter(tmp_path, IndexSettings())
    every = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert {p for p in every if keep.keeps(p)} == scanned


def test_file_deleted_between_listing_and_hashing_is_counted_not_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_files(tmp_path, {"a.py": "a", "b.py": "b", "c.py": "c"})
    real = scan_stage.hash_file

    def vanishing(path: Path, size: int, max_bytes: int) -> tuple[str, str]:
        if path.name == "b.py":
            path.unlink()  # another process removes it after the folder was listed
        return real(path, size, max_bytes)

    monkeypatch.setattr(scan_stage, "hash_file", vanishing)
    tree, stats = scan_tree(tmp_path, IndexSettings())
    assert set(tree.entries) == {"a.py", "c.py"}
    assert stats.vanished == 1


def test_include_by_folder_name_keeps_what_lies_below(tmp_path: Path) -> None:
    write_files(tmp_path, {"docs/guide.md": "g", "docs/api/ref.md": "r", "src/docs.py": "d", "src/a.py": "a"})
    assert indexed(scan(tmp_path, IndexSettings(include=["docs"]))) == {"docs/guide.md", "docs/api/ref.md"}
    assert indexed(scan(tmp_path, IndexSettings(include=["/src/", "*.md"]))) == {
        "src/docs.py", "src/a.py", "docs/guide.md", "docs/api/ref.md"}


def test_a_check_that_finds_nothing_changed_hashes_no_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The no-op path: the snapshot loaded, the disk scanned, the two compared, and no folder
    hashed for either tree (0.4 s of a 100,000-file check); an edit still shows, and root hashes
    asked for afterwards are right."""
    write_files(tmp_path / "src", {"a.py": "a", "b/c.py": "c", "b/d/e.md": "# e", ".env": "K=v\n"})
    first = scan(tmp_path / "src")
    first.scanned_at_ns = time.time_ns() + 10 * scan_stage.RACY_WINDOW_NS  # outside the racy window
    save_snapshot(tmp_path / "lake", "project", first)
    folders: list[str] = []
    real = merkle._folder_hash
    monkeypatch.setattr(merkle, "_folder_hash", lambda f, k, d: folders.append(f) or real(f, k, d))
    snapshot = load_snapshot(tmp_path / "lake", "project")
    assert snapshot is not None
    again, stats = scan_tree(tmp_path / "src", IndexSettings(), snapshot)
    assert diff_trees(snapshot, again) == Diff([], [], [])
    assert (folders, stats.reused, again.scanned_at_ns > 0) == ([], 3, True)
    assert again.root_hash == snapshot.root_hash == first.root_hash
    (tmp_path / "src" / "b" / "d" / "f.md").write_text("# f\n")
    changed = scan(tmp_path / "src", previous=snapshot)
    assert diff_trees(snapshot, changed) == Diff(["b/d/f.md"], [], [])
    assert changed.root_hash != snapshot.root_hash


def test_a_removed_file_and_an_added_one_are_not_the_same_tree(tmp_path: Path) -> None:
    write_files(tmp_path, {"a.py": "a", "b.py": "b"})
    first = scan(tmp_path)
    first.scanned_at_ns = time.time_ns() + 10 * scan_stage.RACY_WINDOW_NS
    (tmp_path / "b.py").unlink()
    (tmp_path / "c.py").write_text("b")  # as many files as before, same content, another name
    second = scan(tmp_path, previous=first)
    assert diff_trees(first, second) == Diff(["c.py"], [], ["b.py"])


def test_ctxlakes_own_data_folder_is_never_indexed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index of ~ took in the embedding cache's Lance files, the clones and trusted-configs.json."""
    from ctxlake.schemas.config import load_settings

    home = tmp_path / "home"
    data = home / ".local" / "share" / "ctxlake"
    write_files(home, {"code/app.py": "x = 1\n", ".local/share/other/keep.txt": "kept\n"})
    write_files(data, {"embeddings/m.lance/_versions/1.manifest": "lance\n", "trusted-configs.json": "{}\n",
                       "sources/git/lib-1/tree/a.py": "a = 1\n"})
    monkeypatch.setenv("CTX_HOME", str(data))
    settings = load_settings(home)
    tree, _ = scan_tree(home, settings.index)
    assert set(tree.entries) == {"code/app.py", ".local/share/other/keep.txt"}
    # A source's settings (its own excludes) keep the rule; the config file never shows it.
    assert settings.index.model_copy(update={"exclude": ["x"]}).skip_dirs == settings.index.skip_dirs
    assert "skip_dirs" not in settings.index.model_dump()


def test_utf16_text_with_its_bom_is_text_and_binary_behind_those_bytes_is_not(tmp_path: Path) -> None:
    """UTF-16 files (Windows tools write them) have a NUL byte beside every ASCII character, the
    binary sniff's sign; with their BOM they are text, and the chunk stage decodes them."""
    import os

    from ctxlake.tasks.chunk_stage import decode_text

    source = "\ufeffusing System;\r\nclass Greeter {\r\n  static void Main() { Console.WriteLine(\"héllo\"); }\r\n}\r\n"
    write_files(tmp_path, {"Greeter.cs": source.encode("utf-16-le"), "Legacy.sql": source.encode("utf-16-be"),
                           "blob.dat2": b"\xff\xfe" + bytes(os.urandom(6000))})
    tree, _ = scan_tree(tmp_path, IndexSettings())
    assert {p: e.status for p, e in tree.entries.items()} == {
        "Greeter.cs": "indexed", "Legacy.sql": "indexed", "blob.dat2": "binary"}
    text, warning = decode_text((tmp_path / "Greeter.cs").read_bytes())
    assert warning is None and text is not None and 'Console.WriteLine("héllo")' in text


def test_a_name_that_is_not_utf8_is_skipped_and_counted_not_fatal(tmp_path: Path) -> None:
    # Linux allows any bytes in a name; os.listdir hands the bad ones over as lone surrogates,
    # which crashed the folder hash (every run of the project failed) and cannot go into Arrow.
    write_files(tmp_path, {"ok.py": "def ok(): pass\n"})
    root = os.fsencode(tmp_path)
    with open(root + b"/bad\xffname.py", "wb") as f:
        f.write(b"def f(): pass\n")
    os.mkdir(root + b"/dir\xfe")
    with open(root + b"/dir\xfe/inner.py", "wb") as f:
        f.write(b"x = 1\n")
    tree, stats = scan_tree(tmp_path, IndexSettings())
    assert indexed(tree) == {"ok.py"}
    assert stats.skipped == {"bad_name": 2}
    assert sorted(stats.bad_names) == ["bad\\xffname.py", "dir\\xfe/inner.py"]
    assert tree.root_hash  # the folders hash
    save_snapshot(tmp_path / "lake", "project", tree)
    assert merkle.not_indexed(tmp_path / "lake", "project") == [
        ("bad\\xffname.py", "bad_name", 14), ("dir\\xfe/inner.py", "bad_name", 6)]
    again = load_snapshot(tmp_path / "lake", "project")
    assert again is not None
    assert diff_trees(again, scan(tmp_path, previous=again)) == Diff([], [], [])


def test_a_name_with_a_control_character_is_skipped_as_a_bad_name(tmp_path: Path) -> None:
    """A newline in a file name was indexed: every listing of it broke in two lines, and no
    command could name it back (`ctx show` refused it as not a path)."""
    write_files(tmp_path, {"ok.py": "def ok(): pass\n", "new\nline.py": "def f(): pass\n",
                           "tab\there.py": "x = 1\n", "café.py": "y = 2\n"})
    tree, stats = scan_tree(tmp_path, IndexSettings())
    assert indexed(tree) == {"ok.py", "café.py"}
    assert sorted(stats.bad_names) == ["new\\x0aline.py", "tab\\x09here.py"]
    assert diff_trees(tree, scan(tmp_path, previous=tree)) == Diff([], [], [])  # stable between runs


def test_watch_events_for_a_name_that_is_not_utf8_match_a_scan(tmp_path: Path) -> None:
    write_files(tmp_path, {"ok.py": "def ok(): pass\n", "pkg/a.py": "a = 1\n"})
    index = IndexSettings()
    keep = walk.PathFilter(tmp_path, index)
    before = scan(tmp_path)
    bad = os.fsencode(tmp_path) + b"/pkg/bad\xffname.py"
    with open(bad, "wb") as f:
        f.write(b"def f(): pass\n")
    event = os.fsdecode(b"pkg/bad\xffname.py")  # as watchfiles reports it
    after = before.update(scan_stage.rehash_paths(tmp_path, {event}, before, keep, index.max_file_bytes))
    assert after.entries == scan(tmp_path).entries
    assert after.root_hash == scan(tmp_path).root_hash
    assert "pkg/bad\\xffname.py" in after.entries
    assert diff_trees(before, after) == Diff([], [], [])
    os.unlink(bad)
    # Deleted, seen through its folder's event: the escaped entry goes, as from a scan.
    gone = after.update(scan_stage.rehash_paths(tmp_path, {"pkg"}, after, keep, index.max_file_bytes))
    assert gone.entries == before.entries
