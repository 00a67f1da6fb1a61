#!/usr/bin/env python3
"""Time what the session hooks cost an agent tool: `ctx hooks session-start` with the service down and up.

    python3 dev.py bench hooks [--runs 15] [--keep DIR]

A project with a few ingested synthetic sessions (the hand-off bench's Claude Code transcripts) and two knowledge
records. Each run is a fresh `ctx` process, as a tool's hook starts it: with the service down the command runs
in-process (imports + lake open + brief); with it up the thin client forwards argv over the socket. Targets:
<= 1.5 s down, <= 0.3 s up (median; p95 shown). `ctx hooks session-end` is timed too: it only starts the
background ingest, so its own cost is what the tool waits for.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_handoff import synth

CTX = str(Path(sys.executable).parent / "ctx")


def run(cmd: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=600)
    took = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return took, out.stdout


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(label: str, cmd: list[str], cwd: Path, env: dict[str, str], runs: int) -> dict[str, float]:
    times = []
    for _ in range(runs):
        took, out = run(cmd, cwd, env)
        times.append(took)
        if "session-start" in cmd:
            context = json.loads(out)["hookSpecificOutput"]["additionalContext"]
            assert context.startswith("# Hand-off:"), context[:200]
    row = {"median_s": round(pct(times, 0.5), 3), "p95_s": round(pct(times, 0.95), 3), "min_s": round(min(times), 3)}
    print(f"{label:<28} median {row['median_s']:.3f} s  p95 {row['p95_s']:.3f} s  min {row['min_s']:.3f} s  ({runs} runs)")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-hooks-"))
    env = {**os.environ, "HOME": str(base / "home"), "CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake",
           "CTX_EMBED_MODEL": "hash", "PREFECT_HOME": str(base / "prefect")}
    env.pop("CTX_SERVICE_AUTOSTART", None)
    try:
        cases = [synth(base, i) for i in range(3)]
        project = cases[-1][0]
        run([CTX, "down"], project, env)
        run([CTX, "run", "ingest", "--no-embed", f"--from=claude={base / 'logs' / 'claude' / 'projects'}", "--json"],
            project, env)
        for title in ("Use approach2 for retries", "Keep the CLI flags stable"):
            run([CTX, "remember", "decision", f"{title}\nmeasured in the hooks bench"], project, env)
        print(f"load before: {os.getloadavg()[0]:.2f} (1-min), {os.cpu_count()} cores")
        start = [CTX, "hooks", "session-start", "--client", "claude"]
        results = {"down": timed("session-start, service down", start, project, env, args.runs)}
        took, _ = run([CTX, "up"], project, env)
        print(f"ctx up: {took:.1f} s")
        try:
            run(start, project, env)  # the service opens this project's lake once
            results["up"] = timed("session-start, service up", start, project, env, args.runs * 2)
            results["end"] = timed("session-end (starts ingest)", [CTX, "hooks", "session-end", "--client", "claude"],
                                   project, env, 3)
        finally:
            subprocess.run([CTX, "down"], cwd=project, env=env, capture_output=True, check=False, timeout=120)
        print(f"load after: {os.getloadavg()[0]:.2f}")
        ok = results["down"]["median_s"] <= 1.5 and results["up"]["median_s"] <= 0.3
        print(json.dumps(results))
        print("PASS" if ok else "FAIL (targets: down <= 1.5 s, up <= 0.3 s median)")
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
