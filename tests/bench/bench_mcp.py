"""Benchmark the MCP server over its stdio round trip: cold start, search_code latency per mode, fuzzy_find.

    python3 dev.py bench mcp PROJECT [--rounds 5] [--skip-minilm]

PROJECT is a folder already indexed with `ctx run index` (the issue's target: django, >= 50k
chunks). Each request is one JSON-RPC line written to a real `ctx serve` process and timed until
its answer line is read back, one request at a time. Latencies are taken after a warm-up call
per mode (the lake open, the FTS index and the query embedder loaded), as the targets say.
Also reports what the bundled MiniLM query embedding alone costs per query, since the lake may
have been built with another profile. Prints one table; numbers depend on the machine's load,
which is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

CTX = str(Path(sys.executable).parent / "ctx")
SEARCHES = [
    "select_related prefetch_related queryset", "how are migrations applied to the database",
    "CSRF token validation middleware", "QuerySet.bulk_create", "template tag for url reversing",
    "password hashing algorithm PBKDF2", "timezone aware datetime conversion", "ModelAdmin list_display",
    "get_object_or_404", "post_save signal receiver", "cache backend key expiry",
    "form field validation clean method", "paginator page range", "database router allow_migrate",
    "collectstatic storage manifest", "session middleware cookie", "JSONField key lookup",
    "test client force_login", "management command add_arguments", "send_mail smtp backend",
]
SYMBOLS = [
    "get_querset", "selct_related", "bulk_creat", "get_objec_or_404", "PBKDF2PasswordHsher", "ModelAdmn",
    "send_mial", "Paginatr", "collectstatic", "render_to_strng", "QuerSet", "reverse_lazzy",
    "CsrfViewMiddlware", "atomic", "JSONFeild",
]


class StdioServer:
    """`ctx serve` as a child process spoken to in raw JSON-RPC lines."""

    def __init__(self, root: Path) -> None:
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([CTX, "serve", "--root", str(root)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.next_id = 0

    def request(self, method: str, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        t0 = time.perf_counter()
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        while True:
            answer = json.loads(self.proc.stdout.readline())
            if answer.get("id") == self.next_id:
                return (time.perf_counter() - t0) * 1000, answer

    def initialize(self) -> float:
        ms, _ = self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                            "clientInfo": {"name": "bench", "version": "0"}})
        assert self.proc.stdin is not None
        self.proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
        self.proc.stdin.flush()
        return ms

    def call(self, tool: str, args: dict[str, Any]) -> float:
        ms, answer = self.request("tools/call", {"name": tool, "arguments": args})
        result = answer.get("result") or {}
        if "error" in answer or result.get("isError"):
            raise RuntimeError(f"{tool} {args} failed: {json.dumps(answer)[:500]}")
        return ms

    def cpu_s(self) -> float:
        times = psutil.Process(self.proc.pid).cpu_times()
        return float(times.user + times.system)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


HEADER = (f"| {'measure':<40} | {'n':>5} | {'p50 ms':>8} | {'p90 ms':>8} | {'p99 ms':>8} | {'max ms':>8} "
          f"| {'target':<26} |")


def row(name: str, values: list[float], target: str = "") -> str:
    return (f"| {name:<40} | {len(values):>5} | {statistics.median(values):>8.1f} | {pct(values, 0.90):>8.1f} "
            f"| {pct(values, 0.99):>8.1f} | {max(values):>8.1f} | {target:<26} |")


def cold_starts(root: Path, runs: int) -> list[tuple[float, float, float, float]]:
    """(initialize ms, CPU s spent until then, ms from spawn to the first search_code answer, CPU s
    spent until then)."""
    out = []
    for _ in range(runs):
        server = StdioServer(root)
        server.initialize()
        init_ms = (time.perf_counter() - server.started) * 1000
        cpu = server.cpu_s()
        server.call("search_code", {"query": "get_object_or_404", "search_type": "keyword"})
        first_ms = (time.perf_counter() - server.started) * 1000
        first_cpu = server.cpu_s()
        server.close()
        out.append((init_ms, cpu, first_ms, first_cpu))
    return out


def minilm_query_ms(queries: list[str]) -> dict[str, list[float]]:
    """MiniLM query embedding per query: with torch's default threads, then with one thread (what
    the MCP server sets once it loads a torch model)."""
    import torch

    from ctxlake.schemas.config import EmbedSettings
    from ctxlake.tasks.embedder_transformer import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder(EmbedSettings(model="minilm"), "all-MiniLM-L6-v2", bundled=True)
    embedder.embed_query("warm up")
    out: dict[str, list[float]] = {}
    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        times = []
        for query in queries:
            t0 = time.perf_counter()
            embedder.embed_query(query)
            times.append((time.perf_counter() - t0) * 1000)
        out[f"MiniLM embed_query, {threads} thread(s)"] = times
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("project", type=Path, help="an indexed project folder (django for the issue's numbers)")
    parser.add_argument("--rounds", type=int, default=5, help="passes over the query lists per mode")
    parser.add_argument("--cold", type=int, default=3, help="fresh server processes for the cold start")
    parser.add_argument("--skip-minilm", action="store_true", help="do not time the MiniLM query embedding")
    args = parser.parse_args()
    root = args.project.resolve()

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api.index_status import status

    settings = load_settings(root)
    st = status(settings, check_stale=False)
    if not st.indexed:
        print(f"{root} is not indexed: run `ctx run index {root}` first", file=sys.stderr)
        return 2
    load_before = os.getloadavg()

    cold = cold_starts(root, args.cold)
    server = StdioServer(root)
    server.initialize()
    results: dict[str, list[float]] = {}
    # Warm-up: lake open, FTS index read, query embedder loaded.
    for mode in ("hybrid", "keyword", "semantic", "fuzzy"):
        server.call("search_code", {"query": "warm up the model", "search_type": mode})
    server.call("fuzzy_find", {"symbol_name": "warm_up"})
    for mode in ("hybrid", "keyword", "semantic", "fuzzy"):
        results[f"search_code {mode} (top_k=10)"] = [
            server.call("search_code", {"query": q, "search_type": mode})
            for _ in range(args.rounds) for q in SEARCHES]
    results["fuzzy_find"] = [server.call("fuzzy_find", {"symbol_name": s})
                             for _ in range(args.rounds) for s in SYMBOLS]
    server.close()
    minilm = {} if args.skip_minilm else minilm_query_ms(SEARCHES * 2)
    load_after = os.getloadavg()

    print(f"\nMCP stdio benchmark on {root}")
    print(f"lake: {st.chunks:,} chunks, {st.files:,} files, model {st.model_id} ({st.dims}d), "
          f"{st.embedded:,} embedded")
    print(f"machine: {psutil.cpu_count()} CPUs, load average {load_before[0]:.1f} before / "
          f"{load_after[0]:.1f} after (the run itself keeps about one core busy)\n")
    print(HEADER)
    print("|" + "|".join("-" * (len(cell) + 0) for cell in HEADER.split("|")[1:-1]) + "|")
    print(row("cold: initialize answered (wall)", [c[0] for c in cold], "<= 2000 start to 1st answer"))
    print(row("cold: process CPU until initialize", [c[1] * 1000 for c in cold], "CPU ms, not wall"))
    print(row("cold: first search_code keyword (wall)", [c[2] for c in cold], "opens the lake first"))
    print(row("cold: process CPU until that answer", [c[3] * 1000 for c in cold], "CPU ms, not wall"))
    targets = {"search_code hybrid (top_k=10)": "p50 <= 30, p99 <= 150"}
    for name, values in results.items():
        print(row(name, values, targets.get(name, "")))
    for name, values in minilm.items():
        print(row(name, values, "in-process, not via MCP"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
