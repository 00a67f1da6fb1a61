"""Benchmark: file localisation on a multi-language issue set (Multi-SWE-bench), per language.

    python3 dev.py bench multilang                         # 10 tasks per language, static profile
    python3 dev.py bench multilang --per-lang 5 --langs go,rust
    python3 dev.py bench multilang --data DIR_OR_GIT_DIR --mirrors DIR --out results.json

The task data is Multi-SWE-bench (ByteDance Seed, 2025; JSONL, one pull request per line with
`org`, `repo`, `base.sha`, `resolved_issues`, `fix_patch`). Hugging Face is not reachable here,
so it is read from a public GitHub copy: `--data` names either a folder of JSONL files (any depth;
the language is the name of the file's parent folder: c, cpp, go, java, js, ts, rust) or a git
directory holding such files under `MSWE-agent/data/` (default: the mirror of
`kuppireddypravalika/MSWE-validation-dataset` in the mirrors folder; fetch it with
`github:kuppireddypravalika/MSWE-validation-dataset`). Nothing is downloaded at run time: files
stored as Git LFS pointers, and repositories with no mirror, are skipped and listed.

Each task becomes a line of a `ctx eval` task file: the query is the resolved issues' titles and
bodies (what the reporter wrote, not the pull request's own text), the gold files are the files
the fix patch edits that existed at the base commit and are source files of the language. Tasks
are taken round-robin over the language's repositories (lowest PR numbers first), at most
`--per-lang` per language. Each language runs as one `ctx eval` process with the language's file
globs as its corpus, every tree indexed from scratch at its base commit (static profile); the
figures are the `all files` corpus of the full ranking, keyword and hybrid modes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CTX = Path(sys.executable).parent / "ctx"
DATASET_MIRROR = "kuppireddypravalika+MSWE-validation-dataset"
DATA_PREFIX = "MSWE-agent/data/"

# The corpus indexed per language: its source files (headers with C/C++).
LANG_GLOBS: dict[str, list[str]] = {
    "java": ["*.java"],
    "js": ["*.js", "*.mjs", "*.cjs", "*.jsx", "*.ts", "*.tsx"],
    "ts": ["*.ts", "*.tsx", "*.js", "*.mjs", "*.cjs", "*.jsx"],
    "go": ["*.go"],
    "rust": ["*.rs"],
    "c": ["*.c", "*.h"],
    "cpp": ["*.c", "*.cc", "*.cpp", "*.cxx", "*.h", "*.hh", "*.hpp", "*.hxx", "*.ipp", "*.inl"],
}
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


def _matches(path: str, globs: list[str]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(Path(name).match(g) for g in globs)


def gold_files(patch: str, globs: list[str]) -> list[str]:
    """Files a unified diff edits that existed before it (no new files) and match the globs."""
    out: list[str] = []
    current: str | None = None
    for line in patch.splitlines():
        m = _DIFF_FILE.match(line)
        if m:
            current = m.group(1)
            continue
        if current is not None and line.startswith("--- "):
            if line != "--- /dev/null" and _matches(current, globs) and current not in out:
                out.append(current)
            current = None
    return out


def to_task(record: dict[str, Any], lang: str) -> dict[str, Any] | None:
    """A Multi-SWE-bench record -> a `ctx eval` task line, or None when it has no usable answer."""
    issues = record.get("resolved_issues") or []
    text = "\n\n".join(
        f"{(i.get('title') or '').strip()}\n\n{(i.get('body') or '').strip()}".strip() for i in issues
        if isinstance(i, dict))
    base = record.get("base") or {}
    gold = gold_files(record.get("fix_patch") or "", LANG_GLOBS[lang])
    if not text.strip() or not gold or not base.get("sha"):
        return None
    repo = f"{record['org']}/{record['repo']}"
    return {
        "instance_id": f"{record['org']}__{record['repo']}-{record['number']}",
        "repo": repo, "fetch_source": f"github:{repo}", "base_commit": base["sha"],
        "problem_statement": text, "gold_files": gold, "language": lang,
    }


def read_dataset(data: Path) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """language -> [(file name, JSONL text)], plus notes on what could not be read."""
    notes: list[str] = []
    files: dict[str, list[tuple[str, str]]] = defaultdict(list)

    def add(name: str, text: str) -> None:
        lang = name.rstrip("/").split("/")[-2] if "/" in name else ""
        if lang not in LANG_GLOBS:
            return
        if text.startswith("version https://git-lfs"):
            notes.append(f"{name}: a Git LFS pointer (content not in the copy), skipped")
            return
        files[lang].append((name, text))

    if data.is_dir() and not (data / "HEAD").is_file():
        for path in sorted(data.rglob("*.jsonl")):
            add(str(path.relative_to(data)), path.read_text(encoding="utf-8", errors="replace"))
        return files, notes
    listing = subprocess.run(["git", f"--git-dir={data}", "ls-tree", "-r", "--name-only", "HEAD", DATA_PREFIX],
                             capture_output=True, text=True)
    if listing.returncode != 0:
        raise SystemExit(f"--data {data}: neither a folder of JSONL files nor a git directory "
                         f"({listing.stderr.strip()[:200]})")
    for name in listing.stdout.split():
        if name.endswith(".jsonl"):
            blob = subprocess.run(["git", f"--git-dir={data}", "show", f"HEAD:{name}"], capture_output=True)
            add(name, blob.stdout.decode("utf-8", errors="replace"))
    return files, notes


def has_commit(git_dir: Path, sha: str) -> bool:
    probe = subprocess.run(["git", f"--git-dir={git_dir}", "cat-file", "-e", f"{sha}^{{commit}}"], capture_output=True)
    return probe.returncode == 0


def pick_tasks(files: dict[str, list[tuple[str, str]]], mirrors: Path, per_lang: int,
               langs: list[str]) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Round-robin over each language's repositories (with a mirror), lowest PR numbers first."""
    notes: list[str] = []
    chosen: dict[str, list[dict[str, Any]]] = {}
    for lang in langs:
        by_repo: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for name, text in files.get(lang, []):
            for number, line in enumerate(text.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    task = to_task(json.loads(line), lang)
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    notes.append(f"{name} line {number}: unreadable ({exc.__class__.__name__})")
                    continue
                if task is not None:
                    by_repo[task["repo"]][task["instance_id"]] = task
        queues = []
        for repo in sorted(by_repo):
            mirror = mirrors / repo.replace("/", "+") / "repo"
            if not mirror.exists():
                notes.append(f"{lang}: {repo} has no mirror at {mirror} (fetch github:{repo}); skipped")
                continue
            usable = [t for t in by_repo[repo].values() if has_commit(mirror, t["base_commit"])]
            if len(usable) < len(by_repo[repo]):
                notes.append(f"{lang}: {repo}: {len(by_repo[repo]) - len(usable)} base commit(s) not in the mirror; skipped")
            queues.append(sorted(usable, key=lambda t: int(t["instance_id"].rsplit("-", 1)[1])))
        picked: list[dict[str, Any]] = []
        while len(picked) < per_lang and any(queues):
            for queue in queues:
                if queue and len(picked) < per_lang:
                    picked.append(queue.pop(0))
        if picked:
            chosen[lang] = picked
        else:
            notes.append(f"{lang}: no usable task")
    return chosen, notes


def run_language(lang: str, tasks: list[dict[str, Any]], args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    folder = args.workdir / lang
    folder.mkdir(parents=True, exist_ok=True)
    task_file = folder / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(t) + "\n" for t in tasks), encoding="utf-8")
    report_file = folder / "report.json"
    cmd = [str(CTX), "eval", str(task_file), "--modes", args.modes, "--corpus", "all",
           "--profile", args.profile, "--mirrors", str(args.mirrors), "--report", str(report_file), "--json"]
    for glob in LANG_GLOBS[lang]:
        cmd += ["--include", glob]
    print(f"[{lang}] {len(tasks)} task(s): {', '.join(sorted({t['repo'] for t in tasks}))}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=args.workdir, env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    wall = time.perf_counter() - started
    if proc.returncode != 0 or not report_file.is_file():
        return {"lang": lang, "error": f"ctx eval exited {proc.returncode}", "wall_s": round(wall, 1)}
    report = json.loads(report_file.read_text())
    row: dict[str, Any] = {
        "lang": lang, "tasks": report["tasks"], "repos": sorted({t["repo"] for t in tasks}),
        "wall_s": round(wall, 1),
        "index_s": round(sum(r["seconds"] for r in report["index"]), 1),
        "files_indexed_median": sorted(r["files"] for r in report["index"])[len(report["index"]) // 2],
    }
    for run in report["runs"]:
        if run["corpus"] != "all" or run["variant"] != "full":
            continue
        overall = run["overall"]
        # Acc@k is the eval's strict reading (every gold file in the top k); Hit@k asks for any
        # one of them, which is what MRR (first gold file) measures too. Fixes here often touch
        # several files, so both are shown.
        ranks = [r["rank"] for r in report["results"]
                 if r["mode"] == run["mode"] and r["corpus"] == "all" and r["variant"] == "full"]
        row[run["mode"]] = {
            "acc@1": round(100 * overall["acc@1"]["mean"], 1), "acc@5": round(100 * overall["acc@5"]["mean"], 1),
            "acc@10": round(100 * overall["acc@10"]["mean"], 1), "mrr": round(overall["mrr"]["mean"], 3),
            "hit@1": round(100 * sum(1 for k in ranks if k is not None and k <= 1) / max(len(ranks), 1), 1),
            "hit@5": round(100 * sum(1 for k in ranks if k is not None and k <= 5) / max(len(ranks), 1), 1),
            "gold_not_indexed": run["gold_not_indexed"],
        }
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror",
                        help="folder holding <owner>+<name>/repo git mirrors (default: ../.mirror)")
    parser.add_argument("--data", type=Path, help="Multi-SWE-bench JSONL folder or git dir "
                        f"(default: MIRRORS/{DATASET_MIRROR}/repo)")
    parser.add_argument("--per-lang", type=int, default=10, help="tasks per language (default 10)")
    parser.add_argument("--langs", default=",".join(LANG_GLOBS), help="comma-separated: " + ", ".join(LANG_GLOBS))
    parser.add_argument("--modes", default="keyword,hybrid")
    parser.add_argument("--profile", default="static")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench-multilang")
    parser.add_argument("--keep", action="store_true", help="keep the lakes and trees of an earlier run")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    langs = [lang.strip() for lang in args.langs.split(",") if lang.strip()]
    unknown = [lang for lang in langs if lang not in LANG_GLOBS]
    if unknown:
        parser.error(f"unknown language(s) {', '.join(unknown)}; one of {', '.join(LANG_GLOBS)}")
    data = args.data or args.mirrors / DATASET_MIRROR / "repo"
    if not data.exists():
        print(f"no task data at {data}: this benchmark runs offline. Fetch "
              f"github:{DATASET_MIRROR.replace('+', '/')} into the mirrors folder, or pass --data "
              "a folder of Multi-SWE-bench JSONL files (one subfolder per language).", file=sys.stderr)
        return 2
    files, notes = read_dataset(data)
    chosen, more = pick_tasks(files, args.mirrors, args.per_lang, langs)
    notes += more
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not chosen:
        print("no task to run", file=sys.stderr)
        return 2
    if args.workdir.exists() and not args.keep:
        shutil.rmtree(args.workdir)
    args.workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CTX_HOME": str(args.workdir / "home"), "CTX_EMBED_MODEL": args.profile,
           "PREFECT_HOME": str(args.workdir / "prefect")}
    started = time.perf_counter()
    rows = [run_language(lang, tasks, args, env) for lang, tasks in chosen.items()]
    total = time.perf_counter() - started
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"\nMulti-SWE-bench file localisation, {args.profile} profile, all files of the language, "
          f"first {args.per_lang} tasks per language")
    head = f"{'language':<9} {'n':>3}  " + "  ".join(f"{m + ' Acc@1/Acc@5 Hit@1/Hit@5 MRR':>38}" for m in modes)
    print(head + f"  {'no gold':>7}  {'index s':>8}  repositories")
    for row in rows:
        if "error" in row:
            print(f"{row['lang']:<9} error: {row['error']}")
            continue
        cells = []
        for m in modes:
            r = row.get(m)
            cells.append(f"{r['acc@1']:5.1f}/{r['acc@5']:5.1f} {r['hit@1']:5.1f}/{r['hit@5']:5.1f} {r['mrr']:.3f}"
                         if r else "-")
        missing = max((row[m]["gold_not_indexed"] for m in modes if m in row), default=0)
        print(f"{row['lang']:<9} {row['tasks']:>3}  " + "  ".join(f"{c:>38}" for c in cells)
              + f"  {missing:>7}  {row['index_s']:>8.1f}  {', '.join(row['repos'])}")
    print("Acc@k: every gold file in the top k; Hit@k: at least one; no gold: tasks with a gold file "
          "missing from the index")
    print(f"\ntotal {total:.0f} s; machine: {os.cpu_count()} cores; load average {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "notes": notes, "seconds": round(total, 1)}, indent=2))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
