#!/usr/bin/env python3
"""Benchmark `ctx run ingest` on a synthetic Claude Code + Codex history, a no-op rescan, and recent_sessions latency.

    python3 dev.py bench ingest [--mb 200] [--files 1000] [--keep DIR]

The history is generated at run time into a temp folder (never committed) in the record shapes of
../shared/fixtures/agent-logs (Claude projects/*.jsonl with tool calls, results and usage; Codex
rollouts with session_meta, messages, function calls/outputs and cumulative token counts), with
deterministic pseudo-random prose, code and tool output. The cold ingest runs with --no-embed, so
its numbers measure scraping, redaction, storage, sessionizing, compaction and indexing; a second
pass embeds with the deterministic fake embedder (the cache and vector-write path without model
cost); embedding with a real model is priced from measured rates (the last table).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORDS = ["the", "retry", "loop", "backoff", "timeout", "client", "server", "request", "response", "cache",
         "index", "table", "query", "parser", "token", "session", "branch", "commit", "deploy", "config",
         "schema", "migration", "error", "handler", "stream", "upload", "file", "path", "module", "function",
         "class", "method", "test", "fixture", "assert", "value", "field", "record", "batch", "write",
         "read", "lock", "version"]
CODE = ["def handle(request):\n    return client.get(request.url, timeout=30)\n",
        "for row in rows:\n    if row.status != 'ok':\n        errors.append(row)\n",
        "class Cache:\n    def __init__(self):\n        self.items = {}\n"]


def text(rng: random.Random, words: int) -> str:
    out = " ".join(rng.choice(WORDS) for _ in range(words))
    return out + ("\n\n" + rng.choice(CODE) if rng.random() < 0.3 else "")


def ts(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def claude_session(rng: random.Random, path: Path, sid: str, cwd: str, start: datetime, target: int) -> int:
    lines, size, t, n = [], 0, start, 0
    parent = None
    while size < target:
        t += timedelta(seconds=rng.randint(5, 120))
        n += 1
        uid = f"{sid}-u{n}"
        rec = {"parentUuid": parent, "isSidechain": False, "type": "user", "uuid": uid, "timestamp": ts(t), "sessionId": sid,
               "cwd": cwd, "version": "2.1.0", "gitBranch": "main", "message": {"role": "user", "content": text(rng, rng.randint(8, 60))}}
        aid = f"{sid}-a{n}"
        use_id = f"toolu_{sid}_{n}"
        reply = {"parentUuid": uid, "isSidechain": False, "type": "assistant", "uuid": aid, "timestamp": ts(t + timedelta(seconds=3)),
                 "sessionId": sid, "cwd": cwd, "version": "2.1.0", "gitBranch": "main", "requestId": f"req_{n}",
                 "message": {"id": f"msg_{sid}_{n}", "role": "assistant", "model": "claude-sonnet-5",
                             "content": [{"type": "text", "text": text(rng, rng.randint(20, 150))},
                                         {"type": "tool_use", "id": use_id, "name": rng.choice(["Bash", "Read", "Edit", "Grep"]),
                                          "input": {"command": "pytest -q", "file_path": f"{cwd}/src/mod{rng.randint(1, 40)}.py"}}],
                             "usage": {"input_tokens": rng.randint(100, 5000), "output_tokens": rng.randint(10, 800),
                                       "cache_read_input_tokens": rng.randint(0, 9000)}}}
        result = {"parentUuid": aid, "isSidechain": False, "type": "user", "uuid": f"{sid}-r{n}", "timestamp": ts(t + timedelta(seconds=5)),
                  "sessionId": sid, "cwd": cwd, "version": "2.1.0", "gitBranch": "main", "toolUseResult": {"stdout": "", "is_error": False},
                  "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id, "is_error": rng.random() < 0.05,
                                                           "content": text(rng, rng.randint(50, 600))}]}}
        for r in (rec, reply, result):
            line = json.dumps(r)
            lines.append(line)
            size += len(line) + 1
        parent = f"{sid}-r{n}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return size


def codex_session(rng: random.Random, path: Path, sid: str, cwd: str, start: datetime, target: int) -> int:
    t = start
    lines = [json.dumps({"timestamp": ts(t), "type": "session_meta", "payload": {"id": sid, "timestamp": ts(t), "cwd": cwd,
                                                                                  "originator": "codex_cli_rs", "cli_version": "0.146.0"}})]
    size, n, total_in, total_out = len(lines[0]) + 1, 0, 0, 0
    while size < target:
        n += 1
        t += timedelta(seconds=rng.randint(5, 120))
        total_in += rng.randint(500, 8000)
        total_out += rng.randint(20, 900)
        usage = {"input_tokens": total_in, "cached_input_tokens": total_in // 2, "output_tokens": total_out, "total_tokens": total_in + total_out}
        records = [
            {"type": "response_item", "payload": {"type": "message", "id": f"u-{sid}-{n}", "role": "user",
                                                  "content": [{"type": "input_text", "text": text(rng, rng.randint(8, 60))}]}},
            {"type": "response_item", "payload": {"type": "function_call", "id": f"fc-{sid}-{n}", "call_id": f"call-{n}", "name": "shell",
                                                  "arguments": json.dumps({"command": ["bash", "-lc", "ls src"]})}},
            {"type": "response_item", "payload": {"type": "function_call_output", "call_id": f"call-{n}",
                                                  "output": json.dumps({"output": text(rng, rng.randint(50, 600)), "metadata": {"exit_code": 0}})}},
            {"type": "event_msg", "payload": {"type": "token_count", "info": {"total_token_usage": usage, "last_token_usage": usage}}},
            {"type": "response_item", "payload": {"type": "message", "id": f"a-{sid}-{n}", "role": "assistant",
                                                  "content": [{"type": "output_text", "text": text(rng, rng.randint(20, 150))}]}},
        ]
        for i, r in enumerate(records):
            line = json.dumps({"timestamp": ts(t + timedelta(seconds=i)), **r})
            lines.append(line)
            size += len(line) + 1
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return size


def generate(base: Path, total_mb: float, files: int, project: Path) -> tuple[int, int]:
    """~total_mb MB in `files` logs: 60% Claude sessions, 40% Codex rollouts, over ten projects (one is ours)."""
    rng = random.Random(42)
    per_file = int(total_mb * 1e6 / files)
    start = datetime(2026, 1, 5, 9, tzinfo=UTC)
    projects = [str(project)] + [f"/srv/dev/project-{i}" for i in range(1, 10)]
    written = 0
    for i in range(files):
        cwd = projects[i % len(projects)]
        when = start + timedelta(hours=3 * i)
        target = int(per_file * rng.uniform(0.5, 1.5))
        if i % 5 < 3:
            sid = f"claude-{i:05d}"
            written += claude_session(rng, base / "claude" / "projects" / cwd.replace("/", "-") / f"{sid}.jsonl", sid, cwd, when, target)
        else:
            sid = f"0000{i:04d}-0000-4000-8000-{i:012d}"
            day = base / "codex" / "sessions" / f"{when:%Y/%m/%d}"
            written += codex_session(rng, day / f"rollout-{when:%Y-%m-%dT%H-%M-%S}-{sid}.jsonl", sid, cwd, when, target)
    return written, files


def ctx(*args: str, cwd: Path, env: dict[str, str]) -> tuple[dict[str, object], float, float]:
    """Run `ctx ARGS --json`; (its JSON, wall seconds, peak RSS MB of the process)."""
    exe = Path(sys.executable).parent / "ctx"
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    proc = subprocess.run([str(exe), *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode != 0:
        sys.exit(f"ctx {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    # ru_maxrss is the largest child so far: only a new maximum is attributable to this run.
    return json.loads(proc.stdout), wall, (peak / 1024 if peak > before else float("nan"))


def table(title: str, rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print(f"\n{title}\n" + "-" * (width + 30))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=200.0, help="size of the synthetic history")
    parser.add_argument("--files", type=int, default=1000, help="number of log files")
    parser.add_argument("--keep", type=Path, help="generate into this folder and keep it")
    parser.add_argument("--calls", type=int, default=50, help="recent_sessions calls to time")
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="ctx-bench-ingest-"))
    project = base / "project"
    project.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    env = {**os.environ, "HOME": str(base / "home"), "CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake",
           "CTX_EMBED_MODEL": "hash", "PREFECT_HOME": str(base / "prefect"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300"}
    try:
        t0 = time.perf_counter()
        written, files = generate(base / "logs", args.mb, args.files, project)
        gen_s = time.perf_counter() - t0
        sources = [f"--from=claude={base / 'logs' / 'claude' / 'projects'}", f"--from=codex={base / 'logs' / 'codex' / 'sessions'}",
                   "--tool", "claude", "--tool", "codex"]
        report, wall, rss = ctx("run", "ingest", *sources, "--no-embed", cwd=project, env=env)
        mb = written / 1e6
        flow_s = float(report["seconds"])  # type: ignore[arg-type]
        rows = int(report["messages_inserted"])  # type: ignore[call-overload]
        table(f"Cold ingest: {mb:.0f} MB in {files:,} files (generated in {gen_s:.0f} s)", [
            ("messages stored", f"{rows:,}"),
            ("sessions written", f"{report['sessions_written']:,}"),
            ("wall time (process, incl. Prefect start)", f"{wall:.1f} s"),
            ("flow time", f"{flow_s:.1f} s"),
            ("throughput (flow)", f"{mb / flow_s:.2f} MB/s, {rows / flow_s:,.0f} rows/s"),
            ("throughput (wall)", f"{mb / wall:.2f} MB/s, {rows / wall:,.0f} rows/s"),
            ("peak RSS", f"{rss:,.0f} MB"),
            ("malformed / unknown records", f"{report['malformed_records']} / {report['unknown_records']}"),
        ])
        embedded, embed_wall, embed_rss = ctx("run", "ingest", *sources, cwd=project, env=env)
        counts = embedded["embedded"]
        table("Embedding pass with the fake embedder (cache lookups, vector writes; no model cost)", [
            ("texts embedded (messages / sessions / knowledge)",
             f"{counts['messages']:,} / {counts['sessions']:,} / {counts['knowledge']:,}"),  # type: ignore[index]
            ("flow time", f"{float(embedded['seconds']):.1f} s"),  # type: ignore[arg-type]
            ("wall time (process)", f"{embed_wall:.1f} s"),
            ("peak RSS", f"{embed_rss:,.0f} MB" if embed_rss == embed_rss else "below the ingest's"),
        ])
        noop_runs = []
        for _ in range(3):
            data, wall_noop, _ = ctx("run", "ingest", *sources, cwd=project, env=env)
            assert data.get("up_to_date") is True, data
            noop_runs.append((float(data["seconds"]), wall_noop))  # type: ignore[arg-type]
        check_s = statistics.median(r[0] for r in noop_runs)
        table(f"No-op rescan of {data['files_seen']:,} log files (median of 3; target <= 0.5 s)", [
            ("decided in (settings, stat of every file, state files)", f"{check_s:.3f} s"),
            ("whole `ctx run ingest` process (Python start, imports)", f"{statistics.median(r[1] for r in noop_runs):.2f} s"),
            ("meets target", "yes" if check_s <= 0.5 else "NO"),
        ])
        latency = recent_sessions_latency(project, env, args.calls)
        _, cli_wall, _ = ctx("sessions", "-n", "3", cwd=project, env=env)
        table("recent_sessions(limit=3) for the project (10% of the sessions)", [
            ("first call (opens the lake)", f"{latency['first'] * 1000:.1f} ms"),
            (f"warm, median of {args.calls}", f"{latency['median'] * 1000:.1f} ms"),
            (f"warm, p95 of {args.calls}", f"{latency['p95'] * 1000:.1f} ms"),
            ("through the MCP tool (in-memory client), median", f"{latency['mcp'] * 1000:.1f} ms"),
            ("`ctx sessions -n 3 --json` process", f"{cli_wall:.2f} s"),
        ])
        embeddable = int(counts["messages"])  # type: ignore[index]
        table("Embedding with a real model (not run here; priced from DESIGN.md's measured rates)", [
            ("user/assistant texts to embed", f"{embeddable:,}"),
            ("bundled MiniLM on these 2 cores (~17/s at 256 tokens)", f"~{embeddable / 17 / 3600:.1f} h"),
            ("static distilled model (~1,900/s)", f"~{embeddable / 1900 / 60:.1f} min"),
        ])
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


def recent_sessions_latency(project: Path, env: dict[str, str], calls: int) -> dict[str, float]:
    """Time recent_sessions in a fresh process (like an MCP server): the first call, then warm calls."""
    script = f"""
import asyncio, json, statistics, time
from pathlib import Path
from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import memory_lake, memory_sessions
settings = load_settings(Path({str(project)!r}))
t = time.perf_counter(); lake = memory_lake.MemoryLake(settings); first = memory_sessions.list_sessions(lake, limit=3)
out = {{"first": time.perf_counter() - t}}
assert len(first) == 3, first
times = []
for _ in range({calls}):
    t = time.perf_counter(); memory_sessions.list_sessions(lake, limit=3); times.append(time.perf_counter() - t)
times.sort()
out["median"] = statistics.median(times); out["p95"] = times[int(0.95 * (len(times) - 1))]
from mcp import Client
from mcp.server import MCPServer
from ctxlake.serve.mcp.memory import register_memory_tools
server = MCPServer("bench"); register_memory_tools(server, settings)
async def go():
    async with Client(server) as c:
        await c.call_tool("recent_sessions", {{}})
        ts = []
        for _ in range({calls}):
            t = time.perf_counter(); r = await c.call_tool("recent_sessions", {{}}); ts.append(time.perf_counter() - t)
            assert not r.is_error
        return statistics.median(ts)
out["mcp"] = asyncio.run(go())
print(json.dumps(out))
"""
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, cwd=project)
    if proc.returncode != 0:
        sys.exit(f"recent_sessions timing failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    main()
