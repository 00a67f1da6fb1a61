"""Plain helpers for tests (fixtures live in conftest.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = REPO_ROOT.parent / "shared"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True,
        env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
             "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"},
    )
    return out.stdout.strip()


def write_files(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")


def ctx_subprocess(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300,
                   via: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    """Run the installed `ctx` in a fresh process (for start-up, exit-code and signal behaviour);
    `via` is a command prefix to start it through (see permission_bound)."""
    exe = Path(sys.executable).parent / "ctx"
    return subprocess.run(
        [*via, str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
    )


def permission_bound(probe: Path) -> list[str]:
    """A command prefix that starts a process the kernel holds to file permissions, for the tests
    of unreadable files: root reads a chmod 000 file anyway (CAP_DAC_OVERRIDE), so as root the
    child is started without the two capabilities that bypass permissions in its bounding set
    (`setpriv`); it stays root and owns what it writes. `probe` is a file made unreadable: when
    the child can still read it, the test is skipped."""
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: every file is readable here")
        prefix = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    done = subprocess.run([*prefix, "cat", str(probe)], capture_output=True)
    if done.returncode == 0:
        pytest.skip(f"{probe} (chmod 000) is still readable by a child process here")
    return prefix


def shared_path(*parts: str) -> Path:
    """A file under ../shared (beside the checkout); skips the test with the reason when absent."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is not here: ../shared holds the evaluation data and agent-log fixtures")
    return path


def lake_fingerprint(lake_dir: Path) -> dict[str, object]:
    """What a lake holds, minus timestamps: FILES rows, CHUNKS rows (with vectors), duplicates.

    Two lakes built from the same tree must have equal fingerprints, however they got there.
    """
    import lancedb

    db = lancedb.connect(str(lake_dir))
    files = db.open_table("files").to_arrow().drop_columns(["indexed_at", "mtime_ns"]).to_pylist()
    chunk_table = db.open_table("chunks").to_arrow()
    chunks = chunk_table.drop_columns(["vector"]).to_pylist()
    vectors = chunk_table.column("vector").to_pylist()
    ids = [c["id"] for c in chunks]
    return {
        "files": sorted((f["source"], f["path"], f["hash"], f["size"], f["lang"], f["n_chunks"]) for f in files),
        "chunks": sorted(
            (c["id"], c["source"], c["path"], c["start_line"], c["end_line"], c["symbol"], c["kind"],
             c["content_hash"], tuple(round(x, 5) for x in v) if v is not None else None)
            for c, v in zip(chunks, vectors, strict=True)
        ),
        "duplicate_ids": len(ids) - len(set(ids)),
        "missing_vectors": sum(v is None for v in vectors),
    }


def damage_lake(lake: Path, how: str) -> None:
    """Damage a project's lake the ways a crash, a bad disk or a stray `rm` do."""
    chunks = lake / "chunks.lance"
    if how == "truncated":  # a crash or a bad disk cut a data file short
        biggest = max((chunks / "data").glob("*.lance"), key=lambda f: f.stat().st_size)
        with open(biggest, "r+b") as fh:
            fh.truncate(500)
    elif how == "data_deleted":
        for f in (chunks / "data").glob("*.lance"):
            f.unlink()
    elif how == "no_manifest":
        for f in (chunks / "_versions").glob("*.manifest"):
            f.unlink()
    elif how == "no_indices":  # the BM25 index a keyword search reads is gone
        shutil.rmtree(chunks / "_indices")
    elif how == "state":
        (lake / "state.json").write_text("{garbage")
    else:
        raise ValueError(f"unknown damage {how!r}")


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `seconds`."""
    import psutil

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False
