"""Fetch stage of sources: a SourceSpec -> a folder to index (git shallow/sparse clone, local folder), in storage shared by projects."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit

import xxhash

from ctxlake.errors import ConfigError, InputError, SourceError
from ctxlake.schemas.config import IndexSettings, Settings, SourcesSettings
from ctxlake.schemas.git import NO_COMMANDS
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import system_tree
from ctxlake.schemas.sources import NAME_RE, SourceSpec, is_trusted, origin_path
from ctxlake.tasks import freshness
from ctxlake.tasks.stage import stage

SOURCES_DIR = "sources"
TREE_DIR = "tree"  # a git source's work tree, inside its storage folder
PAGES_DIR = "pages"  # a web source's saved pages, inside its storage folder
USERS_FILE = "users.json"
LOCK_FILE = ".lock"
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA_RE = re.compile(r"^[0-9a-f]{7,39}$")
GIT_PROTOCOLS = "file:git:http:https:ssh"
_GIT_URL_RE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[\w.-]+@[\w.-]+:)", re.IGNORECASE)


class Fetched(NamedTuple):
    """What a fetch produced: the folder to index and the version it holds."""

    root: Path
    resolved: str | None  # git: commit sha; web: digest of the saved pages; local: none
    ref_kind: str | None  # git: branch | tag | commit | default
    status: str  # ok | partial
    message: str | None  # for partial: what is missing and why
    changed: bool  # whether the folder's content may differ from the last fetch


# --- where sources live -------------------------------------------------------------------------


# Folders whose scan would read kernel files (/proc/kmsg blocks), devices, or a whole system or
# home: never a source, whatever the user meant. The folder itself and anything under it.


def refuse_system_folder(real: Path) -> None:
    """InputError for `/`, the home folder itself, and system trees (/proc, /sys, /dev, /etc, ...)."""
    home = Path.home().resolve()
    if real == Path(real.anchor) or real == home or system_tree(real):
        what = "your home folder" if real == home else "a system folder"
        raise InputError(f"{real} is {what}: it cannot be a source",
                         hint="add the project or docs folder you mean, e.g. ~/code/lib")


def overlap_with_project(folder: Path, root: Path) -> str | None:
    """A local source against its project: InputError when it is the project (whose files are its
    own index, `ctx run index`); a warning when one holds the other, as their shared files are
    then indexed twice and found twice (a monorepo's other folders, an ignored vendor folder)."""
    folder, root = folder.resolve(), root.resolve()
    if folder == root:
        raise InputError(f"{folder} is the project itself: its files are indexed as 'project' by `ctx run index`",
                         hint="add another repository or docs folder; `ctx run index` indexes this one")
    if folder.is_relative_to(root):
        return (f"{folder} is inside the project, whose own index already holds its files unless ignored: "
                "searches will find them under both names")
    if root.is_relative_to(folder):
        return (f"{folder} holds the project, whose files it indexes again (--paths or --exclude can leave "
                "them out): searches will find them under both names")
    return None


def check_access(spec: SourceSpec, root: Path, home: Path) -> None:
    """Before a source is read on this machine: InputError for a system folder, ConfigError for a
    folder outside the project that the project's sources.toml declares and the user never trusted
    (a clone's sources.toml is the repository author's choice, like its config.toml)."""
    path = origin_path(spec, root)
    if path is None:
        return
    refuse_system_folder(path)
    if not is_trusted(spec, root, home):
        raise ConfigError(
            f"source {spec.name!r} reads {path}, outside the project, and .ctx/sources.toml is not "
            "trusted for it (it may have come with the clone)",
            hint="review .ctx/sources.toml, then run `ctx trust`; or `ctx remove " + spec.name + "`")


def classify_origin(origin: str, docs: bool = False) -> tuple[str, str]:
    """(type, normalised origin) for what a user passed to `ctx add`: a folder, a URL or a git remote."""
    text = origin.strip()
    if not text:
        raise InputError("empty origin", hint="pass a git URL, a folder or an llms.txt URL")
    lowered = text.lower()
    if lowered.startswith(("http://", "https://")):
        path = lowered.split("?", 1)[0].split("#", 1)[0].rstrip("/")
        if path.endswith(("/llms.txt", "/llms-full.txt")) or (docs and not path.endswith(".git")):
            return "web", text
        return "git", text.rstrip("/")
    if _GIT_URL_RE.match(text):
        return "git", text.rstrip("/")
    folder = Path(text).expanduser()
    if folder.is_dir():
        real = folder.resolve()
        refuse_system_folder(real)
        return "local", str(real)
    if folder.exists():
        raise InputError(f"not a folder: {folder}", hint="a local source is a folder, indexed in place")
    raise InputError(
        f"{origin!r} is neither an existing folder nor a URL",
        hint="pass a git URL (https://, ssh://, git@host:repo, file://), a folder, or an llms.txt URL",
    )


def _origin_slug(origin: str) -> str:
    """The readable end of an origin: a repository's or folder's own name, without `.git`."""
    tail = re.sub(r"\.git$", "", origin.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1])
    return re.sub(r"[^A-Za-z0-9._-]+", "-", tail).strip(".-")


def name_for(kind: str, origin: str, docs: bool = False) -> str:
    """The source name `ctx add ORIGIN` takes when none is given: a repository's or folder's own
    name, a web source's host (`www.` dropped); `-docs` after it for `ctx add-docs`."""
    if kind == "web":
        slug = (urlsplit(origin).hostname or "").removeprefix("www.")
    else:
        slug = _origin_slug(origin)
    if docs and not slug.lower().endswith("docs"):
        slug += "-docs"
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", slug).strip(".-_")[:64]
    if not NAME_RE.match(name) or name == PROJECT_SOURCE:  # `project` is the project's own rows
        raise InputError(f"cannot take a source name from {origin!r}", hint="name it: `ctx add NAME ORIGIN`")
    return name


def storage_key(spec: SourceSpec) -> str:
    """Folder name of a fetched source: readable, and equal for equal (type, origin, ref, paths),
    so two projects that add the same thing share one clone."""
    slug = _origin_slug(spec.origin)[:40] or "source"
    identity = "\0".join([spec.type, spec.origin, spec.ref or "", *sorted(spec.paths)])
    return f"{slug}-{xxhash.xxh3_64(identity.encode()).hexdigest()[:12]}"


def storage_dir(home: Path, spec: SourceSpec) -> Path:
    return home / SOURCES_DIR / spec.type / storage_key(spec)


def source_root(settings: Settings, spec: SourceSpec) -> Path:
    """The folder that is indexed (and linked into agent sandboxes) for a source."""
    if spec.type == "local":
        return origin_path(spec, settings.root) or Path(spec.origin)
    sub = TREE_DIR if spec.type == "git" else PAGES_DIR
    return storage_dir(settings.home, spec) / sub


@contextlib.contextmanager
def storage_lock(folder: Path) -> Iterator[None]:
    """One fetch at a time per storage folder: projects sharing a clone take turns."""
    import fcntl

    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_users(folder: Path) -> list[str]:
    try:
        data = json.loads((folder / USERS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [str(u) for u in data] if isinstance(data, list) else []


def claim_storage(folder: Path, user: Path) -> None:
    """Record that the project at `user` uses this storage folder (call with the lock held)."""
    users = _read_users(folder)
    if str(user) not in users:
        (folder / USERS_FILE).write_text(json.dumps(sorted([*users, str(user)])), encoding="utf-8")


def release_storage(folder: Path, user: Path) -> bool:
    """Drop `user` from a storage folder; delete the folder when no project uses it any more.

    Projects that no longer exist on disk are dropped too, so a deleted checkout does not keep
    a clone alive forever. True when the folder was deleted.
    """
    if not folder.exists():
        return False
    with storage_lock(folder):
        users = [u for u in _read_users(folder) if u != str(user) and (Path(u) / ".ctx").is_dir()]
        if users:
            (folder / USERS_FILE).write_text(json.dumps(users), encoding="utf-8")
            return False
        _remove_tree(folder)
    return True


def _remove_tree(folder: Path) -> None:
    # rmtree unlinks symlinks without following them, so nothing outside `folder` is touched.
    shutil.rmtree(folder, ignore_errors=True)


# --- git -----------------------------------------------------------------------------------------


def run_git(args: Sequence[str], cwd: Path, timeout: float) -> str:
    """Run `git ARGS` in `cwd`; stdout, or SourceError with git's last stderr line.

    No terminal prompt is suppressed: in a terminal, git asks for credentials the way the user
    configured it (credential helpers, ssh agent); without one it fails and we say so.
    """
    cmd = ["git", *NO_COMMANDS, "-c", "advice.detachedHead=false", *args]
    # The transports a source may use, whatever the git config allows (`ext::` runs a command; the
    # origin check refuses it, and this holds for remotes git finds elsewhere, e.g. submodules).
    # A GIT_ALLOW_PROTOCOL the user set stays theirs.
    env = {"GIT_ALLOW_PROTOCOL": GIT_PROTOCOLS, **os.environ}
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, start_new_session=True, env=env,
        )
    except FileNotFoundError as exc:
        raise SourceError("git is not installed (needed for git sources)") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # git spawns helpers (remote-https, ssh): end the whole group, not only the parent.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise SourceError(f"`git {args[0]}` took longer than {timeout:.0f} s",
                          hint="raise [sources] git_timeout_s or narrow the source with --paths") from None
    if proc.returncode != 0:
        lines = [ln.strip() for ln in err.splitlines() if ln.strip() and not ln.startswith("hint:")]
        # git's first fatal/error line says what went wrong; the lines after it are advice.
        fatal = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith(("fatal:", "error:"))]
        detail = fatal[0] if fatal else (lines[-1] if lines else f"exit {proc.returncode}")
        raise SourceError(f"`git {args[0]}` failed: {detail}")
    return out


class RemoteRef(NamedTuple):
    kind: str  # branch | tag | commit | default
    fetch: str  # what to pass to `git fetch`
    sha: str | None  # the commit it points at, when the remote says


def resolve_remote_ref(origin: str, ref: str | None, cwd: Path, timeout: float) -> RemoteRef:
    """Ask the remote what `ref` is (one `git ls-remote`); a full sha is taken as a commit."""
    if ref is None:
        out = run_git(["ls-remote", "--", origin, "HEAD"], cwd, timeout)
        sha = next((ln.split()[0] for ln in out.splitlines() if ln.endswith("\tHEAD")), None)
        if sha is None:
            raise SourceError(f"{origin} has no default branch (empty repository?)",
                              hint="pass --ref with a branch or tag")
        return RemoteRef("default", "HEAD", sha)
    if SHA_RE.match(ref.lower()):
        # A full sha names one commit forever: nothing to ask the remote (works offline too).
        return RemoteRef("commit", ref.lower(), ref.lower())
    out = run_git(["ls-remote", "--", origin, f"refs/heads/{ref}", f"refs/tags/{ref}", f"refs/tags/{ref}^{{}}"],
                  cwd, timeout)
    found: dict[str, str] = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if name:
            found[name] = sha
    if f"refs/heads/{ref}" in found:
        return RemoteRef("branch", f"refs/heads/{ref}", found[f"refs/heads/{ref}"])
    if f"refs/tags/{ref}" in found:
        # An annotated tag lists the tag object and, with ^{}, the commit it points at.
        return RemoteRef("tag", f"refs/tags/{ref}", found.get(f"refs/tags/{ref}^{{}}", found[f"refs/tags/{ref}"]))
    if SHORT_SHA_RE.match(ref.lower()):
        raise InputError(f"{ref!r} is not a branch or tag of {origin}",
                         hint="a pinned commit must be given as its full 40-character sha")
    raise InputError(f"no branch or tag {ref!r} in {origin}")


def _head(tree: Path, timeout: float) -> str | None:
    if not (tree / ".git").exists():
        return None
    try:
        return run_git(["rev-parse", "--verify", "-q", "HEAD"], tree, timeout).strip() or None
    except SourceError:
        return None  # a fresh repository with nothing checked out yet


def _tree_bytes(tree: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, dirnames, names in os.walk(tree):
        if dirpath == str(tree) and ".git" in dirnames:
            dirnames.remove(".git")
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(dirpath, name)).st_size
                files += 1
    return files, size


@stage("fetch-git", retries=1)
def fetch_git(spec: SourceSpec, folder: Path, limits: SourcesSettings, user: Path) -> Fetched:
    """Git SourceSpec -> its work tree under `folder` at the newest (or pinned) commit, depth 1."""
    tree = folder / TREE_DIR
    timeout = float(limits.git_timeout_s)
    with storage_lock(folder):
        fresh = not (tree / ".git").exists()
        if fresh:
            _remove_tree(tree)
            tree.mkdir(parents=True)
            run_git(["init", "-q"], tree, timeout)
            run_git(["remote", "add", "origin", spec.origin], tree, timeout)
            if spec.paths:
                # Non-cone patterns: a --paths entry may be a file as well as a folder.
                run_git(["sparse-checkout", "set", "--no-cone", "--", *(f"/{p}" for p in spec.paths)],
                        tree, timeout)
        try:
            remote = resolve_remote_ref(spec.origin, spec.ref, tree, timeout)
            head = _head(tree, timeout)
            changed = head is None or head != remote.sha
            if changed:
                _fetch_and_checkout(spec, tree, remote, limits, timeout)
            resolved = _head(tree, timeout)
        except BaseException:
            if fresh:
                _remove_tree(tree)  # a half-made clone would look like a finished one next time
            raise
        claim_storage(folder, user)
    return Fetched(tree, resolved, remote.kind, "ok", None, changed)


def _fetch_and_checkout(spec: SourceSpec, tree: Path, remote: RemoteRef, limits: SourcesSettings,
                        timeout: float) -> None:
    fetch = ["fetch", "-q", "--depth", "1", "--no-tags"]
    if spec.paths:
        fetch.append("--filter=blob:none")  # blobs come on checkout, for the sparse paths only
    run_git([*fetch, "origin", remote.fetch], tree, timeout)
    listed = run_git(["ls-tree", "-r", "--name-only", "FETCH_HEAD", "--", *spec.paths], tree, timeout)
    names = [ln for ln in listed.splitlines() if ln]
    # A mistyped --paths entry matches nothing: an error naming it, as a local source gives, not
    # a source of 0 files reported ok.
    missing = [p for p in spec.paths if not any(n == p or n.startswith(p + "/") for n in names)]
    if missing:
        raise SourceError(f"--paths {', '.join(map(repr, missing))} not found in {spec.origin} at {spec.ref or 'its default branch'}",
                          hint="check the paths (they are relative to the repository root)")
    n_files = len(names)
    if n_files > limits.max_files:
        raise SourceError(
            f"{spec.origin} has {n_files:,} files{' under --paths' if spec.paths else ''}, over the limit of "
            f"{limits.max_files:,}",
            hint="narrow it with --paths, or raise [sources] max_files",
        )
    run_git(["checkout", "-q", "--force", "--detach", "FETCH_HEAD"], tree, timeout)
    _, size = _tree_bytes(tree)
    if size > limits.max_bytes:
        raise SourceError(
            f"{spec.origin} checks out to {size / 1e6:,.0f} MB, over the limit of {limits.max_bytes / 1e6:,.0f} MB",
            hint="narrow it with --paths, or raise [sources] max_bytes",
        )


# --- local ---------------------------------------------------------------------------------------


@stage("fetch-local")
def fetch_local(spec: SourceSpec, project: Path) -> Fetched:
    """Local SourceSpec -> the folder itself (indexed in place, never copied); a relative origin is
    relative to the `project` root."""
    root = origin_path(spec, project) or Path(spec.origin)
    refuse_system_folder(root)  # whatever wrote the spec (`ctx add --type local`, an edited sources.toml)
    if not root.is_dir():
        raise SourceError(f"the folder of source {spec.name!r} is gone: {root}",
                          hint=f"restore it, or `ctx remove {spec.name}`")
    missing = [path for path in spec.paths if not (root / path).exists()]
    if missing:
        raise SourceError(f"--paths {', '.join(map(repr, missing))} not found in {root}",
                          hint=f"check the paths of {spec.name!r} in .ctx/sources.toml")
    # Nothing is fetched: whether it changed is the Merkle diff's call.
    return Fetched(root, None, None, "ok", None, False)



def is_current(spec: SourceSpec, root: Path, lake_dir: Path, index: IndexSettings,
               last_status: str | None, timeout: float) -> bool:
    """True when a sync would do nothing: the last one was ok, the remote (git) still points at
    the commit checked out, and the folder matches the index. Decided without Prefect, so a
    no-op `ctx update` returns at once; web sources always sync (their check is the conditional
    GETs themselves). Any doubt (an unreachable remote, say) answers False and the sync reports it.
    """
    if last_status != "ok" or spec.type == "web" or not root.is_dir():
        return False
    if spec.type == "git":
        try:
            remote = resolve_remote_ref(spec.origin, spec.ref, root, timeout)
        except (SourceError, InputError):
            return False
        if _head(root, timeout) != remote.sha:
            return False
    return freshness.check(lake_dir, spec.name, root, index).up_to_date
