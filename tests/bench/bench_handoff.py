#!/usr/bin/env python3
"""Score `ctx handoff` on synthetic sessions with planted facts, and check it on the shared fixture logs.

    python3 dev.py bench handoff [--sessions 6] [--keep DIR]

Synthetic sessions, each in its own git project with known facts: the goal, a file changed (left uncommitted, so
`git diff --stat` must show it), a decision, the last failing command, an open task, a next step, and a distractor
(the user asks to "search the repo for TODO comments", which must not become a task). Three sets, scored apart:
  claude  - Claude Code transcripts, facts in the shapes the rules were written for ("decided to", "- [ ] ",
            "Next I will", a tool result flagged is_error);
  codex   - the same facts in Codex rollout files (function_call / function_call_output with an exit code);
  unseen  - Claude transcripts whose facts use shapes the rules were NOT tuned on ("the plan is to keep ...",
            "Remaining work: ...", "Once that passes, I'll ...", a failure only said as "Exit code 1" in the output,
            a new file created with Write). Reported honestly; no target.
Recall = planted facts found in the brief's text; invented = open tasks in the brief that were not planted.
Targets (claude + codex): recall >= 90%, zero invented, every brief <= 1,500 estimated tokens (chars/4).

Fixture part (../shared/fixtures/agent-logs, all seven tools, read at run time, skipped when absent): no planted
facts, so each brief is checked against that session's stored messages (`ctx session show`): the goal (first user
message), the last user request and the last assistant reply must appear (first 60 characters), every open task
must be grounded (its words appear in a message or tool input of the session), and the size must fit the budget.
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


def project_repo(base: Path, name: str, src_name: str) -> tuple[Path, Path]:
    project = base / name
    project.mkdir(parents=True)
    git(project, "init", "-q", "-b", "main")
    src = project / src_name
    src.write_text("VALUE = 1\n")
    git(project, "add", ".")
    git(project, "commit", "-q", "-m", "start", when="2026-03-01T09:00:00Z")
    src.write_text("VALUE = 2\n\ndef run():\n    return VALUE\n")
    return project, src


def cx(kind: str, minute: float, payload: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": at(minute), "type": kind, "payload": payload}


def synth_codex(base: Path, i: int) -> tuple[Path, Path, dict[str, str], set[str]]:
    """The same kind of facts in a Codex rollout file."""
    topic = TOPICS[(i + 3) % len(TOPICS)]
    slug_name = topic.replace(" ", "_")
    project, src = project_repo(base, f"cxproj{i}", f"{slug_name}.py")
    sid = f"cxbench-{i:04d}"
    facts = {
        "goal": f"Refactor the {topic} of service {i}",
        "file": src.name,
        "decision": f"decided to keep variant{i} of the {topic}",
        "error": f"pytest -q tests/test_{slug_name}_{i}.py",
        "task": f"update the changelog for the {topic}",
        "next": f"add a benchmark for the {topic}",
    }
    planted = {facts["task"], facts["next"]}

    def msg(role: str, minute: float, text: str) -> dict[str, Any]:
        kind = "input_text" if role == "user" else "output_text"
        return cx("response_item", minute, {"type": "message", "role": role, "content": [{"type": kind, "text": text}]})

    lines = [
        cx("session_meta", 0, {"id": sid, "timestamp": at(0), "cwd": str(project), "originator": "codex_cli_rs"}),
        msg("user", 0, f"{facts['goal']} without changing its API"),
        msg("assistant", 1, f"We {facts['decision']} because it is simpler."),
        cx("response_item", 2, {"type": "function_call", "name": "shell", "call_id": f"c{i}a",
                                "arguments": json.dumps({"command": ["bash", "-lc", f"sed -i s/1/2/ {src.name}"]})}),
        cx("response_item", 2, {"type": "function_call_output", "call_id": f"c{i}a",
                                "output": json.dumps({"output": "", "metadata": {"exit_code": 0}})}),
        msg("user", 3, "and search the repo for TODO comments please"),
        msg("assistant", 4, f"No TODO comments besides one in {src.name}.\n- [ ] {facts['task']}\n"
                            f"Next I will {facts['next']}"),
        cx("response_item", 5, {"type": "function_call", "name": "shell", "call_id": f"c{i}b",
                                "arguments": json.dumps({"command": ["bash", "-lc", facts["error"]]})}),
        cx("response_item", 5, {"type": "function_call_output", "call_id": f"c{i}b",
                                "output": json.dumps({"output": "1 failed", "metadata": {"exit_code": 1}})}),
    ]
    path = base / "logs" / "codex" / "sessions" / "2026" / "03" / "02" / f"rollout-2026-03-02T09-00-{i:02d}-{sid}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return project, path, facts, planted


def synth_unseen(base: Path, i: int) -> tuple[Path, Path, dict[str, str], set[str]]:
    """Claude transcripts whose facts come in shapes the rules were not written for."""
    topic = TOPICS[(i + 5) % len(TOPICS)]
    slug_name = topic.replace(" ", "_")
    project, _ = project_repo(base, f"unproj{i}", f"{slug_name}.py")
    new_file = project / f"{slug_name}_helpers.py"
    sid = f"unbench-{i:04d}"
    cwd = str(project)
    facts = {
        "goal": f"Speed up the {topic} in module {i}",
        "file": new_file.name,
        "decision": f"the plan is to keep backend{i}",
        "error": f"make check-{slug_name}",
        "task": f"profile the {topic} under load",
        "next": f"port the {topic} to the worker",
    }
    planted = {facts["task"], facts["next"]}
    lines = [
        rec("user", 0, 0, f"hey! {facts['goal']}, it is too slow", sid, cwd),
        rec("assistant", 1, 1, [{"type": "text", "text": f"After comparing both, {facts['decision']}."},
                                {"type": "tool_use", "id": f"u{i}a", "name": "Write",
                                 "input": {"file_path": str(new_file), "content": "X = 1\n"}}], sid, cwd),
        rec("user", 2, 2, [{"type": "tool_result", "tool_use_id": f"u{i}a", "content": "File created"}], sid, cwd),
        rec("assistant", 3, 3, [{"type": "text", "text": f"Remaining work: {facts['task']}.\n"
                                                        f"Once that passes, I'll {facts['next']}."},
                                {"type": "tool_use", "id": f"u{i}b", "name": "Bash", "input": {"command": facts["error"]}}],
            sid, cwd),
        rec("user", 4, 4, [{"type": "tool_result", "tool_use_id": f"u{i}b",
                            "content": "make: *** [check] Error 2\nExit code 2"}], sid, cwd),
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
    """The seven tools' fixture files laid out as each tool stores them, in a temp folder: {tool: store root}."""
    out: dict[str, Path] = {}
    if not SHARED.is_dir():
        return out
    fx = base / "fx"

    def put(tool: str, src: Path, dst: Path, root: Path) -> None:
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
            out[tool] = root

    for name in ("small.jsonl", "large.jsonl"):
        stem = name.split(".")[0]
        put("claude", SHARED / "claude" / name, fx / "claude" / "projects" / "-fixture" / name, fx / "claude" / "projects")
        put("codex", SHARED / "codex" / name,
            fx / "codex" / "sessions" / "2026" / "01" / "01" / f"rollout-2026-01-01T00-00-0{len(name)}-{stem}.jsonl",
            fx / "codex" / "sessions")
        put("cursor", SHARED / "cursor" / name, fx / "cursor" / "fixture" / "agent-transcripts" / stem / f"{stem}.jsonl",
            fx / "cursor")
        put("copilot", SHARED / "copilot" / name, fx / "copilot" / stem / "events.jsonl", fx / "copilot")
    for name in ("small.json", "large.json"):
        put("gemini", SHARED / "gemini" / name, fx / "gemini" / "h1" / "chats" / f"session-{name}", fx / "gemini")
    put("gemini", SHARED / "gemini" / "jsonl_v040.jsonl", fx / "gemini" / "h2" / "chats" / "session-v040.jsonl", fx / "gemini")
    put("antigravity", SHARED / "antigravity" / "cli_small.jsonl", fx / "antigravity" / "brain" / "ag1.jsonl",
        fx / "antigravity")
    storage = SHARED / "opencode" / "storage_v2"
    if storage.is_dir():
        shutil.copytree(storage, fx / "opencode")
        out["opencode"] = fx / "opencode"
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def score(env: dict[str, str], cases: list[tuple[Path, Path, dict[str, str], set[str]]], label: str
          ) -> tuple[int, int, int, int, int, list[float], int]:
    """(found, total, invented, over budget, largest tokens, seconds per brief, planted tasks listed as open tasks)."""
    found = total = invented = over = worst = listed = 0
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
                print(f"  [{label}] missed {key}: {fact!r} in {project.name}")
        listed += sum(any(p in t for t in brief["open_tasks"]) for p in planted)
        extra = [t for t in brief["open_tasks"] if not any(p in t for p in planted)]
        invented += len(extra)
        for t in extra:
            print(f"  [{label}] invented open task in {project.name}: {t!r}")
        worst = max(worst, brief["tokens"])
        over += brief["tokens"] > 1500
    return found, total, invented, over, worst, times, listed


def fixture_check(env: dict[str, str], base: Path, stores: dict[str, Path]) -> None:
    fx = base / "fxproj"
    fx.mkdir()
    ctx(env, fx, "run", "ingest", "--no-embed", *[f"--from={k}={v}" for k, v in stores.items()])
    listed = ctx(env, fx, "sessions", "--all-projects", "-n", "200")
    sizes: list[int] = []
    found = total = tasks = ungrounded = 0
    per_tool: dict[str, list[int]] = {}
    for s in [s for s in listed if "bench-" not in s["session_ref"]]:  # the memory lake is user-wide
        b = ctx(env, fx, "handoff", "--session", s["session_ref"])
        detail = ctx(env, fx, "session", "show", s["session_ref"], "-n", "5000")
        messages = detail["messages"]
        talk = [m for m in messages if m["kind"] == "text" and m["text"].strip()]
        users = [m["text"] for m in talk if m["role"] == "user"]
        replies = [m["text"] for m in talk if m["role"] == "assistant"]
        expected = {"goal": users[:1], "last user": users[-1:] if len(users) > 1 else [], "last reply": replies[-1:]}
        text = _norm(b["text"])
        stats = per_tool.setdefault(s["tool"], [0, 0, 0])
        for key, values in expected.items():
            for value in values:
                total += 1
                stats[1] += 1
                probe = _norm(value)[:60].rstrip("…")
                if probe and probe in text:
                    found += 1
                    stats[0] += 1
                else:
                    print(f"  [fixtures] {s['session_ref']}: {key} not in the brief: {probe!r}")
        corpus = _norm(" ".join(m["text"] + " " + " ".join(c.get("input", "") for c in m["tool_calls"])
                                for m in messages)).lower()
        for t in b["open_tasks"]:
            tasks += 1
            words = [w for w in _norm(t.rstrip("…")).lower().split()][:8]
            if " ".join(words) not in corpus:
                ungrounded += 1
                print(f"  [fixtures] {s['session_ref']}: open task not found in the session: {t!r}")
        sizes.append(b["tokens"])
        stats[2] = max(stats[2], b["tokens"])
    tools = ", ".join(f"{k} {v[0]}/{v[1]} (max {v[2]} tok)" for k, v in sorted(per_tool.items()))
    print(f"fixtures: {len(sizes)} sessions over {len(per_tool)} tools; goal/last-request/last-reply recall "
          f"{found}/{total} = {found / max(total, 1):.0%}; open tasks {tasks}, ungrounded {ungrounded}; brief tokens "
          f"max {max(sizes, default=0)}, median {sorted(sizes)[len(sizes) // 2] if sizes else 0}")
    print(f"  per tool: {tools}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--keep", type=Path, default=None)
    args = parser.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="bench-handoff-"))
    env = {**os.environ, "HOME": str(base / "home"), "CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake",
           "CTX_EMBED_MODEL": "hash", "PREFECT_HOME": str(base / "prefect")}
    try:
        sets = {"claude": [synth(base, i) for i in range(args.sessions)],
                "codex": [synth_codex(base, i) for i in range(args.sessions)],
                "unseen": [synth_unseen(base, i) for i in range(args.sessions)]}
        ctx(env, sets["claude"][0][0], "run", "ingest", "--no-embed",
            f"--from=claude={base / 'logs' / 'claude' / 'projects'}", f"--from=codex={base / 'logs' / 'codex' / 'sessions'}")
        ok = True
        for label, cases in sets.items():
            found, total, invented, over, worst, times, listed = score(env, cases, label)
            recall = found / total
            target = "" if label == "unseen" else " (target >= 90%)"
            print(f"{label}: {len(cases)} sessions, recall {found}/{total} = {recall:.0%}{target}, invented open tasks "
                  f"{invented}" + ("" if label == "unseen" else " (target 0)") + f", largest brief {worst} tokens "
                  f"(chars/4; target <= 1500), `ctx handoff` median {sorted(times)[len(times) // 2]:.2f}s; planted task/next "
                  f"listed under Open tasks {listed}/{2 * len(cases)} (elsewhere they count only if the text has them)")
            if label != "unseen":
                ok = ok and recall >= 0.9 and invented == 0 and over == 0
            else:
                ok = ok and over == 0
        stores = fixtures(base)
        if not stores:
            print(f"fixtures: skipped ({SHARED} is absent)")
        else:
            fixture_check(env, base, stores)
        print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
