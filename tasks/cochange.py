"""Stage co-change: git history -> COCHANGE rows (pairs of files changed in the same commits, recency-weighted).

Bounded (the newest MAX_COMMITS commits, commits touching more than MAX_FILES files skipped as bulk
changes) and incremental: a run reads only the commits since the head it saw last and adds their
weights to the stored sums. Weights grow with time (2 ** ((t - t0) / half-life)), so adding newer
commits never needs the older ones again; readers divide by the newest commit's weight.
Only history reachable from the work tree's HEAD is read: for a task checked out at its base
commit, nothing after that commit can leak in.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import combinations
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxlake.schemas.git import git_args
from ctxlake.schemas.tables import COCHANGE, COCHANGE_TABLE
from ctxlake.tasks.lake import open_table, write_atomic

MAX_COMMITS = 2_000  # history read on a first build
MAX_FILES = 50  # a commit touching more files is a bulk change (a rename, a reformat): skipped
HALF_LIFE_DAYS = 365.0
STATE_FILE = "cochange.json"
PATHS = "relative"  # the state of a lake whose pairs carry paths relative to the project (git log --relative)


@dataclass
class Commit:
    sha: str
    time: int  # committer time, epoch seconds
    files: list[str]


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(git_args(root, *args), capture_output=True, text=True, timeout=120,
                              check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def head(root: Path, rev: str = "HEAD") -> str | None:
    out = _git(root, "rev-parse", "--verify", "-q", f"{rev}^{{commit}}")
    return out.strip() if out else None


def commits(root: Path, since: str | None, limit: int = MAX_COMMITS, rev: str = "HEAD") -> Iterator[Commit]:
    """Commits reachable from `rev` (newest first), after `since` when given; merges left out."""
    span = f"{since}..{rev}" if since else rev
    # --relative: a project that is a folder of a larger repository gets its own files' paths,
    # relative to it as the index has them (and nothing outside it), not the repository's.
    out = _git(root, "log", "--no-merges", "--no-renames", "--relative", "-z", "--name-only",
               "--format=%x01%H %ct %P", f"-n{limit}", span, "--")
    # Each commit: "\x01<sha> <time> <parents>\x00\n" then its paths, each ended by "\x00".
    for block in (out or "").split("\x01")[1:]:
        header, _, names = block.partition("\x00")
        sha, stamp, *parents = header.split()
        if not parents:  # a root commit brings a codebase in: its files did not change together
            continue
        files = sorted({n.strip("\n") for n in names.split("\x00") if n.strip("\n")})
        yield Commit(sha, int(stamp or 0), files)


def weight(time: int, t0: int) -> float:
    return float(2.0 ** ((time - t0) / (HALF_LIFE_DAYS * 86400)))


def pair_sums(history: list[Commit], t0: int) -> dict[tuple[str, str], tuple[float, int, int]]:
    """Commits -> {(path, other): (weight sum, commits, newest time)}, both directions."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0, 0])
    for commit in history:
        if not 2 <= len(commit.files) <= MAX_FILES:
            continue
        w = weight(commit.time, t0)
        for a, b in combinations(commit.files, 2):
            for key in ((a, b), (b, a)):
                entry = sums[key]
                entry[0] += w
                entry[1] += 1
                entry[2] = max(entry[2], commit.time)
    return {k: (v[0], int(v[1]), int(v[2])) for k, v in sums.items()}


def update_cochange(db: Any, lake_dir: Path, root: Path, source: str, rev: str = "HEAD") -> int:
    """(lake, a git work tree) -> COCHANGE rows brought up to `rev` (HEAD); returns the commits read (0: up to date or no git).

    `root` may also be a bare repository and `rev` a commit in it: what `ctx eval` does to give a
    task's lake the history before its base commit, and nothing after."""
    now = head(root, rev)
    if now is None:
        return 0
    state_path = lake_dir / STATE_FILE
    try:
        state = json.loads(state_path.read_text(encoding="utf-8")).get(source, {})
    except (OSError, ValueError):
        state = {}
    # Up to date only while the table is there too (`ctx run index --force` drops one it cannot read).
    if state.get("head") == now and state.get("paths") == PATHS and (lake_dir / f"{COCHANGE_TABLE}.lance").is_dir():
        return 0
    since = state.get("head")
    table = open_table(db, COCHANGE_TABLE)
    # History rewritten (rebase, another branch) or never built: start over from the newest commits.
    # Rows from before --relative (a project inside a larger repository got the repository's paths)
    # are rebuilt once, too.
    rebuild = (since is None or table is None or state.get("paths") != PATHS
               or _git(root, "merge-base", "--is-ancestor", since, now) is None)
    history = list(commits(root, None if rebuild else since, rev=now))
    if not history:
        if rebuild and table is not None:
            table.delete(f"source = '{source.replace(chr(39), chr(39) * 2)}'")  # rows of another history
        return 0
    t0 = int(state.get("t0") or min(c.time for c in history)) if not rebuild else min(c.time for c in history)
    fresh = pair_sums(history, t0)
    if rebuild:
        rows = fresh
        if table is not None:
            table.delete(f"source = '{source.replace(chr(39), chr(39) * 2)}'")
    else:
        rows = _merged(table, source, fresh)
    if rows:
        data = pa.Table.from_pylist([
            {"source": source, "path": a, "other": b, "weight": w, "commits": n,
             "last_change": datetime.fromtimestamp(t, UTC)}
            for (a, b), (w, n, t) in rows.items()], schema=COCHANGE)
        if table is None:
            db.create_table(COCHANGE_TABLE, data=data, schema=COCHANGE)
        else:
            (table.merge_insert(["source", "path", "other"]).when_matched_update_all()
             .when_not_matched_insert_all().execute(data))
    saved: dict[str, Any] = {}
    try:
        saved = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        saved = {}
    newest = max(c.time for c in history)
    saved[source] = {"head": now, "t0": t0, "newest": max(newest, int(state.get("newest") or 0)), "paths": PATHS}
    write_atomic(state_path, json.dumps(saved, indent=2))
    return len(history)


def _merged(table: Any, source: str, fresh: dict[tuple[str, str], tuple[float, int, int]]
            ) -> dict[tuple[str, str], tuple[float, int, int]]:
    """New commits' sums added to the stored rows of the same pairs."""
    paths = sorted({a for a, _ in fresh})
    stored: dict[tuple[str, str], tuple[float, int, int]] = {}
    for i in range(0, len(paths), 500):
        quoted = ", ".join("'" + p.replace("'", "''") + "'" for p in paths[i:i + 500])
        rows = (table.search().where(f"source = '{source.replace(chr(39), chr(39) * 2)}' AND path IN ({quoted})")
                .select(["path", "other", "weight", "commits", "last_change"]).limit(None).to_arrow().to_pylist())
        for r in rows:
            stored[(r["path"], r["other"])] = (r["weight"], r["commits"], int(r["last_change"].timestamp()))
    out = {}
    for key, (w, n, t) in fresh.items():
        old = stored.get(key, (0.0, 0, 0))
        out[key] = (old[0] + w, old[1] + n, max(old[2], t))
    return out


def strength(weight_sum: float, newest: float) -> float:
    """A pair's summed weight -> 0..1: one commit as recent as the newest counts 0.5, two 0.75..."""
    return 1.0 - 0.5 ** (weight_sum / newest)


def newest_weight(lake_dir: Path, source: str) -> float | None:
    """The weight of the newest commit read for source: readers divide by it (None: never built)."""
    try:
        state = json.loads((lake_dir / STATE_FILE).read_text(encoding="utf-8")).get(source)
    except (OSError, ValueError):
        return None
    if not state:
        return None
    return weight(int(state["newest"]), int(state["t0"]))


def forget_history(lake_dir: Path, source: str) -> None:
    """Drop a removed source's entry from the co-change state (its rows go with the source's rows)."""
    state_path = lake_dir / STATE_FILE
    try:
        saved = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(saved, dict) and saved.pop(source, None) is not None:
        write_atomic(state_path, json.dumps(saved, indent=2))
