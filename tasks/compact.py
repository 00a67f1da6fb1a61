"""Compact stage: session segments -> SESSIONS rows with a rule-based summary (files, tools, errors, commits, first/last messages, open tasks)."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from ctxlake.schemas.config import MemorySettings
from ctxlake.schemas.git import git_args
from ctxlake.schemas.tables import SESSIONS, with_vector_width
from ctxlake.tasks.compact_llm import summarize
from ctxlake.tasks.memory_store import content_hash
from ctxlake.tasks.open_tasks import open_tasks as explicit_open_tasks
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.sessionize import Segment
from ctxlake.tasks.stage import stage

LINE_CHARS = 300
MAX_FILES = 30
MAX_ITEMS = 10
# A commit made a few minutes after the agent's last message usually finishes its work.
COMMIT_SLACK = timedelta(minutes=10)
GIT_TIMEOUT_S = 10

DECISION = re.compile(
    r"\b(?:we(?:'ve| have)? decided|decided to|decision\s*:|let'?s (?:use|go with|switch to|keep)|let us use|"
    r"we(?:'ll| will| should) (?:use|go with|switch to|keep)|going with|settled on|chose to|opted (?:for|to))\b",
    re.I,
)


def _line(text: str, limit: int = LINE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _conversation(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """User/assistant text rows, the main thread's when it has any (subagents talk among themselves)."""
    talk = [r for r in rows if r["role"] in ("user", "assistant") and r["kind"] == "text" and r["text"].strip()]
    main = [r for r in talk if not r["agent"]]
    return main or talk


def open_tasks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Tasks still open at the end, from explicit signals only (see tasks/open_tasks.py); the latest last."""
    return explicit_open_tasks(rows)


SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def decision_sentences(text: str) -> list[str]:
    """The sentences of `text` that state a decision ("we decided to ...", "let's use ...")."""
    return [_line(sentence, 200) for raw in text.splitlines() for sentence in SENTENCE_END.split(raw)
            if DECISION.search(sentence)]


def decisions(rows: Sequence[dict[str, Any]]) -> list[str]:
    found: dict[str, None] = {}
    for row in rows:
        if row["role"] in ("user", "assistant") and row["kind"] == "text":
            found.update(dict.fromkeys(decision_sentences(row["text"])))
    return list(found)[-MAX_ITEMS:]


def errors(rows: Sequence[dict[str, Any]]) -> list[str]:
    found: dict[str, None] = {}
    for row in rows:
        first = _line(row["text"].strip().splitlines()[0] if row["text"].strip() else "", 200)
        if row["role"] == "system" and row["kind"] == "error":
            found[first or "error"] = None
        elif row["role"] == "tool":
            for call in row["tool_calls"] or []:
                if call.get("is_error"):
                    found[f"{call.get('name') or 'tool'}: {first}" if first else str(call.get("name"))] = None
    return list(found)[:MAX_ITEMS]


def git_commits(project: str, windows: Sequence[tuple[datetime, datetime]]) -> list[list[str]]:
    """Commits of the project's repository inside each time window, one `git log` for all of them."""
    out: list[list[str]] = [[] for _ in windows]
    if not windows or not project or not Path(project).is_dir():
        return out
    since = min(w[0] for w in windows)
    until = max(w[1] for w in windows) + COMMIT_SLACK
    try:
        proc = subprocess.run(
            git_args(Path(project), "log", "--all", f"--since={since.isoformat()}", f"--until={until.isoformat()}",
                     "--format=%h%x09%ct%x09%s"),
            capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return out
    if proc.returncode != 0:
        return out  # not a git repository, or git is missing
    for line in proc.stdout.splitlines():
        sha, _, rest = line.partition("\t")
        stamp, _, subject = rest.partition("\t")
        if not stamp.isdigit():
            continue
        when = datetime.fromtimestamp(int(stamp), tz=since.tzinfo)
        for i, (start, end) in enumerate(windows):
            if start <= when <= end + COMMIT_SLACK:
                out[i].append(f"{sha} {_line(subject, 120)}")
    return [list(reversed(c))[:MAX_ITEMS * 2] for c in out]


def rule_summary(seg: Segment, fields: dict[str, Any]) -> str:
    """The text that is embedded and searched: what the session was about and where it stopped."""
    start, end = fields["started_at"], fields["ended_at"]
    span = f"{start:%Y-%m-%d %H:%M}–{end:%H:%M} UTC" if start.date() == end.date() else f"{start:%Y-%m-%d %H:%M} – {end:%Y-%m-%d %H:%M} UTC"
    lines = [fields["title"],
             f"{seg.tool} session {seg.ref} in {seg.project_path or 'an unknown project'}, {span}, "
             f"{fields['n_messages']} message{'s' if fields['n_messages'] != 1 else ''}"]
    talk = fields["_talk"]
    first_user = next((r for r in talk if r["role"] == "user"), None)
    last_assistant = next((r for r in reversed(talk) if r["role"] == "assistant"), None)
    if first_user:
        lines.append(f"Asked: {_line(first_user['text'])}")
    if last_assistant:
        lines.append(f"Last reply: {_line(last_assistant['text'])}")
    for label, key in (("Files", "files"), ("Errors", "errors"), ("Decisions", "decisions"),
                       ("Open tasks", "open_tasks"), ("Commits", "commits")):
        if fields[key]:
            lines.append(f"{label}: " + "; ".join(fields[key][:MAX_ITEMS]))
    if fields["tool_counts"]:
        lines.append("Tools: " + ", ".join(f"{t['name']}×{t['count']}" for t in fields["tool_counts"][:MAX_ITEMS]))
    return "\n".join(lines)


@stage("compact")
def compact(segments: Sequence[Segment], memory: MemorySettings, dims: int) -> tuple[pa.Table, list[str]]:
    """Session segments -> SESSIONS rows (rule-based summary; LLM summary when configured); warnings."""
    progress = reporter()
    progress.start("compact", len(segments), "compacting")
    windows: dict[str, list[int]] = {}
    for i, seg in enumerate(segments):
        windows.setdefault(seg.project_path, []).append(i)
    commits: dict[int, list[str]] = {}
    for project, idx in windows.items():
        spans = [(segments[i].rows[0]["timestamp"], segments[i].rows[-1]["timestamp"]) for i in idx]
        for i, found in zip(idx, git_commits(project, spans), strict=True):
            commits[i] = found
    rows: list[dict[str, Any]] = []
    warnings: list[str] = []
    n = memory.compact_messages
    for i, seg in enumerate(segments):
        talk = _conversation(seg.rows)
        users = [r for r in talk if r["role"] == "user"]
        first_user_line = _line(users[0]["text"].strip().splitlines()[0], 80) if users else ""
        files = Counter(f for r in seg.rows for f in (r["files"] or []))
        tools = Counter(c.get("name") or "unknown" for r in seg.rows if r["role"] == "assistant" for c in (r["tool_calls"] or []))
        fields: dict[str, Any] = {
            "title": seg.title or first_user_line or f"{seg.tool} session",
            "started_at": seg.rows[0]["timestamp"], "ended_at": seg.rows[-1]["timestamp"],
            "n_messages": len(seg.rows), "n_user": sum(r["role"] == "user" for r in seg.rows),
            "n_assistant": sum(r["role"] == "assistant" for r in seg.rows),
            "tokens_in": sum(r["tokens_in"] or 0 for r in seg.rows), "tokens_out": sum(r["tokens_out"] or 0 for r in seg.rows),
            "files": [f for f, _ in files.most_common(MAX_FILES)],
            "tool_counts": [{"name": k, "count": v} for k, v in tools.most_common()],
            "errors": errors(seg.rows), "commits": commits.get(i, []),
            "first_messages": [f"{r['role']}: {_line(r['text'])}" for r in talk[:n]],
            "last_messages": [f"{r['role']}: {_line(r['text'])}" for r in talk[-n:]] if len(talk) > n else [],
            "open_tasks": open_tasks(seg.rows), "decisions": decisions(seg.rows), "_talk": talk,
        }
        text = rule_summary(seg, fields)
        llm = None
        before = seg.previous.get("llm_summary")
        if before and seg.previous.get("text") == f"{text}\n\nSummary: {before}":
            llm = seg.previous["llm_summary"]  # the session did not change: keep the paid-for summary
        elif memory.llm != "off":
            try:
                llm = summarize(memory, text, talk)
            except Exception as exc:  # any backend failure leaves the rule-based summary in place
                warnings.append(f"LLM compaction of {seg.ref} failed: {exc}")
        full = text + (f"\n\nSummary: {llm}" if llm else "")
        del fields["_talk"]
        rows.append({"id": seg.ref, "tool": seg.tool, "session_id": seg.session_id, "segment": seg.segment,
                     "project_path": seg.project_path, **fields, "llm_summary": llm, "text": full,
                     "content_hash": content_hash(full), "vector": None})
        progress.advance("compact")
    progress.finish("compact")
    return pa.Table.from_pylist(rows, schema=with_vector_width(SESSIONS, dims)), warnings
