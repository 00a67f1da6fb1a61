#!/usr/bin/env python3
"""Benchmark: years of agent history. A synthetic history of many sessions, ingested cold, then
one new session, a no-op, the read paths, and the lake's size over many small ingests.

    python3 dev.py bench history                       # 20,000 sessions x ~70 messages (issue 16's size)
    python3 dev.py bench history --sessions 2000       # a tenth: minutes instead of an hour
    python3 dev.py bench history --compaction-runs 100 # small ingests for the compaction check
    python3 dev.py bench history --keep ... then --reuse  # again on the kept lake: no generation, no cold run

One new session, the no-op and the many small ingests run through the resident service
(`ctx up`, schedules off), where scheduled ingests run; the cold ingest is one `ctx run ingest`.
The history is generated at run time (never committed) in Claude Code and Codex on-disk formats
(the record shapes of tests/bench/bench_ingest.py: prompts, replies, tool calls with output,
token usage), spread over ten projects and two years, deterministic. Ingestion runs with the
static embedding profile. Read paths are timed in one warm process over serve/api (what the
service and the MCP server run), the project being one of the ten.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_index import PeakRSS
from bench_ingest import text, ts

CTX = str(Path(sys.executable).parent / "ctx")
PROJECTS = 10


def claude_session(rng: random.Random, path: Path, sid: str, cwd: str, start: datetime, messages: int) -> int:
    """A Claude Code transcript of about `messages` messages (prompt, reply with a tool call, tool result)."""
    lines, t, parent = [], start, None
    for n in range(max(1, messages // 3)):
        t += timedelta(seconds=rng.randint(5, 120))
        uid, aid, use_id = f"{sid}-u{n}", f"{sid}-a{n}", f"toolu_{sid}_{n}"
        base = {"isSidechain": False, "sessionId": sid, "cwd": cwd, "version": "2.1.0", "gitBranch": "main"}
        lines.append({**base, "parentUuid": parent, "type": "user", "uuid": uid, "timestamp": ts(t),
                      "message": {"role": "user", "content": text(rng, rng.randint(8, 40))}})
        lines.append({**base, "parentUuid": uid, "type": "assistant", "uuid": aid, "timestamp": ts(t + timedelta(seconds=3)),
                      "message": {"id": f"msg_{sid}_{n}", "role": "assistant", "model": "claude-sonnet-5",
                                  "content": [{"type": "text", "text": text(rng, rng.randint(15, 80))},
                                              {"type": "tool_use", "id": use_id, "name": rng.choice(["Bash", "Read", "Edit"]),
                                               "input": {"file_path": f"{cwd}/src/mod{rng.randint(1, 40)}.py"}}],
                                  "usage": {"input_tokens": rng.randint(100, 5000), "output_tokens": rng.randint(10, 800)}}})
        parent = f"{sid}-r{n}"
        lines.append({**base, "parentUuid": aid, "type": "user", "uuid": parent, "timestamp": ts(t + timedelta(seconds=5)),
                      "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use_id,
                                                               "is_error": rng.random() < 0.05,
                                                               "content": text(rng, rng.randint(20, 120))}]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:  # streamed: no history-wide lists in the generator either
        for line in lines:
            fh.write(json.dumps(line) + "\n")
    return len(lines)


def codex_session(rng: random.Random, path: Path, sid: str, cwd: str, start: datetime, messages: int) -> int:
    """A Codex rollout of about `messages` messages (prompt, shell call and output, reply)."""
    t = start
    out = [{"timestamp": ts(t), "type": "session_meta",
            "payload": {"id": sid, "timestamp": ts(t), "cwd": cwd, "originator": "codex_cli_rs", "cli_version": "0.146.0"}}]
    for n in range(max(1, messages // 3)):
        t += timedelta(seconds=rng.randint(5, 120))
        out += [
            {"timestamp": ts(t), "type": "response_item", "payload": {"type": "message", "id": f"u-{sid}-{n}", "role": "user",
                                                                     "content": [{"type": "input_text", "text": text(rng, rng.randint(8, 40))}]}},
            {"timestamp": ts(t), "type": "response_item", "payload": {"type": "function_call", "id": f"fc-{sid}-{n}",
                                                                     "call_id": f"c{n}", "name": "shell",
                                                                     "arguments": json.dumps({"command": ["bash", "-lc", "ls src"]})}},
            {"timestamp": ts(t), "type": "response_item", "payload": {"type": "function_call_output", "call_id": f"c{n}",
                                                                     "output": json.dumps({"output": text(rng, rng.randint(20, 120)),
                                                                                           "metadata": {"exit_code": 0}})}},
            {"timestamp": ts(t + timedelta(seconds=2)), "type": "response_item",
             "payload": {"type": "message", "id": f"a-{sid}-{n}", "role": "assistant",
                         "content": [{"type": "output_text", "text": text(rng, rng.randint(15, 80))}]}},
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for line in out:
            fh.write(json.dumps(line) + "\n")
    return len(out)


def write_session(rng: random.Random, logs: Path, i: int, cwd: str, when: datetime, messages: int) -> int:
    if i % 5 < 3:
        sid = f"claude-{i:06d}"
        return claude_session(rng, logs / "claude" / "projects" / cwd.replace("/", "-") / f"{sid}.jsonl",
                              sid, cwd, when, messages)
    sid = f"0000{i:04d}-0000-4000-8000-{i:012d}"[-36:]
    day = logs / "codex" / "sessions" / f"{when:%Y/%m/%d}"
    return codex_session(rng, day / f"rollout-{when:%Y-%m-%dT%H-%M-%S}-{sid}.jsonl", sid, cwd, when, messages)


def generate(logs: Path, sessions: int, messages: int, project: Path) -> int:
    rng = random.Random(16)
    start = datetime(2024, 11, 1, 8, tzinfo=UTC)
    span = timedelta(days=730) / max(1, sessions)
    cwds = [str(project)] + [f"/srv/dev/project-{i}" for i in range(1, PROJECTS)]
    records = 0
    for i in range(sessions):
        records += write_session(rng, logs, i, cwds[i % PROJECTS], start + span * i,
                                 int(messages * rng.uniform(0.5, 1.5)))
    return records


def ingest(logs: Path, project: Path, env: dict[str, str],
           stages: dict[str, int] | None = None) -> tuple[float, float, dict[str, object]]:
    """(wall s, peak RSS MB of the process tree, the report) of one `ctx run ingest --json`; with
    `stages`, fills it with the peak (MB) seen during each of the run's stages."""
    proc = subprocess.Popen([CTX, "run", "ingest", "--json", f"--from=claude={logs / 'claude'}",
                             f"--from=codex={logs / 'codex'}"], cwd=project, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    sampler = PeakRSS(proc.pid)
    started = time.perf_counter()
    out, err = proc.communicate()
    wall = time.perf_counter() - started
    peak = sampler.stop() / 2**20
    if proc.returncode != 0:
        raise SystemExit(f"ctx run ingest failed ({proc.returncode}):\n{err[-3000:]}")
    if stages is not None and sampler.samples:
        stages.update(stage_peaks(Path(env["PREFECT_HOME"]) / "prefect.db", sampler.samples))
    return wall, peak, json.loads(out)


def stage_peaks(prefect_db: Path, samples: list[tuple[datetime, int]]) -> dict[str, int]:
    """Peak RSS (MB) per stage of a run, from the stages' task runs in Prefect's database (UTC
    start and end times) and the sampler's timeline; "(between stages)" for what no task covers."""
    import sqlite3

    first = samples[0][0].isoformat(sep=" ")
    with sqlite3.connect(prefect_db) as con:
        runs = con.execute("SELECT name, start_time, end_time FROM task_run WHERE start_time >= ? "
                           "AND end_time IS NOT NULL ORDER BY start_time", (first,)).fetchall()
    windows = [(name.rsplit("-", 1)[0], datetime.fromisoformat(a).replace(tzinfo=None),
                datetime.fromisoformat(b).replace(tzinfo=None)) for name, a, b in runs]
    peaks: dict[str, int] = {}
    for when, rss in samples:
        name = next((n for n, a, b in windows if a <= when <= b), "(between stages)")
        peaks[name] = max(peaks.get(name, 0), round(rss / 2**20))
    return dict(sorted(peaks.items(), key=lambda item: -item[1]))


def lake_files(folder: Path) -> tuple[int, int]:
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


LIVE = """
import json, sys, lancedb
out = {}
for folder in sys.argv[1:]:
    db = lancedb.connect(folder)
    for name in db.list_tables().tables:
        st = db.open_table(name).stats()
        out[name] = {"rows": st["num_rows"], "fragments": st["fragment_stats"]["num_fragments"], "live_mb": round(st["total_bytes"] / 1e6, 1)}
print(json.dumps(out))
"""


def lake_summary(folder: Path) -> dict[str, object]:
    """Files and bytes on disk (old versions kept for KEEP_VERSIONS included) and, per table (the
    memory tables and the embedding cache's), the rows, fragments and bytes of the current version alone."""
    files, size = lake_files(folder)
    cache = folder.parent / "embeddings"  # the embedding cache beside the memory lake, small appends included
    live = subprocess.run([sys.executable, "-c", LIVE, str(folder), *([str(cache)] if cache.is_dir() else [])],
                          capture_output=True, text=True, check=True)
    return {"files": files, "disk_mb": round(size / 1e6, 1), "tables": json.loads(live.stdout)}


READS = """
import json, statistics, sys, time
from pathlib import Path
from ctxlake.schemas.config import load_settings
from ctxlake.serve.api import context_search, memory_lake, memory_sessions
settings = load_settings(Path(sys.argv[1]))
lake = memory_lake.MemoryLake(settings)
def timed(fn, n):
    fn()  # warm
    out = []
    for _ in range(n):
        t = time.perf_counter(); fn(); out.append(time.perf_counter() - t)
    out.sort()
    return {"p50_ms": round(statistics.median(out) * 1000, 1), "p95_ms": round(out[int(0.95 * (len(out) - 1))] * 1000, 1)}
ref = memory_sessions.list_sessions(lake, limit=1)[0].session_ref
words = ["retry backoff timeout", "cache index table", "schema migration error", "parser token stream"]
res = {
    "sessions_n5": timed(lambda: memory_sessions.list_sessions(lake, limit=5), 30),
    "search_context": timed(lambda: context_search.search_context(lake, words[int(time.time() * 1000) % 4], mode="hybrid"), 30),
    "session_detail_page": timed(lambda: memory_sessions.session_detail(lake, ref, offset=20, limit=20), 30),
}
print(json.dumps(res))
"""


# Disk a run needs per session of 70 messages: at 20,000 sessions the logs took 964 MB, the memory
# lake 4.1 GB and the embedding cache 1.0 GB (2026-11-30), ~0.31 MB a session; with room for the
# versions a compaction keeps for a while.
DISK_PER_SESSION = 400_000


def check_free_disk(workdir: Path, sessions: int, messages: int) -> None:
    """Stop before generating when the workdir's disk cannot hold the run: a full disk midway
    fails the ingest late and leaves gigabytes behind."""
    need = sessions * max(messages, 1) / 70 * DISK_PER_SESSION
    folder = workdir
    while not folder.exists():
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SystemExit(f"{folder}: {free / 1e9:.1f} GB free, this run needs about {need / 1e9:.1f} GB "
                         f"({sessions} sessions); free some space or pass --workdir on a bigger disk")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=70, help="messages per session on average")
    parser.add_argument("--compaction-runs", type=int, default=50, help="small ingests for the compaction check")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench-history")
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    parser.add_argument("--reuse", action="store_true",
                        help="time the service phase and the reads again on a workdir an earlier --keep run left "
                             "(its history and lake); implies --keep")
    args = parser.parse_args()
    logs, project, home = args.workdir / "logs", args.workdir / "proj", args.workdir / "home"
    if args.reuse:
        if not (home / "memory").is_dir() or not logs.is_dir():
            raise SystemExit(f"--reuse: no kept history in {args.workdir} (run once with --keep)")
        args.keep = True
    else:
        shutil.rmtree(args.workdir, ignore_errors=True)
        check_free_disk(args.workdir, args.sessions, args.messages)
        project.mkdir(parents=True)
        subprocess.run(["git", "init", "-q"], cwd=project, check=True)
        (project / "main.py").write_text("def main():\n    return 0\n")
    env = {**os.environ, "CTX_HOME": str(home), "CTX_EMBED_MODEL": "static", "HF_HUB_OFFLINE": "1",
           "PREFECT_HOME": str(args.workdir / "prefect"), "HOME": str(args.workdir / "user-home")}
    (args.workdir / "user-home").mkdir(parents=True, exist_ok=True)
    env.pop("PREFECT_API_URL", None)
    r: dict[str, object] = {}
    rng = random.Random(7)
    when = datetime(2026, 11, 20, 9, tzinfo=UTC)
    if args.reuse:
        # New session ids and times after every earlier run's, so each write is new to the lake.
        runs = sum(1 for _ in (logs / "reused").glob("*")) if (logs / "reused").is_dir() else 0
        (logs / "reused" / str(runs)).mkdir(parents=True)
        rng = random.Random(1000 + runs)
        when += timedelta(days=1 + runs)
        offset = 1_000_000 * (runs + 1)
        r["reused"] = str(args.workdir)
    else:
        offset = 0
        subprocess.run([CTX, "run", "index"], cwd=project, env=env, check=True, capture_output=True)
        t = time.perf_counter()
        r["records_written"] = generate(logs, args.sessions, args.messages, project)
        r["generate_s"] = round(time.perf_counter() - t, 1)
        r["log_mb"] = round(sum(p.stat().st_size for p in logs.rglob("*") if p.is_file()) / 1e6)
        print(f"generated {args.sessions} sessions ({r['log_mb']} MB) in {r['generate_s']} s; ingesting ...",
              file=sys.stderr)
        stages: dict[str, int] = {}
        wall, peak, report = ingest(logs, project, env, stages)
        r["cold_ingest_s"], r["cold_peak_rss_mb"] = round(wall, 1), round(peak)
        r["cold_peak_rss_mb_by_stage"] = stages
        r["messages"], r["sessions"] = report.get("messages_inserted"), report.get("sessions_written")
        write_session(rng, logs, 10_000_000, str(project), when, 70)
        r["one_new_session_cold_s"] = round(ingest(logs, project, env)[0], 2)
        r["noop_cold_s"] = round(statistics.median(ingest(logs, project, env)[0] for _ in range(3)), 2)
    # The same through the resident service (`ctx up`), where scheduled ingests run.
    served = {**env, "CTX_SERVICE_SCHEDULES": "false"}
    where = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; from ctxlake.schemas.config "
                            "import load_settings; print(load_settings(Path(sys.argv[1])).memory_dir)", str(project)],
                           env=env, capture_output=True, text=True, check=True)
    folder = Path(where.stdout.strip())
    subprocess.run([CTX, "up"], cwd=project, env=served, check=True, capture_output=True)
    try:
        # A warm-up with something to ingest: a no-op is decided before Prefect starts, and the
        # service's first flow run pays Prefect's start (with schedules on, its own server does).
        write_session(rng, logs, offset + 10_000_002, str(project), when + timedelta(minutes=2), 6)
        ingest(logs, project, served)
        singles = []
        for i in range(5):
            write_session(rng, logs, offset + 10_000_010 + i, str(project), when + timedelta(minutes=5 + i), 70)
            singles.append(ingest(logs, project, served)[0])
        r["one_new_session_s"] = round(statistics.median(singles), 2)
        r["one_new_session_max_s"] = round(max(singles), 2)
        r["noop_s"] = round(statistics.median(ingest(logs, project, served)[0] for _ in range(3)), 2)
        # Many small ingests, as a day of scheduled runs brings: the tables must not grow with them.
        r["lake_before"] = lake_summary(folder)
        walls, compacted = [], 0
        for i in range(args.compaction_runs):
            write_session(rng, logs, offset + 20_000_000 + i, str(project), when + timedelta(minutes=10 * (i + 1)), 6)
            wall, _, report = ingest(logs, project, served)
            walls.append(wall)
            compacted += "messages" in report.get("optimized", [])
        r["compaction_runs"] = args.compaction_runs
        r["runs_that_compacted_messages"] = compacted
        if walls:
            walls.sort()
            r["small_ingest_s"] = {"p50": round(statistics.median(walls), 2),
                                   "p95": round(walls[int(0.95 * (len(walls) - 1))], 2), "max": round(walls[-1], 2)}
        r["lake_after"] = lake_summary(folder)
    finally:
        subprocess.run([CTX, "down"], cwd=project, env=served, check=False, capture_output=True)
    reads = subprocess.run([sys.executable, "-c", READS, str(project)], env=env, capture_output=True, text=True, check=False)
    r["reads"] = json.loads(reads.stdout) if reads.returncode == 0 else reads.stderr[-1500:]
    # disk_mb counts old versions too: those younger than KEEP_VERSIONS (30 min) stay for readers
    # that opened them, so a burst of ingests holds each compaction's rewrite until it ages out;
    # the tables' live_mb is what the current version needs.
    r["load_average"] = [round(x, 1) for x in os.getloadavg()]
    print(json.dumps(r, indent=2, default=str))
    targets = [("cold ingest <= 600 s", r.get("cold_ingest_s", "not run"), 600),
               ("peak RSS <= 1,536 MB", r.get("cold_peak_rss_mb", "not run"), 1536),
               ("one new session <= 2 s", r["one_new_session_s"], 2), ("no-op <= 0.5 s", r["noop_s"], 0.5)]
    if isinstance(r["reads"], dict):
        targets += [("sessions -n 5 <= 300 ms", r["reads"]["sessions_n5"]["p50_ms"], 300),
                    ("search_context p50 <= 50 ms", r["reads"]["search_context"]["p50_ms"], 50),
                    ("session_detail page p50 <= 30 ms", r["reads"]["session_detail_page"]["p50_ms"], 30)]
    for name, value, limit in targets:
        print(f"{name:<36} {value!s:>10}  {'met' if isinstance(value, int | float) and value <= limit else 'MISSED'}")
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
