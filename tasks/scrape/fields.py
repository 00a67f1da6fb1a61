"""Typed access to drifting log records, and record -> row helpers shared by the scrapers.

Agent logs change shape between tool versions and get damaged: any field can hold a list where
text was, a number where a list was, or nothing. Scrapers read fields through these accessors
(each returns the expected type or an empty/None value) instead of scattering isinstance checks.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import orjson
import xxhash

# Tool output is mostly noise for a summary; a one-line input summary is what an agent needs.
INPUT_SUMMARY_CHARS = 300
# Call id -> tool name of the calls not yet answered, kept per file between runs, so a tool result
# appended later is named; at most this many (a call never answered is dropped in time).
KEEP_CALL_NAMES = 200
# Keys under which agent tools pass file paths to their tools.
FILE_KEYS = ("file_path", "filePath", "path", "notebook_path", "TargetFile", "AbsolutePath", "file",
             "filename", "target_file", "relative_workspace_path")
PATCH_FILE = re.compile(r"^\*\*\* (?:Update|Add|Delete) File: (.+)$", re.M)
EXIT_CODE = re.compile(r"Exit Code: (-?\d+)")


# -- typed accessors ----------------------------------------------------------------------------


# Times outside these are damage, not history: a record stamped 9999-12-31 overflowed the session
# windows' date arithmetic and stopped every later ingest; year 1 was stored as text the read
# side could not cast back.
EARLIEST_TS = datetime(1990, 1, 1, tzinfo=UTC)
LATEST_TS = datetime(2200, 1, 1, tzinfo=UTC)


def parse_ts(value: Any) -> datetime | None:
    """ISO-8601 text or epoch seconds/milliseconds -> aware UTC datetime between EARLIEST_TS and
    LATEST_TS; None when unusable."""
    if isinstance(value, bool) or value is None:
        return None
    ts: datetime | None = None
    if isinstance(value, int | float):
        seconds = value / 1000.0 if value > 1e11 else float(value)
        try:
            ts = datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    elif isinstance(value, str) and value[:1].isdigit():
        try:
            parsed = datetime.fromisoformat(value)
            ts = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
        except (ValueError, OverflowError):
            return None
    if ts is None or not EARLIEST_TS <= ts < LATEST_TS:
        return None
    return ts


def obj(value: Any) -> dict[str, Any]:
    """`value` when it is a JSON object, else an empty one (logs drift; fields go missing)."""
    return value if isinstance(value, dict) else {}


def string(value: Any) -> str:
    return value if isinstance(value, str) else ""


def integer(value: Any) -> int | None:
    """An int field (token counts, exit codes) or None: bools, floats of nonsense and text are not ints."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**62:
        return int(value)
    return None


def items(value: Any) -> list[Any]:
    """`value` when it is a JSON array, else an empty one (a string or object where a list should be)."""
    return value if isinstance(value, list) else []


def dicts(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON array; anything else in it (or a non-array) is left out."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def label(value: Any) -> str:
    """A record's type for the unknown-type counts: its text, or what JSON type stood there instead."""
    if isinstance(value, str):
        return value[:80]
    return "null" if value is None else f"<{type(value).__name__}>"


def opt_string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# -- content helpers -----------------------------------------------------------------------------


def text_of(content: Any, keys: tuple[str, ...] = ("text",)) -> str:
    """The text of a message's content: a string, or the text blocks of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                for key in keys:
                    value = block.get(key)
                    if isinstance(value, str):
                        parts.append(value)
                        break
        return "\n".join(p for p in parts if p)
    if isinstance(content, dict):
        for key in keys:
            value = content.get(key)
            if isinstance(value, str):
                return value
    return ""


def maybe_json(value: Any) -> Any:
    """Arguments some tools pass as JSON text ("{\\"command\\": ...}", "\\"/tmp/x\\"") as values."""
    if isinstance(value, str) and value[:1] in ('{', '[', '"'):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def summarize_input(value: Any) -> str:
    """Tool arguments as one short line: the command, path, pattern or query when there is one."""
    value = maybe_json(value)
    if isinstance(value, dict):
        for key in ("command", "cmd", "file_path", "filePath", "path", "pattern", "query", "url",
                    "prompt", "description", "TargetFile", "DirectoryPath"):
            if value.get(key) not in (None, "", []):
                item = maybe_json(value[key])
                text = " ".join(str(x) for x in item) if isinstance(item, list) else str(item)
                return _one_line(text)
        text = orjson.dumps(value).decode()
    elif isinstance(value, list):
        text = " ".join(str(x) for x in value)
    else:
        text = "" if value is None else str(value)
    return _one_line(text)


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= INPUT_SUMMARY_CHARS else text[: INPUT_SUMMARY_CHARS - 1] + "…"


def files_in(value: Any) -> list[str]:
    """File paths named in tool arguments (file_path, path, ... and apply_patch headers)."""
    value = maybe_json(value)
    found: list[str] = []
    if isinstance(value, dict):
        for key in FILE_KEYS:
            item = maybe_json(value.get(key))
            if isinstance(item, str) and item and "\n" not in item and len(item) < 1024:
                found.append(strip_file_uri(item))
        for key in ("paths", "files", "file_paths"):
            items = value.get(key)
            if isinstance(items, list):
                found.extend(strip_file_uri(i) for i in items if isinstance(i, str))
        for key in ("input", "patch", "content"):
            item = value.get(key)
            if isinstance(item, str) and "*** " in item:
                found.extend(PATCH_FILE.findall(item))
    elif isinstance(value, str) and "*** " in value:
        found.extend(PATCH_FILE.findall(value))
    return list(dict.fromkeys(f.strip() for f in found if f.strip()))


def strip_file_uri(path: str) -> str:
    return path[len("file://"):] if path.startswith("file://") else path


def tool_call(name: str, arguments: Any, call_id: str | None = None, is_error: bool | None = None) -> dict[str, Any]:
    return {"id": call_id, "name": name or "unknown", "input": summarize_input(arguments), "is_error": is_error}


def exit_code_error(text: str) -> bool | None:
    """True/False from an "Exit Code: N" line in shell output (Gemini CLI), None when absent."""
    match = EXIT_CODE.search(text)
    return None if match is None else int(match.group(1)) != 0


def remember_call(extra: dict[str, Any], call_id: Any, name: str) -> None:
    if not call_id or not isinstance(call_id, str):
        return
    names: dict[str, str] = extra.setdefault("calls", {})
    names[call_id] = name
    if len(names) > KEEP_CALL_NAMES:
        for old in list(names)[: len(names) - KEEP_CALL_NAMES]:
            del names[old]


def answer_call(extra: dict[str, Any], call_id: Any) -> str:
    """The name of the call a tool result answers, which is then forgotten: a call is answered
    once, so a file's saved context keeps only the calls still waiting for their result (at
    20,000 sessions, every answered call kept took the positions file from 12 to 22 MB and the
    process that holds it from 58 to 144 MB)."""
    names: dict[str, str] = extra.get("calls", {})
    if not isinstance(call_id, str) or call_id not in names:
        return ""
    name = names.pop(call_id)
    if not names:
        del extra["calls"]
    return name


def record_hash(*parts: Any) -> str:
    """A stable key for records without an id of their own (equal replays hash equal)."""
    return xxhash.xxh3_128_hexdigest(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS))
