"""Opening a file inside a root folder so that nothing outside it can be read, whatever the path says
and whatever happens on disk meanwhile.

Checking a path and then opening it is a race: between the two, a file can become a symlink to
/etc/passwd. So the path is never resolved by the kernel in one go. Each component is opened
relative to the descriptor of its parent folder with O_NOFOLLOW (the openat style); a symlink met
on the way is read with readlink and its target walked the same way from the root's descriptor
(absolute targets must lie under the root, `..` may not climb above it). A swap after our
readlink makes the O_NOFOLLOW open fail, and the walk starts over; it never follows a link the
kernel chose. The file itself is opened O_NONBLOCK (a FIFO would otherwise block the open),
checked with fstat to be a regular file, and read up to a byte bound.

Hidden components (a leading dot) are refused in link targets, and in the asked path unless the
caller allows them (get_file_context does for a file the scan indexed: its rules, secret files
included, decided it may be read); repository metadata folders (.git, .ctx) are refused always.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ctxlake.errors import InputError

# Never served, even when the caller allows hidden files: repository metadata and our own lake.
FORBIDDEN = frozenset({".git", ".hg", ".svn", ".ctx"})
_MAX_LINKS = 40  # as the kernel's own limit on symlinks followed in one lookup


class UnsafePath(InputError):
    """The path, or a symlink on it, leads outside the root or to a hidden or metadata file."""


class NotRegularFile(InputError):
    """A FIFO, device, socket or folder where a file was expected."""


class TooLarge(InputError):
    """The file is larger than the caller's byte bound."""

    def __init__(self, message: str, size: int, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.size = size


def project_path(given: str, root: Path, base: Path | None = None) -> str:
    """A file a user or agent named -> its POSIX path relative to `root`, the way the index names
    it; InputError for a path outside the project (`/etc/passwd`, `../../x`) or the root itself.
    A relative path is read from `base` when given (the CLI's current folder, like every path a
    shell user types), else from the root (agents and the UI name files by their project path);
    an absolute one must lie inside the root."""
    if not given.strip() or any(c in given for c in "\n\r\x00"):
        raise InputError(f"file {given!r} is not a path")
    root = root.resolve()
    path = Path(given.strip())
    full = path if path.is_absolute() else (root if base is None else base.resolve()) / path
    # normpath, not resolve(): a symlink inside the project is named by its own path.
    rel = Path(os.path.normpath(full))
    if not rel.is_relative_to(root) or rel == root:
        where = "relative to its root" if base is None else "relative to the current folder"
        raise InputError(f"file {given!r} is outside the project {root}",
                         hint=f"name files by their path inside the project ({where})")
    return rel.relative_to(root).as_posix()


def split_relative(relpath: str, what: str = "path") -> list[str]:
    """The components of a relative path; UnsafePath for absolute paths, `..`, NUL bytes."""
    if not isinstance(relpath, str) or not relpath:
        raise UnsafePath(f"empty {what}")
    if "\0" in relpath:
        raise UnsafePath(f"{what} contains a NUL byte")
    if relpath.startswith("/"):
        raise UnsafePath(f"absolute {what} not allowed: {relpath!r}")
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafePath(f"path traversal not allowed: {relpath!r} ('..' leaves the folder)")
    if not parts:
        raise UnsafePath(f"empty {what}: {relpath!r}")
    return parts


def _check_name(name: str, relpath: str, allow_hidden: bool | frozenset[str], via_link: bool) -> None:
    if name in FORBIDDEN:
        raise UnsafePath(f"{relpath!r} leads into {name}/, which is never served")
    allowed = allow_hidden is True or (isinstance(allow_hidden, frozenset) and name in allow_hidden)
    if name.startswith(".") and (via_link or not allowed):
        where = "links to a hidden file or folder" if via_link else "is a hidden file or folder"
        raise UnsafePath(f"{relpath!r} {where} ({name}); hidden files are not served")


def _link_parts(target: str, root_real: str, relpath: str) -> tuple[bool, list[str]]:
    """(absolute?, components) of a symlink's target; absolute targets become root-relative."""
    if "\0" in target:
        raise UnsafePath(f"{relpath!r} is a link with a bad target")
    if target.startswith("/"):
        norm = os.path.normpath(target)
        if norm != root_real and not norm.startswith(root_real.rstrip("/") + "/"):
            raise UnsafePath(f"{relpath!r} is a symlink that points outside the folder",
                             hint="only files inside the folder can be read")
        return True, [p for p in norm[len(root_real):].split("/") if p not in ("", ".")]
    return False, [p for p in target.split("/") if p not in ("", ".")]


def open_fd_inside(root: Path, relpath: str, *, allow_hidden: bool | frozenset[str] = False, what: str = "path") -> int:
    """A read-only descriptor of the regular file `root/relpath`, reached without ever leaving root.

    Raises UnsafePath, NotRegularFile, FileNotFoundError (the file or a folder on the way is
    missing). The caller closes the descriptor."""
    pending = split_relative(relpath, what)
    for name in pending:
        _check_name(name, relpath, allow_hidden, via_link=False)
    root_real = os.path.realpath(root)
    root_fd = os.open(root_real, os.O_RDONLY | os.O_DIRECTORY)
    stack = [root_fd]  # descriptors of the folders walked so far; stack[0] is the root
    links = retries = 0
    # Components still to walk, each flagged with whether it came from a link's target.
    todo: list[tuple[str, bool]] = [(p, False) for p in pending]
    try:
        while todo:
            name, via_link = todo.pop(0)
            if name == "..":  # only from link targets: climb, never above the root
                if len(stack) == 1:
                    raise UnsafePath(f"{relpath!r} is a symlink that points outside the folder",
                                     hint="only files inside the folder can be read")
                os.close(stack.pop())
                continue
            _check_name(name, relpath, allow_hidden, via_link)
            last = not todo
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            flags |= os.O_NONBLOCK if last else os.O_DIRECTORY
            try:
                fd = os.open(name, flags, dir_fd=stack[-1])
            except OSError as exc:
                # ELOOP: the component is a symlink (O_NOFOLLOW). ENOTDIR on a middle component
                # may be a symlink to a folder too (O_DIRECTORY is checked first on some kernels).
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    raise
                try:
                    target = os.readlink(name, dir_fd=stack[-1])
                except OSError:
                    if exc.errno == errno.ENOTDIR:
                        raise NotADirectoryError(errno.ENOTDIR, f"{name} is not a folder") from None
                    # Swapped back to a file since: walk this component again (bounded).
                    retries += 1
                    if retries > _MAX_LINKS:
                        raise UnsafePath(f"{relpath!r} keeps changing while being opened") from None
                    todo.insert(0, (name, via_link))
                    continue
                links += 1
                if links > _MAX_LINKS:
                    raise UnsafePath(f"{relpath!r}: too many symlinks on the way") from None
                absolute, parts = _link_parts(target, root_real, relpath)
                if absolute:
                    while len(stack) > 1:
                        os.close(stack.pop())
                todo[:0] = [(p, True) for p in parts]
                if not parts and not absolute:
                    raise UnsafePath(f"{relpath!r} is a link with an empty target") from None
                continue
            if last:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    os.close(fd)
                    kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) \
                        else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) \
                        else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
                    raise NotRegularFile(f"{relpath!r} is {kind}, not a regular file; only regular files are read")
                return fd
            stack.append(fd)
        raise NotRegularFile(f"{relpath!r} is a folder, not a regular file")  # a link to the root
    finally:
        for held in stack:
            os.close(held)


def open_inside(root: Path, relpath: str, max_bytes: int, *, allow_hidden: bool | frozenset[str] = False,
                what: str = "path") -> bytes:
    """The bytes of the regular file `root/relpath` (see open_fd_inside), at most max_bytes.

    TooLarge when the file is bigger than max_bytes: nothing past the bound is ever read."""
    fd = open_fd_inside(root, relpath, allow_hidden=allow_hidden, what=what)
    return read_fd(fd, relpath, max_bytes)


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, for the indexer's own walk of a project: its last
    component is not followed if it became a link, a FIFO or device swapped in since the scan's
    lstat is refused (NotRegularFile) without blocking, and at most max_bytes are read (TooLarge)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(f"{path.name!r} is not a regular file")
    return read_fd(fd, path.name, max_bytes)


def read_fd(fd: int, label: str, max_bytes: int) -> bytes:
    """Read and close `fd`, never more than max_bytes + 1 bytes (the extra one tells growth)."""
    with os.fdopen(fd, "rb", buffering=0) as fh:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise TooLarge(f"{label!r} is {size:,} bytes, over the limit of {max_bytes:,}", size)
        chunks: list[bytes] = []
        left = max_bytes + 1
        while left > 0:
            block = fh.read(min(left, 1 << 20))
            if not block:
                break
            chunks.append(block)
            left -= len(block)
        data = b"".join(chunks)
    if len(data) > max_bytes:
        raise TooLarge(f"{label!r} grew past the limit of {max_bytes:,} bytes while being read", len(data))
    return data


# A file decoded with more replacement characters than this share is not text we can index.
MAX_REPLACED_SHARE = 0.01


def text_as_indexed(data: bytes) -> str:
    """A file's bytes as the index read them (`decode_text`), for readers that serve it from disk
    and must mask it the same way: a UTF-16 file read as UTF-8 matched no secret rule. Bytes the
    index would have refused come out with replacement characters."""
    text, _ = decode_text(data)
    return data.decode("utf-8", errors="replace") if text is None else text


def decode_text(data: bytes) -> tuple[str | None, str | None]:
    """(text, warning): UTF-8 (BOM allowed), UTF-16 by BOM, else UTF-8 with a few replacements."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        try:
            return data.decode("utf-16"), None
        except UnicodeDecodeError:
            return None, "invalid UTF-16"
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        replaced = text.count("\ufffd")
        if replaced > max(8, len(text) * MAX_REPLACED_SHARE):
            return None, f"not UTF-8 ({exc.reason} at byte {exc.start})"
        return text, f"{replaced} invalid UTF-8 byte sequence(s) replaced"


# --- writing a project file -------------------------------------------------------------------


def unsafe_target(root: Path, rel: str) -> str | None:
    """Why ctx must not write the project file `rel` (a path under `root`), or None when it may. A symlinked
    file or folder on the way would carry the write out of the project (a clone can hold `.claude -> ~/.ssh`)
    or turn a link into a copy; a file where a folder goes would fail at mkdir."""
    path = root
    parts = Path(rel).parts
    for depth, part in enumerate(parts, start=1):
        path = path / part
        if path.is_symlink():
            return f"{path} is a symlink; ctx will not write through it"
        if depth < len(parts) and path.exists() and not path.is_dir():
            return f"{path} is not a folder; ctx cannot write {rel} under it"
    if not path.resolve().is_relative_to(root.resolve()):
        return f"{path} resolves outside the project; ctx will not write it"
    return None


def link_out(root: Path, rel: str) -> str | None:
    """Why ctx must not read the project file `rel` (a path under `root`): it leads out of the project through a
    symlink (a clone can commit `.claude/settings.json -> /etc/passwd`, or a link to someone's FIFO or device),
    which ctx will not write through either; None when it may. A link that stays inside the project is read, as
    the tool itself reads it (`AGENTS.md -> CLAUDE.md` holding a section pasted by hand shows as there)."""
    path = root / rel
    try:
        if path.resolve().is_relative_to(root.resolve()):
            return None
    except (OSError, RuntimeError):
        return f"{path} is a symlink loop; ctx does not read it"
    link = root
    for part in Path(rel).parts:  # name the link itself: `.claude` when the whole folder is one
        link = link / part
        if link.is_symlink():
            break
    return f"{link} is a symlink out of the project; ctx does not read it"


def make_parent(path: Path) -> str | None:
    """Create the folder `path` goes in; why not (a file in the way, no permission), or None."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {path.parent} ({exc.strerror or exc})"
    return None
