"""Project roots (schemas stage; no tables): the .ctx/ folder, finding a project's root, ctxlake's home, roots refused.

Where a command's project is (the nearest .ctx/, else git's top level), which roots are never indexed
(home, a filesystem root, system trees, CTX_HOME), and which .ctx/ links are never followed."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ctxlake.errors import ConfigError, InputError, NotIndexedError
from ctxlake.schemas.git import git_args

CTX_DIR = ".ctx"
CONFIG_FILE = "config.toml"


def default_home(env: dict[str, str] | None = None) -> Path:
    source = os.environ if env is None else env
    if source.get("CTX_HOME"):
        home = Path(source["CTX_HOME"]).expanduser().resolve()
        # The first part of it that exists must be a folder: a file there failed later, deep in
        # whichever command first made models/ or embeddings/ (a NotADirectoryError traceback).
        existing = next((p for p in (home, *home.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            raise ConfigError(f"CTX_HOME is {source['CTX_HOME']}, and {existing} is not a folder",
                              hint="point CTX_HOME at a folder (ctxlake's user data: models, embedding cache), "
                                   "or unset it for the default")
        return home
    from platformdirs import user_data_dir

    return Path(user_data_dir("ctxlake", appauthor=False))


def find_root(start: Path) -> Path | None:
    """The nearest folder at or above `start` that holds a .ctx/ folder, like git finds .git."""
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / CTX_DIR).is_dir():
            return folder
    return None


def git_toplevel(start: Path) -> Path | None:
    try:
        out = subprocess.run(
            git_args(start, "rev-parse", "--show-toplevel"),
            capture_output=True, text=True, timeout=5, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out.stdout.strip()).resolve() if out.returncode == 0 and out.stdout.strip() else None


# Trees of the running system, never a project: refused as index roots and as sources (/etc holds
# the password hashes root can read; /proc and /sys are endless and change as they are read).
SYSTEM_TREES = ("/proc", "/sys", "/dev", "/etc", "/boot", "/run")


def system_tree(real: Path) -> bool:
    """Whether a resolved path is a system tree or inside one."""
    text = str(real)
    return any(text == tree or text.startswith(tree + "/") for tree in SYSTEM_TREES)


def _refuse_broad(root: Path, allow_home: bool) -> Path:
    if not allow_home and (root == Path(root.anchor) or root == Path.home().resolve()):
        # Almost always a mistake (a terminal left in ~ or /, a path typed short), and a very long one.
        raise InputError(f"refusing to index {root}: it is {'your home folder' if root != Path(root.anchor) else 'a filesystem root'}",
                         hint=f"run `ctx run index {root} --allow-home` if you really mean it")
    if system_tree(root):
        raise InputError(f"refusing to index {root}: it is a system folder", hint="index a project folder")
    data = default_home().resolve()
    if root == data or data in root.parents:
        raise InputError(f"refusing to index {root}: it is ctxlake's own data folder (CTX_HOME: models, "
                         "embedding cache, memory lake)", hint="index a project folder")
    return root


def resolve_root(path: Path | None, *, for_write: bool, allow_home: bool = False) -> Path:
    """The project root for a command.

    An explicit path is the root itself. Otherwise: the nearest ancestor with .ctx/, else (when
    the command creates an index) the enclosing git work tree, else the current folder. A new
    index of the home folder or a filesystem root needs `allow_home`, whichever way it was named.
    """
    if path is not None:
        if not path.exists():
            raise InputError(f"path does not exist: {path}")
        if not path.is_dir():
            raise InputError(f"not a folder: {path}", hint="ctx indexes folders")
        found = find_root(path)
        if found is not None and not for_write:
            return found
        return _refuse_broad(path.resolve(), allow_home) if for_write else path.resolve()
    cwd = Path.cwd()
    found = find_root(cwd)
    if found is not None:
        return found
    if for_write:
        return _refuse_broad(git_toplevel(cwd) or cwd.resolve(), allow_home)
    # "Not indexed" whether .ctx/ is missing or only its lake is: one exit code for one meaning.
    raise NotIndexedError(
        f"no ctxlake index in {cwd} or any parent folder (looked for {CTX_DIR}/)",
        hint="run `ctx run index` in the project first",
    )


# The parts of .ctx/ that ctx writes (the lake, knowledge, the registry) or reads as settings.
CTX_PARTS = ("lake", "knowledge", "registry", CONFIG_FILE)


def check_ctx_links(root: Path) -> None:
    """ConfigError when .ctx/, or one of its parts (CTX_PARTS), is a symlink that leads out of the
    project and is committed to the project's git repository. A clone brings such a link with it:
    `.ctx -> ~/.ssh` would put the lake's files there, `.ctx/knowledge -> ~/notes` would serve those
    notes to every agent. A link the user made (git does not track it) is theirs: a lake on another
    disk is a fair use."""
    base = root / CTX_DIR
    candidates = [base] if base.is_symlink() else [base / part for part in CTX_PARTS]
    real_root = root.resolve()
    outside = [p for p in candidates if p.is_symlink() and not p.resolve().is_relative_to(real_root)]
    if not outside:
        return
    rels = [p.relative_to(root).as_posix() for p in outside]
    try:
        # core.fsmonitor runs on ls-files: git_args sets it off (an archive's .git/config may name one).
        listed = subprocess.run(git_args(root, "ls-files", "-z", "--", *rels),
                                capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return
    tracked = [rel for rel in listed.stdout.decode("utf-8", "replace").split("\0") if rel in rels]
    if listed.returncode == 0 and tracked:
        target = (root / tracked[0]).resolve()
        raise ConfigError(
            f"{root / tracked[0]} is a symlink committed to the repository, to {target}, outside the project; "
            "ctx does not read or write its index through it",
            hint=f"remove the link (`git rm {tracked[0]}`); ctx makes {CTX_DIR}/ itself on the next `ctx run index`",
        )
