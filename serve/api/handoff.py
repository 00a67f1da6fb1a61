"""The hand-off brief: a bounded, rule-based note that lets an agent pick up where the last session stopped.

Built only from what ingest already stored (SESSIONS, MESSAGES, KNOWLEDGE) plus `git diff --stat` over the
session's time window; no model is called, so it is cheap enough for a session-start hook.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from ctxlake.errors import InputError
from ctxlake.schemas.git import NO_DIFF_DRIVERS, git_args
from ctxlake.serve.api.memory_lake import MESSAGE_COLUMNS, MemoryLake, _ts
from ctxlake.serve.api.memory_models import DEFAULT_BUDGET, Brief
from ctxlake.serve.api.memory_sessions import list_sessions, resolve_ref, time_estimated
from ctxlake.tasks.open_tasks import open_tasks
from ctxlake.tasks.store import sql_str
from ctxlake.tasks.tokens import CHARS_PER_TOKEN, estimate_tokens

LINE = 240
GIT_TIMEOUT_S = 5


def _line(text: str, limit: int = LINE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# -- rules ---------------------------------------------------------------------------------------


def failing_command(rows: Sequence[dict[str, Any]]) -> str:
    """The last tool call that failed, when nothing ran successfully after it (the session stopped on it)."""
    last_error = ""
    for i, row in enumerate(rows):
        for call in row.get("tool_calls") or []:
            if call.get("is_error") is None:
                continue
            if call.get("is_error"):
                name, command = _matching_call(rows[:i], call) if not call.get("input") else (call.get("name"), call["input"])
                first = (row["text"] or "").strip().splitlines()
                last_error = _line(f"{name or 'tool'}: {command}" + (f" -> {first[0]}" if first else ""))
            else:
                last_error = ""
    return last_error


def _matching_call(rows: Sequence[dict[str, Any]], result: dict[str, Any]) -> tuple[str | None, str]:
    """The call a result answers: the latest earlier call of the same name (results often carry no name)."""
    name = result.get("name")
    name = None if name in (None, "", "unknown") else name
    for row in reversed(rows):
        for call in reversed(row.get("tool_calls") or []):
            if call.get("is_error") is None and (not name or call.get("name") == name) and call.get("input"):
                return call.get("name"), str(call["input"])
    return name, ""


def git_diff_stat(project: str, start: datetime, end: datetime) -> str:
    """`git diff --stat` from the last commit before the session to the work tree (or the last commit in it)."""
    if not project or not Path(project).is_dir():
        return ""

    def git(*args: str, work_tree: bool = False) -> str | None:
        try:
            proc = subprocess.run(git_args(Path(project), *args, work_tree=work_tree), capture_output=True, text=True,
                                  timeout=GIT_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    if (git("rev-parse", "--is-inside-work-tree") or "").strip() != "true":
        return ""
    base = (git("rev-list", "-1", f"--before={start.isoformat()}", "HEAD") or "").strip()
    if not base:
        return ""
    # The session is over if later work happened; then compare to the last commit inside the window.
    after = (git("rev-list", "-1", f"--since={(end + timedelta(minutes=10)).isoformat()}", "HEAD") or "").strip()
    target = [(git("rev-list", "-1", f"--before={(end + timedelta(minutes=10)).isoformat()}", "HEAD") or "").strip()] if after else []
    # Against the work tree when the session is still open: the repository's filters stay off (git_args).
    out = git("diff", *NO_DIFF_DRIVERS, "--stat=120", base, *[t for t in target if t], work_tree=not target) or ""
    lines = [ln.rstrip() for ln in out.splitlines() if ln.strip()]
    if len(lines) > 12:
        lines = [*lines[:10], f" … {len(lines) - 11} more files", lines[-1]]
    return "\n".join(lines)


# -- build ---------------------------------------------------------------------------------------


def _pick(lake: MemoryLake, tool: str | None, ref: str | None) -> dict[str, Any]:
    if ref:
        return resolve_ref(lake, ref)
    found = list_sessions(lake, limit=1, tools=[tool] if tool else None)
    if not found:
        raise InputError("no session to hand off from" + (f" for {tool}" if tool else " in this project"),
                         hint="run `ctx run ingest`, or pass --session REF (`ctx sessions --all-projects` lists every project's)")
    return resolve_ref(lake, found[0].session_ref)


def _messages(lake: MemoryLake, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation up to the end of the segment `row`, earlier segments of it included: one
    tool session split by a long pause is still one piece of work, whose goal and open tasks came
    before the pause."""
    messages, _ = lake.require_memory()
    where = (f"tool = {sql_str(row['tool'])} AND session_id = {sql_str(row['session_id'])} "
             f"AND timestamp <= {_ts(row['ended_at'])}")
    items = messages.search().where(where).select(MESSAGE_COLUMNS).limit(None).to_list()
    items.sort(key=lambda r: (r["timestamp"], r["source_file"], r["seq"]))
    return items


def _as_utc(when: datetime) -> datetime:
    """The lake's timestamps are UTC, read back naive or aware: comparable either way."""
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _talk(rows: Sequence[dict[str, Any]], role: str) -> list[dict[str, Any]]:
    talk = [r for r in rows if r["role"] == role and r["kind"] == "text" and (r["text"] or "").strip()]
    main = [r for r in talk if not r["agent"]]
    return main or talk


def build_brief(lake: MemoryLake, tool: str | None = None, ref: str | None = None,
                budget: int = DEFAULT_BUDGET) -> Brief:
    """The hand-off brief of the latest session (of `tool`), or of session `ref`, within `budget` tokens."""
    if budget < 200:
        raise InputError(f"budget must be at least 200 tokens, got {budget}")
    row = _pick(lake, tool, ref)
    whole = _messages(lake, row)
    started = _as_utc(row["started_at"])
    rows = [r for r in whole if _as_utc(r["timestamp"]) >= started]  # this segment: what failed last
    users, replies = _talk(whole, "user"), _talk(whole, "assistant")
    brief = Brief(session_ref=row["id"], tool=row["tool"], title=row["title"],
                  started_at=row["started_at"].isoformat(), ended_at=row["ended_at"].isoformat(),
                  goal=_line(users[0]["text"], 600) if users else row["title"], budget=budget)
    brief.time_estimated = row["id"] in time_estimated(lake, [row])
    brief.files = list(row["files"] or [])
    brief.commits = list(row["commits"] or [])
    brief.diff_stat = git_diff_stat(row["project_path"], row["started_at"], row["ended_at"])
    brief.decisions = list(row["decisions"] or [])
    brief.errors = _error_solutions(lake, row)
    brief.last_user = _line(users[-1]["text"], 500) if len(users) > 1 else ""
    brief.last_assistant = _line(replies[-1]["text"], 600) if replies else ""
    brief.failing_command = failing_command(rows)
    brief.open_tasks = open_tasks(whole)
    brief.next_step = _next_step(brief)
    render(brief)
    return brief


def _error_solutions(lake: MemoryLake, row: dict[str, Any]) -> list[str]:
    """Errors the session hit, with the solution when a knowledge record of that session tells it."""
    out = [_line(e, 200) for e in row["errors"] or []]
    if lake.knowledge is not None and lake.knowledge.count_rows() > 0:
        where = f"type = 'error' AND superseded_by IS NULL AND source_session = {sql_str(row['id'])}"
        for k in lake.knowledge.search().where(where).select(["title", "body"]).limit(10).to_list():
            out.append(_line(f"{k['title']} -> {k['body']}", 240))
    return out[-8:]


def _next_step(brief: Brief) -> str:
    if brief.failing_command:
        return f"Fix the failing step first: {brief.failing_command}"
    if brief.open_tasks:
        return f"Continue with the first open task: {brief.open_tasks[0]}"
    if brief.last_user:
        return f"Check the last request was fully done: {brief.last_user}"
    return "Confirm with the user what to do next; the last session looks finished."


def _section(title: str, items: Sequence[str]) -> list[str]:
    return [f"## {title}", *[f"- {i}" for i in items]] if items else []


def render(brief: Brief) -> str:
    """Markdown text of the brief, dropping the least useful items first until it fits the budget."""
    files = list(brief.files)
    decisions, errors, tasks = list(brief.decisions), list(brief.errors), list(brief.open_tasks)
    diff = brief.diff_stat
    last_assistant = brief.last_assistant
    while True:
        parts = [f"# Hand-off: {brief.tool} session {brief.session_ref}",
                 f"{brief.started_at[:16]} – {brief.ended_at[:16]} UTC"
                 + (" (file time: the log has no timestamps)" if brief.time_estimated else "") + f" · {brief.title}", "",
                 "## Goal (the user's words)", brief.goal, ""]
        done = [f"Files changed: {', '.join(files)}"] if files else []
        done += [f"Commit: {c}" for c in brief.commits[:5]]
        parts += _section("What was done", done)
        if diff:
            parts += ["```", diff, "```"]
        parts += _section("Decisions", decisions) + _section("Errors -> solutions", errors)
        state = ([f"Last user request: {brief.last_user}"] if brief.last_user else []) + \
                ([f"Last assistant reply: {last_assistant}"] if last_assistant else []) + \
                ([f"Failing command: {brief.failing_command}"] if brief.failing_command else [])
        parts += _section("Last state", state) + _section("Open tasks", tasks)
        parts += ["## Suggested next step", brief.next_step]
        text = "\n".join(p for p in parts)
        tokens = estimate_tokens(text)
        if tokens <= brief.budget:
            break
        brief.truncated = True
        if diff:
            # keep the totals line first, then drop the stat altogether
            diff = diff.splitlines()[-1] if len(diff.splitlines()) > 1 else ""
            continue
        if len(files) > 5:
            files = [*files[:5], f"… {len(files) - 5} more"]
        elif len(errors) > 2:
            errors = errors[-2:]
        elif len(decisions) > 3:
            decisions = decisions[-3:]
        elif len(last_assistant) > 200:
            last_assistant = _line(last_assistant, 200)
        elif len(tasks) > 3:
            tasks = tasks[-3:]
        else:
            text = text[: brief.budget * CHARS_PER_TOKEN - 2] + "…"
            tokens = estimate_tokens(text)
            break
    brief.text, brief.tokens = text, tokens
    return text
