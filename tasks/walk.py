"""Scan stage, the walk: the files under a source root that .gitignore and the default and configured excludes keep (no tables)."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks import safe_io

# Folders and files no one wants in a code index; a user's include globs cannot bring them back.
DEFAULT_EXCLUDES = [
    ".git/", ".hg/", ".svn/", ".ctx/", "node_modules/", "__pycache__/", ".venv/", "venv/",
    ".tox/", ".nox/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/",
    "*.egg-info/", "dist/", "build/", "target/", ".next/", ".nuxt/", ".gradle/", ".idea/",
    ".DS_Store", "*.pyc", "*.pyo", "*.lock", "package-lock.json",
]


@dataclass
class ScanStats:
    seen: int = 0
    hashed: int = 0  # read and hashed
    reused: int = 0  # (size, mtime) unchanged: hash taken from the snapshot without reading
    ignored: int = 0  # by .gitignore, default or configured excludes
    symlinks: int = 0
    vanished: int = 0  # listed, then gone before we could read it
    skipped: dict[str, int] = field(default_factory=dict)  # status -> count, for non-indexed files
    bad_names: list[str] = field(default_factory=list)  # paths that are not UTF-8, escaped (storable_path)
    unreadable: list[str] = field(default_factory=list)  # files it may not read, folders (ending in /) it may not list
    # Folders whose listing was refused, as (path, lstat mtime_ns); "" is the root itself.
    unreadable_folders: list[tuple[str, int]] = field(default_factory=list)
    # FIFOs, sockets and devices the walk passed by, as (path, lstat mtime_ns): never opened, but
    # recorded so that `ctx status --skipped` lists them as it lists every other skipped file.
    special_files: list[tuple[str, int]] = field(default_factory=list)


class _Matcher:
    """One ignore file's patterns, answering "ignored?" with git's last-match-wins rule.

    Without negations the answer is "does any pattern match", so the patterns are compiled into
    two alternations: slash-free patterns (most of them: `*.pyc`, `node_modules/`) only ever see
    the last path component, the rest see the whole path. A walk of a django-size tree spent
    most of its time in per-pattern regex searches before this.
    """

    def __init__(self, lines: list[str]) -> None:
        self.spec = pathspec.GitIgnoreSpec.from_lines(lines)
        active = [p for p in self.spec.patterns if p.include is not None and p.regex is not None]
        self.empty = not active
        self.fast = bool(active) and all(p.include for p in active)
        base_parts: list[str] = []
        path_parts: list[str] = []
        for p in active:
            assert p.regex is not None  # filtered above
            pattern = _NAMED_GROUP.sub("(?:", p.regex.pattern)
            if pattern.startswith(_ANY_FOLDER):
                base_parts.append("^" + pattern[len(_ANY_FOLDER) :])
            else:
                path_parts.append(pattern)
        try:
            self.base_re = re.compile("|".join(base_parts)) if base_parts else None
            self.path_re = re.compile("|".join(path_parts)) if path_parts else None
        except re.error:
            self.fast = False

    def verdict(self, probe: str) -> bool | None:
        """True: ignored, False: re-included by a negation, None: no pattern speaks."""
        if self.empty:
            return None
        if self.fast:
            if self.base_re is not None:
                name = probe[probe.rfind("/", 0, len(probe) - 1) + 1 :]
                if self.base_re.match(name):
                    return True
            if self.path_re is not None and self.path_re.match(probe):
                return True
            return None
        if probe.endswith("/"):
            # A folder: as in git, the last pattern that matches it decides. pathspec ranks a
            # pattern matched only through its trailing slash (`!*/`) below a plain one (`*`), so
            # the "ignore everything, re-include folders and *.*" idiom (zeromicro/go-zero) would
            # drop every folder and index nothing.
            for pattern in reversed(self.spec.patterns):
                if pattern.include is not None and pattern.match_file(probe) is not None:
                    return bool(pattern.include)
            return None
        include: bool | None = self.spec.check_file(probe).include
        return include


_NAMED_GROUP = re.compile(r"\(\?P<[A-Za-z_][A-Za-z0-9_]*>")
_ANY_FOLDER = "^(?:.+/)?"  # how pathspec starts a pattern that matches at any depth


class _Rules:
    """Ignore rules: defaults + configured excludes at the root, then each folder's .gitignore."""

    def __init__(self, root: Path, index: IndexSettings) -> None:
        lines = [*DEFAULT_EXCLUDES, *index.exclude]
        info_exclude = root / ".git" / "info" / "exclude"
        if index.respect_gitignore and info_exclude.is_file():
            lines += _read_lines(info_exclude)
        self.base = _Matcher(lines)
        self.include = _Matcher(index.include) if index.include else None
        self.respect_gitignore = index.respect_gitignore

    def folder_matcher(self, gitignore: str) -> _Matcher | None:
        try:
            lines = _read_lines(Path(gitignore))
        except OSError:
            return None
        matcher = _Matcher(lines)
        return None if matcher.empty else matcher

    def ignored(self, rel: str, is_dir: bool, stack: list[tuple[str, _Matcher]]) -> bool:
        probe = rel + "/" if is_dir else rel
        if self.base.verdict(probe):
            return True
        # The deepest .gitignore with an opinion wins, as in git.
        for folder, matcher in reversed(stack):
            verdict = matcher.verdict(probe[len(folder) + 1 :] if folder else probe)
            if verdict is not None:
                return verdict
        return False

    def excluded_by_include(self, rel: str) -> bool:
        # pathspec's own matcher, not the basename fast path: include rules see files only, and
        # `include = ["docs"]` must keep docs/guide.md (a folder name matches what lies below).
        return self.include is not None and not self.include.spec.match_file(rel)


class PathFilter:
    """Would a full scan keep this path? For single paths (watch events), with each folder's
    .gitignore matcher loaded once."""

    def __init__(self, root: Path, index: IndexSettings) -> None:
        self.root = root
        self.rules = _Rules(root, index)
        self.secret_files = index.secret_files
        self._stacks: dict[str, list[tuple[str, _Matcher]] | None] = {}

    def _stack(self, folder: str) -> list[tuple[str, _Matcher]] | None:
        """Matchers in force inside `folder`, or None when the folder itself is not scanned."""
        if folder in self._stacks:
            return self._stacks[folder]
        if folder:
            parent = folder.rpartition("/")[0]
            above = self._stack(parent)
            ignored = above is None or self.rules.ignored(folder, True, above)
            venv = (self.root / folder / "pyvenv.cfg").exists()
            stack = None if (ignored or venv) else list(above or [])
        else:
            stack = []
        if stack is not None and self.rules.respect_gitignore:
            matcher = self.rules.folder_matcher(str(self.root / folder / ".gitignore"))
            if matcher is not None:
                stack.append((folder, matcher))
        self._stacks[folder] = stack
        return stack

    def scans(self, folder: str) -> bool:
        """Would a full scan try to list `folder`? (Its own pyvenv.cfg is not looked for: a folder
        that cannot be listed cannot be seen to be a virtualenv either.)"""
        stack = self._stack(folder.rpartition("/")[0])
        return stack is not None and not self.rules.ignored(folder, True, stack)

    def keeps(self, rel: str) -> bool:
        stack = self._stack(rel.rpartition("/")[0])
        if stack is None:
            return False
        return not self.rules.ignored(rel, False, stack) and not self.rules.excluded_by_include(rel)


def _read_lines(path: Path) -> list[str]:
    try:
        data = safe_io.read_regular(path, 4_000_000)  # a .gitignore that is a FIFO must not block
    except (safe_io.NotRegularFile, safe_io.TooLarge):
        return []
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return []  # a link: not followed (it could point anywhere)
        raise
    return data.decode("utf-8", errors="replace").splitlines()


def walk_files(
    root: Path, index: IndexSettings, stats: ScanStats
) -> Iterator[tuple[str, os.stat_result]]:
    """Every file under root that the rules keep, as (posix relative path, lstat); no symlinks."""
    rules = _Rules(root, index)
    real_root = os.path.realpath(root)
    # ctxlake's own data folders, as paths relative to root (only those inside it); folders are
    # never reached through links here, so the listing's path is the real one.
    private = {os.path.relpath(p, real_root).replace(os.sep, "/") for p in map(os.path.realpath, index.skip_dirs)
               if p.startswith(real_root.rstrip("/") + "/")}
    # Each item: (absolute folder, relative folder, the .gitignore matchers in force there).
    pending: list[tuple[str, str, list[tuple[str, _Matcher]]]] = [(str(root), "", [])]
    while pending:
        folder, rel_folder, stack = pending.pop()
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except (FileNotFoundError, NotADirectoryError):
            stats.vanished += 1  # gone or replaced since its parent was listed
            continue
        except OSError:
            try:
                mtime_ns = os.lstat(folder).st_mtime_ns
            except OSError:
                mtime_ns = 0
            stats.unreadable_folders.append((rel_folder, mtime_ns))
            continue
        names = {item.name for item in items}
        if rel_folder and "pyvenv.cfg" in names:
            stats.ignored += 1  # a virtualenv, whatever its name
            continue
        if rules.respect_gitignore and ".gitignore" in names:
            matcher = rules.folder_matcher(os.path.join(folder, ".gitignore"))
            if matcher is not None:
                stack = [*stack, (rel_folder, matcher)]
        subfolders = []
        for item in items:
            rel = f"{rel_folder}/{item.name}" if rel_folder else item.name
            try:
                # Links and folders by the type the listing gave (no stat call: a third of the
                # entries of a big tree are folders); files need their size and mtime anyway.
                if item.is_symlink():
                    # Not followed: a link can point outside the root or back into a loop.
                    stats.symlinks += 1
                    continue
                if item.is_dir(follow_symlinks=False):
                    if rel in private or rules.ignored(rel, True, stack):
                        stats.ignored += 1
                    else:
                        subfolders.append((item.path, rel, stack))
                    continue
                st = item.stat(follow_symlinks=False)
            except OSError:
                stats.vanished += 1
                continue
            if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
                stats.vanished += 1  # replaced by a link or a folder since it was listed: the next scan sees it
                continue
            if not stat.S_ISREG(st.st_mode):
                # FIFOs, sockets, devices: never opened (a FIFO would block the scan), but counted.
                stats.skipped["special"] = stats.skipped.get("special", 0) + 1
                stats.special_files.append((rel, st.st_mtime_ns))
                continue
            if rules.ignored(rel, False, stack) or rules.excluded_by_include(rel):
                stats.ignored += 1
                continue
            yield rel, st
        pending.extend(reversed(subfolders))
