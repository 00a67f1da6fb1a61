"""Benchmark: watch-mode freshness on django, a branch-switch burst, and crash convergence under SIGKILL.

    python3 dev.py bench watch                          # static profile, 50 edits, 500-file burst, 10 kills
    python3 dev.py bench watch --profile minilm --edits 50 --kills 10

1. Edit -> searchable: with `ctx run index --watch` running on django, append a new uniquely
   named function to a random source file, then poll the lake (a fresh connection per poll, as a
   new CLI process would see it) until a keyword query finds it. 50 edits, one at a time.
2. Burst: commit 500 new files on a branch, `git checkout` it while watching, time until all
   500 are in the lake; then back.
3. Crash convergence: SIGKILL a plain `ctx run index` of flask at random moments (no fault
   injection: real timing), re-run, compare the lake with a fresh index (files, chunk ids,
   vectors, duplicates). Reports kills survived / kills tried.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_index import CTX, MIRRORS, ROOT, materialise
from helpers import lake_fingerprint


def env_for(workdir: Path, profile: str) -> dict[str, str]:
    return {**os.environ, "CTX_HOME": str(workdir / "home"), "CTX_EMBED_MODEL": profile,
            "PREFECT_HOME": str(workdir / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "600"}


def found(lake: Path, token: str) -> bool:
    import lancedb
    from lancedb.query import MatchQuery

    try:
        table = lancedb.connect(str(lake)).open_table("chunks")
        return bool(table.search(MatchQuery(token, "text"), query_type="fts").limit(1).to_list())  # type: ignore[call-arg]
    except (OSError, RuntimeError, ValueError):
        return False


def count_paths(lake: Path, prefix: str) -> int:
    import lancedb

    table = lancedb.connect(str(lake)).open_table("files")
    return table.count_rows(f"path LIKE '{prefix}%'")


def wait(check: Any, timeout: float) -> float | None:
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if check():
            return time.perf_counter() - started
        time.sleep(0.02)
    return None


def watch_bench(tree: Path, env: dict[str, str], edits: int, burst: int, seed: int) -> dict[str, Any]:
    lake = tree / ".ctx" / "lake"
    git_env = {**env, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
               "GIT_COMMITTER_EMAIL": "b@x"}
    proc = subprocess.Popen([str(CTX), "run", "index", "--watch"], cwd=tree, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    out: dict[str, Any] = {}
    try:
        print("waiting for the initial index and the watcher ...", file=sys.stderr, flush=True)
        status = lambda: subprocess.run([str(CTX), "status", "--json"], cwd=tree, env=env,  # noqa: E731
                                        capture_output=True, text=True)

        def ready() -> bool:
            done = status()
            if done.returncode != 0:
                return False
            data = json.loads(done.stdout)
            return bool(data.get("indexed") and data.get("clean") and data.get("pending_vectors") == 0)

        if wait(ready, 3600) is None:
            raise SystemExit("initial index did not finish")
        time.sleep(2)
        rng = random.Random(seed)
        files = sorted(p for p in tree.rglob("*.py") if ".ctx" not in p.parts and "tests" not in p.parts)
        latencies: list[float] = []
        missed = 0
        for i in range(edits):
            # One alphanumeric token: the FTS tokenizer splits on `_`, and a query for
            # `bench_watch_token_1` would match any chunk containing "token".
            token = f"benchwatchtoken{seed}x{i:03d}"
            target = rng.choice(files)
            started = time.perf_counter()
            with target.open("a") as fh:
                fh.write(f"\n\ndef {token}():\n    return {i}\n")
            took = wait(lambda t=token: found(lake, t), 60)
            if took is None:
                missed += 1
            else:
                latencies.append(time.perf_counter() - started)
            time.sleep(0.3)
        latencies.sort()
        out.update(
            edits=edits, missed=missed,
            edit_p50_s=round(statistics.median(latencies), 3) if latencies else None,
            edit_p95_s=round(latencies[min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))], 3)
            if latencies else None,
            edit_max_s=round(max(latencies), 3) if latencies else None,
        )
        print(f"edits: {out}", file=sys.stderr, flush=True)
        # A branch switch that brings `burst` files in at once.
        subprocess.run(["git", "add", "-A"], cwd=tree, env=git_env, check=True)
        subprocess.run(["git", "commit", "-q", "-m", "edits"], cwd=tree, env=git_env, check=True)
        home_branch = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=tree, env=git_env,
                                     check=True, capture_output=True, text=True).stdout.strip()
        subprocess.run(["git", "checkout", "-q", "-b", "burst"], cwd=tree, env=git_env, check=True)
        burst_dir = tree / "burst_pkg"
        burst_dir.mkdir()
        for i in range(burst):
            (burst_dir / f"mod_{i:04d}.py").write_text(f"def burstfunction{i:04d}(x):\n    return x + {i}\n")
        subprocess.run(["git", "add", "-A"], cwd=tree, env=git_env, check=True)
        subprocess.run(["git", "commit", "-q", "-m", "burst"], cwd=tree, env=git_env, check=True)
        subprocess.run(["git", "checkout", "-q", home_branch], cwd=tree, env=git_env, check=True)
        gone = wait(lambda: count_paths(lake, "burst_pkg/") == 0, 300)
        time.sleep(2)
        started = time.perf_counter()
        subprocess.run(["git", "checkout", "-q", "burst"], cwd=tree, env=git_env, check=True)
        all_in = wait(lambda: count_paths(lake, "burst_pkg/") == burst and found(lake, f"burstfunction{burst - 1:04d}"),
                      600)
        out.update(burst_files=burst, burst_searchable_s=round(all_in, 2) if all_in is not None else None,
                   burst_checkout_wall_s=round(time.perf_counter() - started, 2), burst_removed_first=gone is not None)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def crash_bench(mirror: Path, workdir: Path, env: dict[str, str], kills: int, seed: int) -> dict[str, Any]:
    fresh_tree = workdir / "crash-fresh"
    materialise(mirror, fresh_tree)
    started = time.perf_counter()
    subprocess.run([str(CTX), "run", "index", str(fresh_tree)], cwd=fresh_tree, env=env, check=True,
                   capture_output=True)
    full = time.perf_counter() - started
    expected = lake_fingerprint(fresh_tree / ".ctx" / "lake")
    rng = random.Random(seed)
    survived, tried, details = 0, 0, []
    for k in range(kills):
        tree = workdir / f"crash-{k}"
        shutil.copytree(fresh_tree, tree, ignore=shutil.ignore_patterns(".ctx"), symlinks=True)
        shutil.rmtree(workdir / "home" / "embeddings", ignore_errors=True)
        delay = rng.uniform(0.5, full)
        # Its own process group, killed whole: Prefect's temporary API server is a child process
        # that a SIGKILL of `ctx` alone would leave running (and loading the machine) forever.
        proc = subprocess.Popen([str(CTX), "run", "index", str(tree)], cwd=tree, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
        time.sleep(delay)
        killed = proc.poll() is None
        if killed:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        tried += killed
        rerun = subprocess.run([str(CTX), "run", "index", str(tree)], cwd=tree, env=env, capture_output=True, text=True)
        ok = rerun.returncode == 0 and lake_fingerprint(tree / ".ctx" / "lake") == expected
        survived += killed and ok
        details.append({"kill_after_s": round(delay, 1), "killed": killed, "converged": ok})
        print(f"kill {k}: {details[-1]}", file=sys.stderr, flush=True)
        shutil.rmtree(tree, ignore_errors=True)
    return {"crash_repo_full_index_s": round(full, 1), "kills_tried": tried, "kills_survived": survived,
            "kill_details": details}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp") / "ctx-bench-watch")
    parser.add_argument("--profile", default="static")
    parser.add_argument("--edits", type=int, default=50)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-watch", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = env_for(args.workdir, args.profile)
    result: dict[str, Any] = {"profile": args.profile}
    if not args.skip_watch:
        tree = args.workdir / "django"
        result["commit"] = materialise(args.mirrors / MIRRORS["django"] / "repo", tree)
        result.update(watch_bench(tree, env, args.edits, args.burst, args.seed))
    if args.kills:
        result.update(crash_bench(args.mirrors / MIRRORS["flask"] / "repo", args.workdir,
                                  {**env, "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash"}, args.kills, args.seed))
    for key, value in result.items():
        if key != "kill_details":
            print(f"{key:<28} {value}")
    print(f"\nmachine: {os.cpu_count()} cores; load average {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
