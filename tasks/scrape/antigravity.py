"""Scraper for Antigravity: step transcripts (*.jsonl) and brain artifacts (*.md) under ~/.gemini/antigravity -> Msg rows."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ctxlake.tasks.scrape.base import (
    FileState,
    Fingerprint,
    Msg,
    ScrapeOutput,
    at_byte,
    json_lines,
    mtime_ts,
    read_document,
    scrape_each,
    stat_fingerprint,
    walk_files,
)
from ctxlake.tasks.scrape.fields import (
    dicts,
    files_in,
    label,
    maybe_json,
    parse_ts,
    string,
    strip_file_uri,
    tool_call,
)
from ctxlake.tasks.scrape.safe_read import decode_text

USER_REQUEST = re.compile(r"<USER_REQUEST>\s*(.*?)\s*</USER_REQUEST>", re.S)
FILE_URI = re.compile(r"file://(/[^\s`'\")\]]+)")
MD_LINK = re.compile(r"\]\((/[^)\s]+)\)")
# Steps that are bookkeeping or text the agent injected, not conversation.
IGNORED_STEPS = frozenset({"CONVERSATION_HISTORY", "SYSTEM_MESSAGE", "EPHEMERAL_MESSAGE", "USER_SETTINGS_CHANGE"})
ERROR_STATUS = frozenset({"ERROR", "FAILED", "CANCELED", "CANCELLED"})
GENERIC_NAMES = frozenset({"steps", "transcript", "conversation", "trajectory"})


class AntigravityScraper:
    """A transcript is one JSONL line per agent step (user input, planner response, each tool
    step); a step is keyed by its index in the session. Brain artifacts (task lists, plans,
    walkthroughs in markdown) are kept as one row each and replaced when edited."""

    name: ClassVar[str] = "antigravity"
    tool: ClassVar[str] = "antigravity"
    mutable: ClassVar[bool] = True

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".gemini" / "antigravity"]

    def store_files(self, root: Path) -> list[Path]:
        return walk_files(root, (".jsonl", ".md"))

    def fingerprint(self, path: Path) -> Fingerprint | None:
        return stat_fingerprint(path)

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        scrape_each(files, state, out, self._read)

    def _read(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        if path.suffix == ".md":
            self._artifact(path, pos, out)
        else:
            self._steps(path, pos, out)

    def _artifact(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        data = read_document(path, pos, out.limits)
        if data is None:
            return
        out.counts.records += 1
        text = decode_text(data)
        session = path.parent.name
        files = list(dict.fromkeys(MD_LINK.findall(text) + FILE_URI.findall(text)))
        out.emit(Msg(tool=self.tool, session_id=session, timestamp=mtime_ts(path), seq=0, role="system",
                     kind="artifact", text=text, key=f"artifact:{path.name}", scope=session,
                     source_file=str(path), files=files))

    def _steps(self, path: Path, pos: FileState, out: ScrapeOutput) -> None:
        session = path.parent.name if path.stem in GENERIC_NAMES else path.stem
        for offset, step in json_lines(path, pos, out):
            stype = label(step.get("type"))
            source = string(step.get("source"))
            where = at_byte(path, offset)
            if stype in IGNORED_STEPS:
                out.ignored()
                continue
            if source == "SYSTEM" and stype != "CHECKPOINT":
                out.unknown(stype)
                continue
            ts = parse_ts(step.get("created_at"))
            if ts is None:
                out.malformed("bad timestamp", where)
                continue
            index = step.get("step_index")
            base: dict[str, Any] = dict(tool=self.tool, session_id=session, timestamp=ts, seq=offset, scope=session,
                        key=f"{index}@{step.get('created_at')}", source_file=str(path))
            content = string(step.get("content"))
            if stype == "USER_INPUT":
                match = USER_REQUEST.search(content)
                out.emit(Msg(role="user", kind="text", text=match.group(1) if match else content, **base))
            elif stype == "PLANNER_RESPONSE":
                calls = dicts(step.get("tool_calls"))
                if not content and not calls:
                    out.ignored()  # thinking only
                    continue
                out.emit(Msg(role="assistant", kind="tool_call" if calls and not content else "text", text=content,
                             tool_calls=[tool_call(str(c.get("name") or "unknown"), _args(c.get("args"))) for c in calls],
                             files=[f for c in calls for f in files_in(_args(c.get("args")))], **base))
            elif stype == "CHECKPOINT":
                out.emit(Msg(role="system", kind="compaction", text=content or "checkpoint", **base))
            else:  # a tool step: LIST_DIRECTORY, VIEW_FILE, RUN_COMMAND, CODE_ACTION, SEARCH_WEB ...
                status = str(step.get("status") or "")
                out.emit(Msg(role="tool", kind="tool_result", text=content,
                             tool_calls=[{"id": str(index), "name": stype.lower(), "input": "",
                                          "is_error": status in ERROR_STATUS if status else None}],
                             files=list(dict.fromkeys(strip_file_uri(f) for f in FILE_URI.findall(content))), **base))


def _args(args: Any) -> Any:
    # Antigravity JSON-encodes each argument value ("\"/tmp/repo\"").
    if isinstance(args, dict):
        return {k: maybe_json(v) for k, v in args.items()}
    return args
