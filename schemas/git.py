"""git, run in a project ctx did not make: its own config may not start commands.

A repository's `.git/config` is not cloned, but a project that arrives as an archive or a shared
folder carries one, and git runs what it names while answering read-only questions: `core.fsmonitor`
on `git ls-files`, `git diff` and `git status`; a `filter.<driver>.clean` or `process` (chosen per file
by a committed `.gitattributes`) on a work-tree diff; `gpg.program` on `git log` once
`log.showSignature` is set; text conversion and external diff drivers on `git diff`. Every git call
that ctx makes in a project (the link check, the hand-off's diff, co-change, the commit list of a
compaction) goes through `git_args`, which overrides each of those for that one call; the
repository's config stays as it is. Filter drivers are emptied only where the repository's own
config defines them: the user's global ones (git-lfs's) still apply.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

# Keys whose value is a command git runs on read-only work (see the module's text), set off here.
NO_COMMANDS = ("-c", "core.fsmonitor=false", "-c", "log.showSignature=false")
# Added to `git diff` and `git log -p`: no external diff or text-conversion drivers (an empty
# diff.external in NO_COMMANDS would not do: git then fails to run "").
NO_DIFF_DRIVERS = ("--no-ext-diff", "--no-textconv")
FILTER_KEYS = ("clean", "smudge", "process")


def _filter_drivers(repo: Path) -> list[str]:
    """The filter drivers the repository's own config defines (`.git/config`, its worktree config and
    what they include), by name. The user's global and system drivers (git-lfs's, say) are theirs
    and stay. A git without --show-scope (before 2.26): every driver. Reading config runs nothing."""
    query = [*NO_COMMANDS, "config", "--show-scope", "--get-regexp", r"^filter\..*\.(clean|smudge|process)$"]
    lines = _config_lines(repo, query)
    if lines is None:
        lines = [f"local\t{line}" for line in _config_lines(repo, [q for q in query if q != "--show-scope"]) or []]
    names = []
    for line in lines:
        scope, _, entry = line.partition("\t")
        if scope not in ("local", "worktree"):
            continue
        key = entry.split(" ", 1)[0]  # filter.<name>.<key>; a name may hold dots
        name = key[len("filter."):key.rfind(".")]
        if name and name not in names:
            names.append(name)
    return names


def _config_lines(repo: Path, args: list[str]) -> list[str] | None:
    """`git config ARGS` output lines; [] when nothing matched, None when git refused the query."""
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode not in (0, 1):  # 1: no such key
        return None
    return done.stdout.splitlines()


def git_args(repo: Path, *args: str, work_tree: bool = False) -> list[str]:
    """`git -C repo ARGS` with the repository's command-running settings off. `work_tree`: the call
    reads files of the work tree (a diff against it), so filter drivers are emptied too, which costs
    one `git config` call to learn their names."""
    overrides: list[str] = list(NO_COMMANDS)
    if work_tree:
        for name in _filter_drivers(repo):
            for key in FILTER_KEYS:
                overrides += ["-c", f"filter.{name}.{key}="]
    return ["git", "-C", str(repo), *overrides, *args]
