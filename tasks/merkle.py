"""Scan stage, the tree: file entries hashed into a Merkle tree, the diff of two trees, and the last run's tree on disk (MANIFEST)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pyarrow as pa
import pyarrow.ipc as ipc
import xxhash

from ctxlake.schemas.tables import MANIFEST
from ctxlake.tasks.lake import write_atomic

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
