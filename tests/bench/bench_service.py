"""Benchmark: the always-on service against today's cold processes, with ripgrep alongside.

    python3 dev.py bench service --quick             # flask only, fewer load queries
    python3 dev.py bench service                     # flask + django
    python3 dev.py bench service --mirrors DIR --workdir DIR --load-queries 200

Every `ctx` call is a separate process, as a user runs it. "service" rows run with `ctx up`
(the thin client forwards to the warm service); "cold" rows run the same command with the service
down (the in-process fallback, today's path). cocoindex-code is not run: it needs its own model
download at first use, which this offline machine cannot do.
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
from pathlib import Path
from typing import Any

import psutil
from bench_index import MIRRORS, QUERIES, PeakRSS, materialise

ROOT = Path(__file__).resolve().parents[2]
CTX = str(Path(sys.executable).parent / "ctx")
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}}


def wall(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return took, out.stdout


def p(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def searches(tree: Path, env: dict[str, str], mode: str, n: int = 10) -> float:
    return statistics.median(wall([CTX, "search", q, "--mode", mode, "--json"], tree, env)[0] for q in QUERIES[:n])


def edit(target: Path, tag: str) -> str:
    name = f"bench_fn_{tag}_{int(time.time() * 1000)}"
    target.write_text(target.read_text() + f"\n\ndef {name}():\n    return 'edited'\n")
    return name


def service_pid(home: Path) -> int:
    return int(json.loads((home / "service" / "service.json").read_text())["pid"])


class Proxy:
    """One `ctx serve` process spoken to in raw JSON-RPC over its pipes."""

    def __init__(self, tree: Path, env: dict[str, str]) -> None:
        started = time.perf_counter()
        self.proc = subprocess.Popen([CTX, "serve", "--root", str(tree)], cwd=tree, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 1
        self.call(INIT["method"], INIT["params"])
        self.init_s = time.perf_counter() - started
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdout is not None
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                return dict(reply)

    def rss(self) -> int:
        return int(psutil.Process(self.proc.pid).memory_info().rss)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


def idle_rss(proc: psutil.Process, quiet_s: float = 4.0, limit_s: float = 60.0) -> tuple[int, float]:
    """The process's RSS once it has used under 10% of a core for `quiet_s` on end (at most
    `limit_s` of waiting), and the seconds waited: what an idle service holds (idle, it still
    uses ~2%: Prefect's runner polls its server)."""
    started = time.perf_counter()
    proc.cpu_percent(None)
    quiet = 0.0
    while quiet < quiet_s and time.perf_counter() - started < limit_s:
        time.sleep(0.5)
        quiet = quiet + 0.5 if proc.cpu_percent(None) < 10.0 else 0.0
    return int(proc.memory_info().rss), time.perf_counter() - started


def optimized_since(log_file: Path, offset: int, tree: Path, limit_s: float = 120.0) -> bool:
    """Wait (at most `limit_s`) for the service log to say, after byte `offset`, that `tree`'s lake
    was optimized; whether it did."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        with open(log_file, "rb") as fh:
            fh.seek(offset)
            if f"optimized the lake of {tree}".encode() in fh.read():
                return True
        time.sleep(1.0)
    return False


def small_project(workdir: Path, tree: Path, i: int, env: dict[str, str]) -> Path:
    """A small extra project (a slice of the repo) indexed through the service, hence watched."""
    dest = workdir / f"extra{i}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for src in sorted(tree.rglob("*.py"))[i * 20:(i + 1) * 20]:
        shutil.copy(src, dest / f"{src.parent.name}_{src.name}")
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    wall([CTX, "run", "index"], dest, env)
    return dest


def bench_repo(name: str, tree: Path, workdir: Path, env: dict[str, str], load_queries: int) -> dict[str, Any]:
    home = Path(env["CTX_HOME"])
    r: dict[str, Any] = {"repo": name}
    log = lambda msg: print(f"[{name}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log("cold index (service down) ...")
    r["cold_index_s"] = round(wall([CTX, "run", "index"], tree, env)[0], 2)
    target = next(p for p in sorted(tree.rglob("*.py")) if "test" not in p.parts and p.stat().st_size > 2000)
    log("cold commands (service down) ...")
    r["cold_search_keyword_p50_s"] = round(searches(tree, env, "keyword", 5), 3)
    r["cold_search_hybrid_p50_s"] = round(searches(tree, env, "hybrid", 5), 3)
    r["cold_noop_index_s"] = round(wall([CTX, "run", "index"], tree, env)[0], 3)
    edit(target, "cold")
    r["cold_edit_index_s"] = round(wall([CTX, "run", "index"], tree, env)[0], 2)
    rg = shutil.which("rg")
    if rg:
        words = [q.split()[-1] for q in QUERIES]
        r["ripgrep_p50_s"] = round(statistics.median(_rg(rg, w, tree) for w in words), 3)

    log("service up ...")
    wall([CTX, "up"], tree, env)
    pid = service_pid(home)
    trace: dict[str, int] = {}  # the service's RSS (MB) after each step, to see what it holds when
    mark = lambda step: trace.__setitem__(step, psutil.Process(pid).memory_info().rss >> 20)  # noqa: E731
    mark("up")
    # The first index run in the service registers the project and pays Prefect's start once.
    edit(target, "first")
    r["svc_first_edit_index_s"] = round(wall([CTX, "run", "index"], tree, env)[0], 2)
    mark("first index")
    wall([CTX, "search", "warm", "--mode", "hybrid"], tree, env)
    mark("first search")
    r["svc_search_keyword_p50_s"] = round(searches(tree, env, "keyword"), 3)
    r["svc_search_hybrid_p50_s"] = round(searches(tree, env, "hybrid"), 3)
    edits = []
    for i in range(3):
        edit(target, f"svc{i}")
        edits.append(wall([CTX, "run", "index"], tree, env)[0])
    r["svc_edit_index_p50_s"] = round(statistics.median(edits), 3)
    r["svc_noop_index_p50_s"] = round(statistics.median(wall([CTX, "run", "index"], tree, env)[0] for _ in range(5)), 3)
    mark("searches, edits, index runs")

    log_mark = (home / "service" / "service.log").stat().st_size
    log("4 more projects registered; edit -> searchable ...")
    extras = [small_project(workdir, tree, i, env) for i in range(4)]
    mark("4 more projects")
    lags = []
    for i in range(10):
        fn = edit(target, f"lag{i}")
        started = time.perf_counter()
        while time.perf_counter() - started < 30:
            out = wall([CTX, "search", fn, "--mode", "keyword", "--json", "-n", "1"], tree, env)[1]
            if any(fn in json.dumps(h) for h in json.loads(out)["hits"]):
                break
        lags.append(time.perf_counter() - started)
    r["svc_edit_to_searchable_p50_s"] = round(p(lags, 0.5), 3)
    r["svc_edit_to_searchable_p95_s"] = round(p(lags, 0.95), 3)
    r["svc_edit_to_searchable_each_s"] = [round(x, 2) for x in lags]  # 10 samples: p95 is about the worst
    svc = psutil.Process(pid)
    mark("edit -> searchable")
    r["svc_rss_mb_5_watched_1_searched"] = round(svc.memory_info().rss / 2**20)
    for extra in extras[:2]:  # three projects loaded (the idle figure): this one and two more
        wall([CTX, "search", "def", "--mode", "hybrid", "-n", "1"], extra, env)
    # Idle means after the service's own upkeep: a watched project is optimized once it has been
    # quiet for 30 s (serve/service/watchers.py OPTIMIZE_IDLE_S), and the edits above made that due.
    r["svc_idle_after_optimize"] = optimized_since(home / "service" / "service.log", log_mark, tree)
    rss, waited = idle_rss(svc)
    r["svc_idle_rss_mb_5_watched_3_loaded"] = round(rss / 2**20)
    r["svc_idle_after_s"] = round(waited, 1)
    mark("idle")
    r["svc_rss_mb_trace"] = trace

    log("transcript -> search_context ...")
    lags = transcript_lag(tree, env, 5)
    r["svc_transcript_to_search_p50_s"] = round(p(lags, 0.5), 2)
    r["svc_transcript_to_search_p95_s"] = round(p(lags, 0.95), 2)

    log("proxies ...")
    proxies = [Proxy(tree, env) for _ in range(10)]
    r["proxy_initialize_p50_s"] = round(statistics.median(x.init_s for x in proxies), 3)
    r["proxy_rss_mb"] = round(statistics.median(x.rss() for x in proxies) / 2**20, 1)
    r["ten_proxies_rss_mb"] = round(sum(x.rss() for x in proxies) / 2**20)

    log(f"load: 10 proxies x {load_queries} hybrid queries during a forced re-index ...")
    sampler, alone = PeakRSS(pid), PeakRSS(pid, tree=False)  # whole-tree runs are the service's children
    reindex = subprocess.Popen([CTX, "run", "index", "--force"], cwd=tree, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lat: list[float] = []
    errors = [0]
    samples: list[str] = []

    def hammer(proxy: Proxy) -> None:
        for i in range(load_queries):
            started = time.perf_counter()
            reply = proxy.call("tools/call", {"name": "search_code", "arguments": {
                "query": QUERIES[i % len(QUERIES)], "search_type": "hybrid"}})
            lat.append(time.perf_counter() - started)
            if "error" in reply or reply.get("result", {}).get("isError"):
                errors[0] += 1
                if len(samples) < 3:
                    samples.append(json.dumps(reply)[:300])

    threads = [threading.Thread(target=hammer, args=(x,)) for x in proxies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reindex_running = reindex.poll() is None
    reindex.wait()
    r["load_queries"] = len(lat)
    r["load_errors"] = errors[0]
    for sample in samples:
        log(f"load error: {sample}")
    r["load_hybrid_p50_ms"] = round(p(lat, 0.5) * 1000)
    r["load_hybrid_p99_ms"] = round(p(lat, 0.99) * 1000)
    r["load_reindex_outlasted_queries"] = reindex_running
    r["svc_peak_rss_mb_while_reindexing"] = round(alone.stop() / 2**20)
    r["svc_tree_peak_rss_mb_while_reindexing"] = round(sampler.stop() / 2**20)
    for x in proxies:
        x.close()
    wall([CTX, "down"], tree, env)
    for extra in extras:
        shutil.rmtree(extra, ignore_errors=True)
    return r


def transcript_lag(tree: Path, env: dict[str, str], n: int) -> list[float]:
    """Seconds from appending a message to a Claude Code transcript to `ctx context search` finding it.

    The service watches the agent tools' log folders (here a fake HOME's ~/.claude/projects) and
    starts a debounced ingest run on their events; nothing else triggers ingestion meanwhile."""
    folder = Path(env["HOME"]) / ".claude" / "projects" / str(tree).replace("/", "-")
    folder.mkdir(parents=True, exist_ok=True)
    transcript = folder / "bench-session.jsonl"
    lags = []
    for i in range(n):
        word = f"zebrafinch{i}x{int(time.time())}"
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime())
        record = {"parentUuid": None, "isSidechain": False, "type": "user", "uuid": f"bench-{word}",
                  "timestamp": stamp, "sessionId": "bench-session", "cwd": str(tree), "version": "2.1.0",
                  "message": {"role": "user", "content": f"please remember the {word} migration plan"}}
        started = time.perf_counter()
        with transcript.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        while time.perf_counter() - started < 120:
            out = wall([CTX, "context", "search", word, "--mode", "keyword", "--json", "-n", "1"], tree, env)[1]
            if word in json.dumps(json.loads(out)["hits"]):  # the hits, not the echoed query
                break
            time.sleep(0.2)
        lags.append(time.perf_counter() - started)
    return lags


def _rg(rg: str, word: str, tree: Path) -> float:
    started = time.perf_counter()
    subprocess.run([rg, "-n", word], cwd=tree, capture_output=True, check=False)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="flask only, 50 load queries per proxy")
    parser.add_argument("--repos", default="flask,django")
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench-service")
    parser.add_argument("--profile", default="static", help="embedding profile (static: the fast one)")
    parser.add_argument("--load-queries", type=int, default=200)
    args = parser.parse_args()
    repos = ["flask"] if args.quick else [r.strip() for r in args.repos.split(",") if r.strip()]
    load = 50 if args.quick else args.load_queries
    args.workdir.mkdir(parents=True, exist_ok=True)
    home = args.workdir / "home"
    fake_home = args.workdir / "user-home"  # the agent tools' default log folders live under it
    fake_home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(fake_home), "CTX_HOME": str(home), "CTX_EMBED_MODEL": args.profile,
           "PREFECT_HOME": str(args.workdir / "prefect"), "HF_HUB_OFFLINE": "1"}
    subprocess.run([CTX, "down"], env=env, capture_output=True, check=False)
    results = []
    for name in repos:
        mirror = args.mirrors / MIRRORS[name] / "repo"
        if not mirror.exists():
            print(f"skip {name}: no mirror at {mirror}", file=sys.stderr)
            continue
        tree = args.workdir / name
        materialise(mirror, tree)
        try:
            results.append(bench_repo(name, tree, args.workdir, env, load))
        finally:
            subprocess.run([CTX, "down"], env=env, capture_output=True, check=False)
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    keys = list(results[0]) if results else []
    width = max((len(k) for k in keys), default=10)
    print(f"{'metric':<{width}}  " + "  ".join(f"{r['repo']:>10}" for r in results))
    for key in keys[1:]:
        print(f"{key:<{width}}  " + "  ".join(f"{r.get(key, '')!s:>10}" for r in results))
    print(f"\nmachine: {os.cpu_count()} cores; load average {os.getloadavg()}; ripgrep: {shutil.which('rg') or 'absent'}; "
          "cocoindex-code: not run (needs a model download, offline here)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
