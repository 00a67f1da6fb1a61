"""Benchmark: cold `ctx run index` of one repository per embedding profile (the default-profile question).

    python3 dev.py bench profiles --mirrors DIR                        # django, static and minilm
    python3 dev.py bench profiles --mirrors DIR --repo pallets/flask --profiles static
    python3 dev.py bench profiles --mirrors DIR --commit e7fd69d051ea --out results.json

The repository is materialised at the commit (default: the mirror's HEAD) from a bare git
mirror, and indexed as `*.py` files, the corpus of the retrieval eval. "Cold" means an empty
lake and an empty embedding cache: every chunk is embedded. One-time costs a user pays once per
machine are paid in a warm-up first and reported apart: Prefect's first start and, for the
static profile, distilling the model from the bundled MiniLM. Each `ctx` call is its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CTX = Path(sys.executable).parent / "ctx"


def materialise(mirrors: Path, repo: str, commit: str | None, into: Path) -> str:
    """The repository at `commit` (or HEAD) as files under `into`; returns the full commit hash."""
    from ctxlake.tasks.evaluate import EvalTask, git_dir_for, materialise, resolve_commit

    task = EvalTask("bench", repo, f"github:{repo}", commit, "", ("x",))
    git_dir = git_dir_for(task, [mirrors])
    full = resolve_commit(git_dir, commit or "HEAD")
    materialise.fn(git_dir, full, into)
    return full


def ctx_index(tree: Path, home: Path, profile: str) -> tuple[float, dict[str, Any]]:
    env = {**os.environ, "CTX_HOME": str(home), "CTX_EMBED_MODEL": profile, "CTX_EMBED_PROVIDER": "local",
           "CTX_INDEX_INCLUDE": "*.py", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
    started = time.perf_counter()
    done = subprocess.run([str(CTX), "run", "index", "--json", str(tree)], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ctx run index failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, json.loads(done.stdout)


def warm_up(home: Path, profile: str, scratch: Path) -> float:
    """Pay the once-per-machine costs (Prefect's first start, distilling `static`) on a tiny tree."""
    tiny = scratch / f"warmup-{profile}"
    tiny.mkdir(parents=True, exist_ok=True)
    (tiny / "a.py").write_text("def warm():\n    return 1\n")
    wall, _ = ctx_index(tiny, home, profile)
    shutil.rmtree(tiny / ".ctx", ignore_errors=True)
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mirrors", type=Path, required=True, help="folder of git mirrors (owner+name/repo)")
    parser.add_argument("--repo", default="swe-bench/django__django", help="owner/name in the mirrors")
    parser.add_argument("--commit", default=None, help="commit to index (default: HEAD)")
    parser.add_argument("--profiles", default="static,minilm", help="comma-separated embedding profiles")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    args = parser.parse_args()

    scratch = args.workdir or Path(tempfile.mkdtemp(prefix="ctx-bench-profiles-"))
    tree = scratch / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    commit = materialise(args.mirrors, args.repo, args.commit, tree)
    rows: list[dict[str, Any]] = []
    for profile in [p.strip() for p in args.profiles.split(",") if p.strip()]:
        home = scratch / f"home-{profile}"
        shutil.rmtree(home, ignore_errors=True)
        warm = warm_up(home, profile, scratch)
        shutil.rmtree(home / "embeddings", ignore_errors=True)  # cold: no cached vectors
        shutil.rmtree(tree / ".ctx", ignore_errors=True)
        print(f"[bench] {profile}: cold index of {args.repo}@{commit[:12]} ...", file=sys.stderr, flush=True)
        wall, report = ctx_index(tree, home, profile)
        chunks = int(report["chunks_inserted"])
        rows.append({
            "profile": profile, "repo": args.repo, "commit": commit, "files": report["files_seen"],
            "chunks": chunks, "embedded": report["embedded"], "wall_s": round(wall, 1),
            "keyword_ready_s": round(report["keyword_ready_s"], 1), "encode_s": round(report["encode_seconds"], 1),
            "chunks_per_s": round(report["embedded"] / report["encode_seconds"], 1) if report["encode_seconds"] else None,
            "warm_up_s": round(warm, 1),
        })
    header = ["profile", "files", "chunks", "embedded", "wall_s", "keyword_ready_s", "encode_s", "chunks_per_s", "warm_up_s"]
    print(f"cold `ctx run index` of {args.repo}@{commit[:12]} (*.py), {os.cpu_count()} CPUs")
    print(" | ".join(header))
    for row in rows:
        print(" | ".join(str(row[h]) for h in header))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
