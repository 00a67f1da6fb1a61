"""Scan stage: walk a source tree, hash what changed into a Merkle tree, and diff it against the last run (MANIFEST)."""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path

import xxhash

from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks import safe_io
from ctxlake.tasks.merkle import (
    BAD_NAME,
    INDEXED,
    SECRET,
    UNREADABLE,
    UNREADABLE_FOLDER,
    Diff,
    Entry,
    Tree,
    diff_trees,
)
from ctxlake.tasks.secrets import is_secret_name, skipped_as_secret
from ctxlake.tasks.stage import stage
from ctxlake.tasks.walk import PathFilter, ScanStats, walk_files

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
