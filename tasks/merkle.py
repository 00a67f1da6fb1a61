"""Scan stage: walk a source tree, hash files into a Merkle tree, and diff it against the last run (MANIFEST)."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import pathspec
import pyarrow as pa
import pyarrow.ipc as ipc
import xxhash

from ctxlake.schemas.config import IndexSettings
from ctxlake.schemas.tables import MANIFEST
from ctxlake.tasks import safe_io
from ctxlake.tasks.lake import write_atomic
from ctxlake.tasks.secrets import is_secret_name, skipped_as_secret
from ctxlake.tasks.stage import stage

# Folders and files no one wants in a code index; a user's include globs cannot bring them back.
DEFAULT_EXCLUDES = [
    ".git/", ".hg/", ".svn/", ".ctx/", "node_modules/", "__pycache__/", ".venv/", "venv/",
    ".tox/", ".nox/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/", ".ipynb_checkpoints/",
    "*.egg-info/", "dist/", "build/", "target/", ".next/", ".nuxt/", ".gradle/", ".idea/",
    ".DS_Store", "*.pyc", "*.pyo", "*.lock", "package-lock.json",
]

# Text that tools wrote, not people: skipped and counted as "generated" (a user's include globs
# cannot bring them back). Vector drawings are mostly path coordinates, bundles and source maps
# one enormous line; chunking them fills the index with noise (an 883 KB SVG was ~400 chunks).
GENERATED_SUFFIXES = (".svg", ".min.js", ".min.mjs", ".min.css", ".map", ".bundle.js")
# Lock files without a .lock suffix: kept when small (a short one says what is pinned), skipped past this.
LOCK_NAMES = frozenset(["pnpm-lock.yaml", "go.sum", "npm-shrinkwrap.json", "bun.lockb", "flake.lock"])
LOCK_MAX_BYTES = 64_000
# Minified or machine-written content, whatever its name: lines this long on average (in files
# of at least MINIFIED_MIN_BYTES), or any single line past LONGEST_LINE.
MINIFIED_MIN_BYTES = 8_000
MINIFIED_MEAN_LINE = 300
LONGEST_LINE = 50_000
GENERATED = "generated"

# Decided by name alone, so they are never read.
BINARY_EXTENSIONS = frozenset(
    [".png", ".jpg", ".jpeg", ".gif", ".bmp", ".ico", ".webp", ".tif", ".tiff", ".psd", ".svgz", ".pdf", ".zip", ".gz", ".tgz", ".bz2", ".xz", ".7z", ".rar", ".tar", ".jar", ".war", ".whl", ".egg", ".so", ".dylib", ".dll", ".exe", ".o", ".a", ".lib", ".obj", ".class", ".pyd", ".wasm", ".bin", ".dat", ".db", ".sqlite", ".sqlite3", ".npy", ".npz", ".pkl", ".pickle", ".parquet", ".arrow", ".feather", ".lance", ".h5", ".hdf5", ".pt", ".pth", ".onnx", ".safetensors", ".ckpt", ".mp3", ".mp4", ".wav", ".ogg", ".flac", ".avi", ".mov", ".mkv", ".webm", ".woff", ".woff2", ".ttf", ".otf", ".eot", ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".odt", ".dmg", ".iso", ".mo"]
)
SNIFF_BYTES = 8192
# A file whose mtime is this close to the previous scan may have changed again within the
# clock's granularity after being hashed (git's "racily clean" case): hash it again.
RACY_WINDOW_NS = 2_000_000_000

INDEXED = "indexed"
# A file that is a secret by its name (.env, id_rsa, *.pem...) while [index] secret_files = "skip":
# never read, counted in the run report and `ctx status`.
SECRET = "secret"
# A path that is not valid UTF-8 (a byte-named file from another system): the lake stores paths
# as UTF-8 strings, so such a file cannot be indexed. It is recorded under its escaped name
# (`bad\xffname.py`, see storable_path), never read, and counted in the run report and `ctx status`.
BAD_NAME = "bad_name"
# A file the scan may not read, or a folder it may not list (permissions): recorded under its own
# path (a folder's entry stands for everything below it), warned about once per run and listed by
# `ctx status --skipped`. Permissions change without touching mtime (chmod sets only the ctime),
# so an unreadable file is tried again by every scan rather than taken from the snapshot.
UNREADABLE = "unreadable"
UNREADABLE_FOLDER = "unreadable_folder"


# Who this process is, for may_read (fixed for its life).
_EUID = os.geteuid()
_GROUPS = frozenset([os.getegid(), *os.getgroups()])


def may_read(st: os.stat_result) -> bool:
    """Whether the permission bits let this process read the file `st` describes: a file made
    unreadable since the last scan (chmod keeps its mtime) is then read again, found unreadable
    and dropped from the index, instead of its old chunks staying searchable. From the stat the
    walk already has, so it costs no system call. Only the bits: root (which may read anyway) and
    ACLs get a read where the bits say no, which finds the file as it was and changes nothing."""
    if st.st_uid == _EUID:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in _GROUPS:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def storable_path(rel: str) -> str:
    """`rel` as a UTF-8 string of printable characters: itself, or with the bytes that are not UTF-8
    written as `\\xNN` (os.listdir hands them over as lone surrogates, which no encoder, hash or Arrow
    column takes), and control characters too (a newline in a name split every listing of it, and
    no command could name the file back)."""
    if rel.isascii() and rel.isprintable():
        return rel
    text = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Entry(NamedTuple):
    path: str  # posix, relative to the source root
    size: int
    mtime_ns: int
    hash: str
    status: str  # indexed | binary | too_large | unreadable | unreadable_folder | secret | generated | special | bad_name


class Diff(NamedTuple):
    """What changed between two scans; paths of indexable files only."""

    added: list[str]
    modified: list[str]
    removed: list[str]

    @property
    def changed(self) -> list[str]:
        return self.added + self.modified

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.removed)


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


def _folder_hash(folder: str, kids: dict[str, tuple[bool, str]], dirs: dict[str, str]) -> str:
    """A folder's Merkle hash from its children's names and hashes; child folders' hashes are
    read from `dirs` (computed first) and recorded in `kids`."""
    h = xxhash.xxh3_128()
    for name in sorted(kids):
        is_dir, value = kids[name]
        if is_dir:
            value = dirs[f"{folder}/{name}" if folder else name]
            kids[name] = (True, value)
        h.update(f"{name}{'/' if is_dir else ''}\0{value}\n".encode())
    return h.hexdigest()


class _Shape:
    """A tree's folders and their hashes, worked out from its files on first use.

    A no-op check never needs them: the files it finds are the snapshot's (an identity test), and
    building them for the snapshot and again for the disk was ~0.4 s of a 100,000-file check.
    Trees of the same files share one."""

    __slots__ = ("_children", "_dirs", "entries")

    def __init__(self, entries: dict[str, Entry], dirs: dict[str, str] | None = None,
                 children: dict[str, dict[str, tuple[bool, str]]] | None = None) -> None:
        self.entries = entries
        self._dirs, self._children = dirs, children

    def get(self) -> tuple[dict[str, str], dict[str, dict[str, tuple[bool, str]]]]:
        if self._dirs is None or self._children is None:
            self._dirs, self._children = _shape_of(self.entries)
        return self._dirs, self._children


def _add_folders(children: dict[str, dict[str, tuple[bool, str]]], folder: str) -> None:
    """Give `folder` and the folders above it a node, up to one that has one already (so a level
    that holds only folders still gets its own)."""
    while folder:
        parent, _, name = folder.rpartition("/")
        siblings = children.setdefault(parent, {})
        if siblings.get(name, (False, ""))[0]:
            break
        siblings[name] = (True, "")
        children.setdefault(folder, {})
        folder = parent


def _shape_of(entries: dict[str, Entry]) -> tuple[dict[str, str], dict[str, dict[str, tuple[bool, str]]]]:
    children: dict[str, dict[str, tuple[bool, str]]] = {"": {}}
    for path, entry in entries.items():
        parent, _, name = path.rpartition("/")
        children.setdefault(parent, {})[name] = (False, entry.hash)
        _add_folders(children, parent)
    dirs: dict[str, str] = {}
    # Deepest folders first, so every child folder's hash exists before its parent's.
    for folder in sorted(children, key=lambda d: d.count("/") + (1 if d else 0), reverse=True):
        dirs[folder] = _folder_hash(folder, children[folder], dirs)
    return dirs, children


class Tree:
    """A Merkle tree over file hashes: each folder's hash covers its children's names and hashes."""

    __slots__ = ("_shape", "entries", "scanned_at_ns")

    def __init__(self, entries: dict[str, Entry], dirs: dict[str, str] | None = None,
                 children: dict[str, dict[str, tuple[bool, str]]] | None = None, scanned_at_ns: int = 0,
                 shape: _Shape | None = None) -> None:
        self.entries = entries
        self.scanned_at_ns = scanned_at_ns
        self._shape = shape if shape is not None else _Shape(entries, dirs, children)

    @property
    def dirs(self) -> dict[str, str]:  # "" is the root
        return self._shape.get()[0]

    @property
    def children(self) -> dict[str, dict[str, tuple[bool, str]]]:  # folder -> name -> (is_dir, hash)
        return self._shape.get()[1]

    @property
    def root_hash(self) -> str:
        return self.dirs.get("", EMPTY_HASH)

    @classmethod
    def build(cls, entries: dict[str, Entry], scanned_at_ns: int = 0) -> Tree:
        """The tree of these files; its folders are hashed when first asked for."""
        return cls(entries, scanned_at_ns=scanned_at_ns)

    def same_files(self, other: Tree) -> bool:
        """True when both trees were found to hold the very same files (one shares the other's
        shape: a scan that changed nothing); False says nothing either way."""
        return self._shape is other._shape

    def rescanned(self, scanned_at_ns: int) -> Tree:
        """This tree's files, found again by a scan at `scanned_at_ns`."""
        return Tree(self.entries, scanned_at_ns=scanned_at_ns, shape=self._shape)

    def update(self, changes: dict[str, Entry | None]) -> Tree:
        """A new tree with these files set (or removed, for None), rehashing only their folders
        and the folders above them; untouched subtrees keep their nodes."""
        entries = dict(self.entries)
        children = {folder: dict(kids) for folder, kids in self.children.items()}
        dirty: set[str] = set()
        # Removals first: a folder that became readable is an unreadable-folder entry removed and
        # files added under the same name, whatever order the changes came in.
        for path, entry in sorted(changes.items(), key=lambda change: change[1] is not None):
            parent, _, name = path.rpartition("/")
            if entry is None:
                if entries.pop(path, None) is not None:
                    children.get(parent, {}).pop(name, None)
            else:
                entries[path] = entry
                children.setdefault(parent, {})[name] = (False, entry.hash)
                _add_folders(children, parent)
            folder = parent
            while True:
                dirty.add(folder)
                if not folder:
                    break
                folder = folder.rpartition("/")[0]
        dirs = dict(self.dirs)
        for folder in sorted(dirty, key=lambda d: d.count("/") + (1 if d else 0), reverse=True):
            kids = children.get(folder, {})
            if folder and not kids:
                # An emptied folder disappears from its parent, as it would from a fresh scan.
                children.pop(folder, None)
                dirs.pop(folder, None)
                parent, _, name = folder.rpartition("/")
                siblings = children.get(parent, {})
                if siblings.get(name, (False, ""))[0]:  # not an unreadable-folder entry in its place
                    siblings.pop(name)
                continue
            dirs[folder] = _folder_hash(folder, kids, dirs)
        return Tree(entries, dirs, children, time.time_ns())


EMPTY_HASH = xxhash.xxh3_128(b"").hexdigest()


def diff_trees(old: Tree, new: Tree) -> Diff:
    """Descend only into folders whose hashes differ: unchanged subtrees are skipped whole."""
    if new.same_files(old):
        return Diff([], [], [])
    added: list[str] = []
    modified: list[str] = []
    removed: list[str] = []

    def files_under(tree: Tree, folder: str) -> Iterator[str]:
        for name, (is_dir, _) in tree.children.get(folder, {}).items():
            path = f"{folder}/{name}" if folder else name
            if is_dir:
                yield from files_under(tree, path)
            else:
                yield path

    def indexed(tree: Tree, path: str) -> bool:
        entry = tree.entries.get(path)
        return entry is not None and entry.status == INDEXED

    def walk(folder: str) -> None:
        if old.dirs.get(folder) == new.dirs.get(folder):
            return
        before = old.children.get(folder, {})
        after = new.children.get(folder, {})
        for name in sorted(before.keys() | after.keys()):
            path = f"{folder}/{name}" if folder else name
            was, now = before.get(name), after.get(name)
            if was is not None and now is not None and was == now:
                continue
            was_dir = was is not None and was[0]
            now_dir = now is not None and now[0]
            if was_dir and now_dir:
                walk(path)
                continue
            if was_dir:
                removed.extend(p for p in files_under(old, path) if indexed(old, p))
            if now_dir:
                added.extend(p for p in files_under(new, path) if indexed(new, p))
            old_file = was is not None and not was_dir and indexed(old, path)
            new_file = now is not None and not now_dir and indexed(new, path)
            if old_file and new_file:
                modified.append(path)
            elif old_file:
                removed.append(path)
            elif new_file:
                added.append(path)

    walk("")
    return Diff(sorted(added), sorted(modified), sorted(removed))


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


def entry_for(root: Path, rel: str, keep: PathFilter, max_bytes: int) -> Entry | None:
    """The Merkle entry of one path as a scan would record it now, or None if a scan would not."""
    full = root / rel
    try:
        st = full.lstat()
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode):
        return _unreadable_folder_entry(full, rel, st.st_mtime_ns) if keep.scans(rel) else None
    if not stat.S_ISREG(st.st_mode) or not keep.keeps(rel):
        return None
    key = storable_path(rel)
    if key != rel:
        return Entry(key, st.st_size, st.st_mtime_ns, f"{BAD_NAME}:{st.st_size}", BAD_NAME)
    if skipped_as_secret(rel, keep.secret_files):
        return Entry(rel, st.st_size, st.st_mtime_ns, f"{SECRET}:{st.st_size}", SECRET)
    try:
        digest, status = hash_file(full, st.st_size, max_bytes)
    except FileNotFoundError:
        return None
    return Entry(rel, st.st_size, st.st_mtime_ns, digest, status)


def _unreadable_folder_entry(full: Path, rel: str, mtime_ns: int) -> Entry | None:
    """The entry of a folder the scan may not list (as walk_files finds it), else None."""
    try:
        with os.scandir(full):
            return None
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        key = storable_path(rel)
        return Entry(key, 0, mtime_ns, f"{UNREADABLE_FOLDER}:0", UNREADABLE_FOLDER)


@stage("rehash-paths")
def rehash_paths(root: Path, paths: set[str], tree: Tree, keep: PathFilter, max_bytes: int) -> dict[str, Entry | None]:
    """Event paths -> {file path: its new Merkle entry, or None when it is gone or now ignored}.

    An event can name a folder (moved or deleted whole): every file the tree had under it,
    and every file now on disk under it, is looked at again. A name that is not UTF-8 is keyed by
    its escaped form, as a scan records it; the tree's escaped key is looked up on disk by the
    real name when the disk still has it, and otherwise found gone.
    """
    affected: dict[str, str] = {}  # the tree's key -> the path on disk to look at
    for rel in paths:
        affected[storable_path(rel)] = rel
        prefix = storable_path(rel) + "/"
        affected.update((p, p) for p in tree.entries if p.startswith(prefix))
        folder = root / rel
        if folder.is_dir() and not folder.is_symlink():
            for dirpath, dirnames, filenames in os.walk(folder):
                dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
                base = Path(dirpath).relative_to(root).as_posix()
                # Folders too: one os.walk cannot list is recorded as a scan records it.
                affected.update((storable_path(f"{base}/{name}"), f"{base}/{name}") for name in filenames + dirnames)
    changes: dict[str, Entry | None] = {}
    for key, rel in affected.items():
        entry = entry_for(root, rel, keep, max_bytes)
        before = tree.entries.get(key)
        if entry != before and not (entry is None and before is None):
            changes[key] = entry
    return changes


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


def hash_file(path: Path, size: int, max_bytes: int) -> tuple[str, str]:
    """(hash, status) for one file: xxh3-128 of its bytes, or why it is not indexed."""
    if size > max_bytes:
        return f"too_large:{size}", "too_large"
    if path.suffix.lower() in BINARY_EXTENSIONS:
        return f"binary:{size}", "binary"
    try:
        # Not path.read_bytes(): the file may have become a FIFO or a link since the lstat, and
        # opening a FIFO blocks until a writer comes; read_regular refuses both at once.
        data = safe_io.read_regular(path, max_bytes)
    except FileNotFoundError:
        raise
    except safe_io.NotRegularFile:
        return f"special:{size}", "special"
    except safe_io.TooLarge as exc:
        return f"too_large:{exc.size}", "too_large"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"special:{size}", "special"
        return f"{UNREADABLE}:{size}", UNREADABLE
    if b"\0" in data[:SNIFF_BYTES] and not _utf16_text(data[:SNIFF_BYTES]):
        return f"binary:{size}", "binary"
    if is_generated(path.name, data):
        return f"{GENERATED}:{size}", GENERATED
    return xxhash.xxh3_128(data).hexdigest(), INDEXED


def _utf16_text(head: bytes) -> bool:
    """True for the head of a UTF-16 text file with its BOM (Windows tools write them: .rc, .ps1,
    some C# and SQL): its ASCII characters carry NUL bytes, which would otherwise mean binary.
    Binary data that merely starts with those two bytes decodes to control characters and stays out."""
    if not head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return False
    text = head[: len(head) - len(head) % 2].decode("utf-16", errors="replace")
    if not text:
        return False
    # Random bytes decode to ~3% lone surrogates (replaced) and ~10% private-use characters.
    odd = sum(1 for c in text if (c < " " and c not in "\t\n\r\f") or c == "\ufffd" or "\ue000" <= c <= "\uf8ff")
    return odd <= len(text) * 0.02


def is_generated(name: str, data: bytes) -> bool:
    """Generated, minified or asset text (see GENERATED_SUFFIXES and the line-length rules)."""
    lower = name.lower()
    if lower.endswith(GENERATED_SUFFIXES):
        return True
    if lower in LOCK_NAMES and len(data) > LOCK_MAX_BYTES:
        return True
    if len(data) < MINIFIED_MIN_BYTES:
        return False
    lines = data.count(b"\n") + 1
    if len(data) / lines > MINIFIED_MEAN_LINE:
        return True
    if len(data) <= LONGEST_LINE:
        return False
    start = 0
    while start < len(data):  # the longest line, without splitting a large file into a list
        end = data.find(b"\n", start)
        end = len(data) if end < 0 else end
        if end - start > LONGEST_LINE:
            return True
        start = end + 1
    return False


def scan_tree(
    root: Path,
    index: IndexSettings,
    previous: Tree | None = None,
    on_file: Callable[[int], None] | None = None,
) -> tuple[Tree, ScanStats]:
    """Walk `root` and hash what changed since `previous`: unchanged (size, mtime) reuse the hash."""
    started = time.time_ns()
    stats = ScanStats()
    old = previous.entries if previous is not None else {}
    racy_after = (previous.scanned_at_ns - RACY_WINDOW_NS) if previous is not None else 0
    entries: dict[str, Entry] = {}
    skip_secrets = index.secret_files == "skip"
    for rel, st in walk_files(root, index, stats):
        stats.seen += 1
        key = storable_path(rel)
        before = old.get(rel)
        if key != rel:
            if key in entries:  # a real file of that (escaped-looking) name keeps its place
                continue
            stats.bad_names.append(key)
            entries[key] = Entry(key, st.st_size, st.st_mtime_ns, f"{BAD_NAME}:{st.st_size}", BAD_NAME)
        # skipped_as_secret, with the name the walk already has (this loop sees every file).
        elif skip_secrets and is_secret_name(rel[rel.rfind("/") + 1 :]):
            entries[rel] = Entry(rel, st.st_size, st.st_mtime_ns, f"{SECRET}:{st.st_size}", SECRET)
        elif (
            before is not None
            and before.status not in (SECRET, UNREADABLE)  # skipped under the other setting, or chmod since
            and before.size == st.st_size
            and before.mtime_ns == st.st_mtime_ns
            and st.st_mtime_ns < racy_after
            and may_read(st)
        ):
            entries[rel] = before
            stats.reused += 1
        else:
            try:
                digest, status = hash_file(root / rel, st.st_size, index.max_file_bytes)
            except FileNotFoundError:
                stats.vanished += 1
                continue
            entries[rel] = Entry(rel, st.st_size, st.st_mtime_ns, digest, status)
            stats.hashed += 1
        status = entries[key].status
        if status != INDEXED:
            stats.skipped[status] = stats.skipped.get(status, 0) + 1
        if status == UNREADABLE:
            stats.unreadable.append(key)
        if on_file is not None:
            on_file(stats.seen)
    for rel, mtime_ns in stats.unreadable_folders:
        stats.skipped[UNREADABLE_FOLDER] = stats.skipped.get(UNREADABLE_FOLDER, 0) + 1
        stats.unreadable.append(f"{storable_path(rel)}/" if rel else "./")
        if rel:  # nothing below it was listed, so its path is free for an entry that stands for them all
            key = storable_path(rel)
            entries[key] = Entry(key, 0, mtime_ns, f"{UNREADABLE_FOLDER}:0", UNREADABLE_FOLDER)
    for rel, mtime_ns in stats.special_files:  # counted by the walk
        key = storable_path(rel)
        entries.setdefault(key, Entry(key, 0, mtime_ns, "special:0", "special"))
    if previous is not None and entries == old:  # nothing changed (~12 ms for 100,000 files)
        return previous.rescanned(started), stats
    return Tree.build(entries, started), stats


def unreadable_warning(paths: list[str], shown: int = 5) -> str:
    """One warning line for a run's unreadable files and folders (folders end in /), the first few named."""
    named = ", ".join(paths[:shown]) + (f" and {len(paths) - shown:,} more" if len(paths) > shown else "")
    return (f"{len(paths):,} path(s) could not be read (permission denied) and are not indexed: {named}; "
            "fix their permissions and run `ctx run index` again (`ctx status --skipped` lists them)")


@stage("scan")
def scan(root: Path, index: IndexSettings, previous: Tree | None) -> tuple[Tree, Diff, ScanStats]:
    """Source folder -> (new Merkle tree, Diff against `previous`, counts)."""
    tree, stats = scan_tree(root, index, previous)
    return tree, diff_trees(previous or Tree.build({}), tree), stats


# --- the snapshot file -------------------------------------------------------------------------


def snapshot_path(lake_dir: Path, source: str) -> Path:
    return lake_dir / "manifest" / f"{source}.arrow"


def load_snapshot(lake_dir: Path, source: str) -> Tree | None:
    path = snapshot_path(lake_dir, source)
    try:
        with pa.memory_map(str(path)) as source_file:
            table = ipc.open_file(source_file).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowInvalid):
        return None  # unreadable snapshot: the caller treats it as "no previous scan"
    meta = table.schema.metadata or {}
    scanned_at = int(meta.get(b"scanned_at_ns", b"0"))
    cols = [table.column(name).to_pylist() for name in MANIFEST.names]
    entries = {row[0]: Entry(*row) for row in zip(*cols, strict=True)}
    return Tree.build(entries, scanned_at)


def not_indexed(lake_dir: Path, source: str) -> list[tuple[str, str, int]]:
    """(path, why, size) of the files the last scan of `source` saw but did not index (binary,
    too_large, secret, generated, special, unreadable, bad_name) and the folders it could not list
    (unreadable_folder, size 0), by path; read from its snapshot alone."""
    try:
        with pa.memory_map(str(snapshot_path(lake_dir, source))) as source_file:
            table = ipc.open_file(source_file).read_all().select(["path", "status", "size"])
    except (OSError, pa.ArrowInvalid):
        return []
    import pyarrow.compute as pc

    table = table.filter(pc.not_equal(table.column("status"), INDEXED))
    return sorted(zip(*(table.column(n).to_pylist() for n in ("path", "status", "size")), strict=True))


def save_snapshot(lake_dir: Path, source: str, tree: Tree) -> None:
    rows = list(tree.entries.values())
    table = pa.Table.from_arrays(
        [pa.array([getattr(r, name) for r in rows], type=MANIFEST.field(name).type) for name in MANIFEST.names],
        schema=MANIFEST.with_metadata(
            {**(MANIFEST.metadata or {}), b"scanned_at_ns": str(tree.scanned_at_ns).encode(),
             b"root_hash": tree.root_hash.encode()}
        ),
    )
    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    path = snapshot_path(lake_dir, source)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, sink.getvalue().to_pybytes())
