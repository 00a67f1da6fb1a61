"""Eval stage: a task file (JSONL) -> EvalTask rows, each task's repository tree materialised at its commit."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ctxlake.errors import InputError
from ctxlake.tasks.stage import stage

# A commit named by a task: a full or abbreviated hex object name (never a ref or an option).
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,64}$")
GIT_TIMEOUT_S = 600


@dataclass(frozen=True)
class EvalTask:
    """One file-localisation task: find `gold_files` in `repo` at `base_commit` from `query`."""

    instance_id: str
    repo: str  # a label for per-repository tables: owner/name, or the folder's name
    source: str  # where the repository comes from: github:owner/name, owner/name or a local path
    base_commit: str | None  # None: index the local folder as it is
    query: str
    gold_files: tuple[str, ...]


@dataclass
class TaskFile:
    tasks: list[EvalTask]
    skipped: list[str] = field(default_factory=list)  # "line N: why", one per unusable line


def _text(obj: dict[str, object], key: str) -> str | None:
    value = obj.get(key)
    return value.strip() if isinstance(value, str) and value.strip() else None


def parse_task(obj: object, base: Path) -> EvalTask:
    """One decoded JSON line -> an EvalTask; raises ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    query = _text(obj, "problem_statement") or _text(obj, "query")
    if query is None:
        raise ValueError("no problem_statement (or query)")
    gold = obj.get("gold_files")
    if not isinstance(gold, list) or not gold or not all(isinstance(g, str) and g.strip() for g in gold):
        raise ValueError("gold_files must be a non-empty list of paths")
    source = _text(obj, "fetch_source") or _text(obj, "repo") or _text(obj, "repo_path")
    if source is None:
        raise ValueError("no repo, repo_path or fetch_source")
    local = _local_repo(source, base)
    if local is not None:
        source = str(local)
    commit = _text(obj, "base_commit")
    if commit is not None and not _COMMIT.match(commit):
        raise ValueError(f"base_commit {commit!r} is not a commit hash")
    if commit is None and local is None:
        raise ValueError("a remote repository needs a base_commit")
    label = _text(obj, "repo") or source
    if local is not None and label == str(local):
        label = local.name
    instance = _text(obj, "instance_id") or f"{label}@{(commit or 'worktree')[:12]}"
    gold_files = tuple(dict.fromkeys(g.strip().lstrip("/") for g in gold if isinstance(g, str)))
    return EvalTask(instance, label, source, commit, query, gold_files)


def _local_repo(source: str, base: Path) -> Path | None:
    """A task's repository as a local folder, if it names one (absolute, or relative to the task file)."""
    if source.startswith(("github:", "http://", "https://", "git@")):
        return None
    candidate = Path(source).expanduser()
    if not candidate.is_absolute():
        candidate = base / candidate
    return candidate.resolve() if candidate.is_dir() else None


def load_tasks(path: Path, limit: int | None = None, only: Sequence[str] | None = None) -> TaskFile:
    """A JSONL task file -> its tasks; unusable lines are skipped and listed, never silently lost."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read the task file {path}: {exc.strerror or exc}") from exc
    out = TaskFile([])
    seen: set[str] = set()
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = parse_task(json.loads(line.decode("utf-8")), path.parent)
        except UnicodeDecodeError as exc:
            out.skipped.append(f"line {number}: not UTF-8 ({exc.reason} at byte {exc.start})")
            continue
        except json.JSONDecodeError as exc:
            # "Unterminated string starting at" is one of json's messages: no "at at column 2".
            out.skipped.append(f"line {number}: invalid JSON ({exc.msg.removesuffix(' at')} at column {exc.colno})")
            continue
        except ValueError as exc:
            out.skipped.append(f"line {number}: {exc}")
            continue
        if task.instance_id in seen:
            out.skipped.append(f"line {number}: duplicate instance_id {task.instance_id}")
            continue
        seen.add(task.instance_id)
        out.tasks.append(task)
    if only:
        wanted = set(only)
        out.tasks = [t for t in out.tasks if t.instance_id in wanted or t.repo in wanted]
    if limit is not None:
        out.tasks = out.tasks[:limit]
    if not out.tasks:
        detail = f" ({out.skipped[0]}{' …' if len(out.skipped) > 1 else ''})" if out.skipped else ""
        raise InputError(f"no usable task in {path}{detail}",
                         hint="each line: {problem_statement, gold_files, repo|fetch_source, base_commit}")
    return out


# -- repositories --------------------------------------------------------------------------------


def slug(name: str) -> str:
    """A folder-safe name for a repository label or model id."""
    return re.sub(r"[^A-Za-z0-9._-]+", "+", name).strip("+.") or "repo"


def git_dir_for(task: EvalTask, mirrors: Sequence[Path]) -> Path:
    """The git directory (bare, or a work tree's .git) that holds the task's repository.

    `github:owner/name` and `owner/name` are looked up in each mirrors folder as
    `owner+name/repo`, `owner+name` and `owner/name`; a local path is used as it is.
    """
    local = Path(task.source)
    if local.is_absolute():
        return _as_git_dir(local) or _no_repo(task, [local])
    name = task.source.removeprefix("github:").removesuffix(".git").strip("/")
    looked: list[Path] = []
    for folder in mirrors:
        owner_name = name.replace("/", "+")
        for candidate in (folder / owner_name / "repo", folder / owner_name, folder / name):
            looked.append(candidate)
            found = _as_git_dir(candidate)
            if found is not None:
                return found
    if not mirrors:
        raise InputError(
            f"task {task.instance_id} names {task.source}, and no --mirrors folder was given",
            hint="pass --mirrors DIR holding owner+name/repo git mirrors (ctx never fetches)",
        )
    return _no_repo(task, looked)


def _no_repo(task: EvalTask, looked: Sequence[Path]) -> Path:
    shown = ", ".join(str(p) for p in looked[:6])
    raise InputError(f"no git repository for {task.source} (task {task.instance_id}); looked in {shown}",
                     hint="fetch it first, or point --mirrors at the folder holding it")


def _as_git_dir(path: Path) -> Path | None:
    if (path / ".git").exists():
        path = path / ".git"
    if not path.is_dir() or not (path / "HEAD").is_file() or not (path / "objects").is_dir():
        # A worktree's .git is a file, and a linked worktree's objects live elsewhere: ask git.
        out = _git(path.parent if path.name == ".git" else path, ["rev-parse", "--absolute-git-dir"],
                   check=False)
        return Path(out.strip()) if out.strip() else None
    return path


def _git(cwd_or_dir: Path, args: list[str], check: bool = True, git_dir: bool = False) -> str:
    cmd = ["git", f"--git-dir={cwd_or_dir}", *args] if git_dir else ["git", "-C", str(cwd_or_dir), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        if check:
            raise InputError(f"git failed in {cwd_or_dir}: {exc}") from exc
        return ""
    if done.returncode != 0:
        if check:
            raise InputError(f"git {' '.join(args)} failed in {cwd_or_dir}: {done.stderr.strip()[:300]}")
        return ""
    return done.stdout


def resolve_commit(git_dir: Path, commit: str) -> str:
    """The full hash of `commit` in `git_dir`; InputError when the repository lacks it."""
    out = _git(git_dir, ["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], check=False,
               git_dir=True)
    if not out.strip():
        raise InputError(f"commit {commit} is not in {git_dir}",
                         hint="fetch the repository's history (the SWE-bench mirrors hold every base commit)")
    return out.strip()


def tree_dir(trees_root: Path, task: EvalTask, commit: str) -> Path:
    return trees_root / f"{slug(task.repo)}@{commit[:12]}"


@dataclass
class Materialised:
    tree: Path
    missing: list[str]  # files the repository lists at the commit but whose content it lacks
    unsafe: list[str]  # paths refused because they would land outside the tree


@stage("materialise", retries=1)
def materialise(git_dir: Path, commit: str, dest: Path) -> Materialised:
    """A commit of a git repository -> its files under `dest` (extracted once, then reused).

    Mirrors may lack some blobs (large data files left out of a snapshot): those files are
    skipped and listed, so one absent asset does not cost the whole tree.
    """
    record = dest.with_name(dest.name + ".json")
    if dest.is_dir():
        return _read_record(dest, record)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:
        # Two evals sharing the cache wait for each other instead of extracting twice.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.is_dir():
            return _read_record(dest, record)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            missing, unsafe = _extract(git_dir, commit, tmp)
            record.write_text(json.dumps({"commit": commit, "missing": missing, "unsafe": unsafe}))
            os.replace(tmp, dest)  # a killed extraction never leaves a half tree under dest
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Materialised(dest, missing, unsafe)


def _read_record(dest: Path, record: Path) -> Materialised:
    try:
        data = json.loads(record.read_text())
        return Materialised(dest, list(data.get("missing", [])), list(data.get("unsafe", [])))
    except (OSError, ValueError):
        return Materialised(dest, [], [])


def _safe_parts(path: str) -> list[str] | None:
    parts = path.split("/")
    if path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts):
        return None
    return parts


def _extract(git_dir: Path, commit: str, into: Path) -> tuple[list[str], list[str]]:
    """Write every blob of `commit` under `into` via `git cat-file --batch`; (missing, unsafe)."""
    listing = _git(git_dir, ["ls-tree", "-r", "-z", "--full-tree", commit], git_dir=True)
    entries: list[tuple[str, str, str]] = []  # mode, sha, path
    unsafe: list[str] = []
    for item in listing.split("\0"):
        if not item:
            continue
        meta, _, path = item.partition("\t")
        mode, kind, sha = meta.split(" ")
        if kind != "blob":
            continue  # submodules have no content here
        if _safe_parts(path) is None:
            unsafe.append(path)
            continue
        entries.append((mode, sha, path))
    proc = subprocess.Popen(["git", f"--git-dir={git_dir}", "cat-file", "--batch"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    def feed() -> None:
        assert proc.stdin is not None
        try:
            for _, sha, _ in entries:
                proc.stdin.write(sha.encode() + b"\n")
            proc.stdin.close()
        except BrokenPipeError:
            pass

    import threading

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    missing: list[str] = []
    try:
        for mode, _, path in entries:
            header = proc.stdout.readline().split()
            if len(header) < 3 or header[1] != b"blob":
                missing.append(path)
                continue
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)  # the newline after each object
            target = into / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if mode == "120000":
                # Symlinks stay links (the scanner never follows them), kept inside the tree.
                link = data.decode("utf-8", "replace")
                if link.startswith("/") or ".." in link.split("/"):
                    unsafe.append(path)
                    continue
                os.symlink(link, target)
                continue
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
    finally:
        writer.join()
        proc.stdout.close()
        if proc.wait() != 0 and not entries:
            raise InputError(f"git cat-file failed in {git_dir} for {commit[:12]}")
    return missing, unsafe
