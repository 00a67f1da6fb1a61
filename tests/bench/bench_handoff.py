#!/usr/bin/env python3
"""Score `ctx handoff` on synthetic sessions with planted facts, and size it on the shared fixture logs.

    python3 dev.py bench handoff [--sessions 6] [--keep DIR]

Each synthetic session is a Claude Code transcript in its own git project with known facts: the goal,
a file changed (and left uncommitted, so `git diff --stat` must show it), a decision, the last failing
command, an open task (an unchecked box), a next step ("Next I will ...") and a distractor (the user asks to
"search the repo for TODO comments", which must not become a task). Recall = planted facts found in the
brief's text; invented = open tasks in the brief that were not planted. Targets: recall >= 90%, zero
invented, every brief <= 1,500 estimated tokens (chars/4). The fixture part (../shared/fixtures/agent-logs,
read at run time, skipped when absent) only reports brief sizes and open-task counts: it has no ground truth.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures" / "agent-logs"
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
TOPICS = ["retry loop", "cache layer", "CSV export", "login form", "rate limiter", "config loader", "search page",
          "upload size check"]


def at(minutes: float) -> str:
    return (T0 + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def rec(role: str, n: int, minute: float, content: Any, sid: str, cwd: str) -> dict[str, Any]:
    return {"type": role, "uuid": f"{sid}-{n}", "parentUuid": None, "isSidechain": False, "timestamp": at(minute),
            "sessionId": sid, "cwd": cwd, "version": "2.1.0", "message": {"role": role, "content": content}}


def git(repo: Path, *args: str, when: str | None = None) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com", "GIT_COMMITTER_NAME": "b",
           "GIT_COMMITTER_EMAIL": "b@example.com"}
    if when:
        env |= {"GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)


def synth(base: Path, i: int) -> tuple[Path, Path, dict[str, str], set[str]]:
    """One project + transcript; (project, transcript, facts to find, the planted open tasks)."""
    topic = TOPICS[i % len(TOPICS)]
    slug_name = topic.replace(" ", "_")
    project = base / f"proj{i}"
    project.mkdir(parents=True)
    git(project, "init", "-q", "-b", "main")
    src = project / f"{slug_name}.py"
    src.write_text("VALUE = 1\n")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "start", when="2026-03-01T09:00:00Z")
    src.write_text("VALUE = 2\n\ndef run():\n    return VALUE\n")
    sid = f"bench-{i:04d}"
    cwd = str(project)
    facts = {
        "goal": f"Implement the {topic} for project {i}",
        "file": src.name,
        "decision": f"decided to use approach{i} for the {topic}",
        "error": f"pytest -q tests/test_{slug_name}.py",
        "task": f"write the docs for the {topic}",
        "next": f"wire the {topic} into the CLI",
    }
    planted = {facts["task"], facts["next"]}
    lines = [
        rec("user", 0, 0, f"{facts['goal']} and keep the tests green", sid, cwd),
        rec("assistant", 1, 1, [{"type": "text", "text": f"We {facts['decision']}."},
                                {"type": "tool_use", "id": f"t{i}a", "name": "Edit", "input": {"file_path": str(src)}}], sid, cwd),
        rec("user", 2, 2, [{"type": "tool_result", "tool_use_id": f"t{i}a", "content": "ok"}], sid, cwd),
        rec("user", 3, 3, "also search the repo for TODO comments", sid, cwd),
        rec("assistant", 4, 4, [{"type": "text", "text": f"There is a TODO in {src.name} about naming.\n- [x] read the code\n"
                                                        f"- [ ] {facts['task']}\nNext I will {facts['next']}"},
                                {"type": "tool_use", "id": f"t{i}b", "name": "Bash", "input": {"command": facts["error"]}}], sid, cwd),
        rec("user", 5, 5, [{"type": "tool_result", "tool_use_id": f"t{i}b", "content": "FAILED test_run - AssertionError",
                            "is_error": True}], sid, cwd),
    ]
    transcript = base / "logs" / "claude" / "projects" / cwd.replace("/", "-") / f"{sid}.jsonl"
    transcript.parent.mkdir(parents=True, exist_ok=True)
    transcript.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return project, transcript, facts, planted


def ctx(env: dict[str, str], cwd: Path, *args: str) -> Any:
    exe = Path(sys.executable).parent / "ctx"
    proc = subprocess.run([str(exe), *args, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"ctx {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def fixtures(base: Path) -> dict[str, Path]:
    """Claude and Codex fixture files laid out as each tool stores them, in a temp folder."""
    out: dict[str, Path] = {}
    if not SHARED.is_dir():
        return out
    for name in ("small.jsonl", "large.jsonl"):
        src = SHARED / "claude" / name
        if src.exists():
            dst = base / "fx" / "claude" / "projects" / "-fixture" / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
            out["claude"] = base / "fx" / "claude" / "projects"
        src = SHARED / "codex" / name
        if src.exists():
            dst = base / "fx" / "codex" / "sessions" / "2026" / "01" / "01" / f"rollout-2026-01-01T00-00-0{len(name)}-{name}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
            out["codex"] = base / "fx" / "codex" / "sessions"
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-handoff-"))
    env = {**os.environ, "HOME": str(base / "home"), "CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake",
           "CTX_EMBED_MODEL": "hash", "PREFECT_HOME": str(base / "prefect")}
    try:
        cases = [synth(base, i) for i in range(args.sessions)]
        ctx(env, cases[0][0], "run", "ingest", "--no-embed", f"--from=claude={base / 'logs' / 'claude' / 'projects'}")
        found = total = invented = over = 0
        worst = 0
        times: list[float] = []
        for project, _, facts, planted in cases:
            started = time.perf_counter()
            brief = ctx(env, project, "handoff")
            times.append(time.perf_counter() - started)
            text = brief["text"]
            for key, fact in facts.items():
                total += 1
                hit = fact in text
                found += hit
                if not hit:
                    print(f"  missed {key}: {fact!r} in {project.name}")
            extra = [t for t in brief["open_tasks"] if t not in planted]
            invented += len(extra)
            for t in extra:
                print(f"  invented open task in {project.name}: {t!r}")
            worst = max(worst, brief["tokens"])
            over += brief["tokens"] > 1500
        recall = found / total
        print(f"synthetic: {args.sessions} sessions, recall {found}/{total} = {recall:.0%} (target >= 90%), "
              f"invented open tasks {invented} (target 0), largest brief {worst} tokens (chars/4; target <= 1500), "
              f"`ctx handoff` median {sorted(times)[len(times) // 2]:.2f}s")
        stores = fixtures(base)
        if not stores:
            print(f"fixtures: skipped ({SHARED} is absent)")
        else:
            fx = base / "fxproj"
            fx.mkdir()
            ctx(env, fx, "run", "ingest", "--no-embed", *[f"--from={k}={v}" for k, v in stores.items()])
            listed = ctx(env, fx, "sessions", "--all-projects", "-n", "50")
            sizes, tasks = [], 0
            for s in [s for s in listed if ":bench-" not in s["session_ref"]]:  # the memory lake is user-wide
                b = ctx(env, fx, "handoff", "--session", s["session_ref"])
                sizes.append(b["tokens"])
                tasks += len(b["open_tasks"])
            print(f"fixtures: {len(sizes)} sessions, brief tokens max {max(sizes, default=0)}, "
                  f"median {sorted(sizes)[len(sizes) // 2] if sizes else 0}, open tasks found {tasks}")
        ok = recall >= 0.9 and invented == 0 and over == 0
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
