"""Open tasks from explicit signals only, shared by the session compaction and the hand-off brief.

An unchecked checkbox (said by anyone), a TodoWrite-style tool call (the latest list replaces older ones),
or an assistant line that *starts* with TODO:/FIXME:/"Next I will"; a TODO word inside a sentence is not a task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

MAX_TASKS = 10


def _line(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


CHECKBOX_OPEN = re.compile(r"^\s*(?:[-*]|\d+[.)])?\s*\[ \]\s+(?P<task>\S.*)$")
CHECKBOX_DONE = re.compile(r"^\s*(?:[-*]|\d+[.)])?\s*\[[xX]\]\s+(?P<task>\S.*)$")
LINE_START_TASK = re.compile(r"^\s*(?:[-*]\s+)?(?:TODO|FIXME)\s*:\s*(?P<task>\S.{2,})$")
NEXT_I_WILL = re.compile(r"^\s*(?:[-*]\s+)?(?:next,?\s+I(?:'ll| will)|next step\s*:|next steps?\s*:)\s*(?P<task>\S.{2,})$", re.I)
TODO_TOOLS = {"todowrite", "todo_write", "update_plan", "write_todos", "todo"}


def _todo_items(raw: str) -> list[tuple[str, bool]] | None:
    """(task, done) pairs from a TodoWrite-style tool input, or None when it is not one."""
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return None
    items = data.get("todos") or data.get("plan") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return None
    out: list[tuple[str, bool]] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        task = item.get("content") or item.get("step") or item.get("description") or item.get("title") or ""
        status = str(item.get("status") or "").lower()
        if task:
            out.append((_line(str(task), 200), status in ("completed", "done", "cancelled")))
    return out


def open_tasks(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Tasks still open at the session's end, from explicit signals only; the latest todo list replaces older ones."""
    found: dict[str, None] = {}
    for row in rows:
        for call in row.get("tool_calls") or []:
            if str(call.get("name") or "").lower() in TODO_TOOLS:
                items = _todo_items(call.get("input") or "")
                if items is not None:
                    found = {task: None for task, done in items if not done}
        if row["role"] not in ("user", "assistant") or row.get("kind", "text") != "text":
            continue
        for raw in (row["text"] or "").splitlines():
            done = CHECKBOX_DONE.match(raw)
            if done:
                found.pop(_line(done.group("task"), 200), None)
                continue
            match = CHECKBOX_OPEN.match(raw)
            if match is None and row["role"] == "assistant":
                match = LINE_START_TASK.match(raw) or NEXT_I_WILL.match(raw)
            if match:
                task = _line(match.group("task"), 200)
                found.pop(task, None)
                found[task] = None
    return list(found)[-MAX_TASKS:]
