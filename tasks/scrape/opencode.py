"""Scraper for OpenCode's per-file storage: ~/.local/share/opencode/storage/{session,message,part}/ -> Msg rows."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from ctxlake.tasks.scrape.base import (
    FILE_COUNTS,
    FileState,
    Fingerprint,
    Msg,
    ScrapeOutput,
    SessionMeta,
    counts_of,
    guard,
    loads,
    stat_fingerprint,
    walk_files,
)
from ctxlake.tasks.scrape.fields import (
    dicts,
    files_in,
    items,
    label,
    obj,
    opt_string,
    parse_ts,
    string,
    strip_file_uri,
    text_of,
    tool_call,
)
from ctxlake.tasks.scrape.safe_read import ReadLimits, SkippedFile, read_bounded

IGNORED_PARTS = frozenset({"reasoning", "step-start", "step-finish", "snapshot", "agent", "retry", "subtask"})


def _message_id(path: Path) -> str | None:
    try:
        doc = loads(read_bounded(path, ReadLimits()))
    except (OSError, ValueError, SkippedFile):
        return None
    return doc.get("id") if isinstance(doc, dict) and isinstance(doc.get("id"), str) else None


def _part_files(base: Path, mid: str) -> list[Path]:
    if not mid or "/" in mid or "\0" in mid or len(mid.encode()) > 255 or mid in (".", ".."):
        return []  # an id that cannot be a folder name has no part folder
    return walk_files(base / "part" / mid, (".json",))


def storage_dir(root: Path) -> Path:
    """The folder holding session/ and message/: root itself, root/storage, or one level down."""
    for cand in (root, root / "storage", *(sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])):
        if (cand / "session").is_dir() and (cand / "message").is_dir():
            return cand
    return root / "storage"


class OpenCodeScraper:
    """A message is one JSON file plus one file per part (text, tool call, file, patch); any of
    them changing re-reads the whole message, whose rows are then upserted. The project comes
    from the session file's `directory`."""

    name: ClassVar[str] = "opencode"
    tool: ClassVar[str] = "opencode"
    mutable: ClassVar[bool] = True

    def default_roots(self, user_home: Path) -> list[Path]:
        return [user_home / ".local" / "share" / "opencode" / "storage"]

    def store_files(self, root: Path) -> list[Path]:
        base = storage_dir(root)
        return [p for sub in ("session", "message", "part") for p in walk_files(base / sub, (".json",))]

    def fingerprint(self, path: Path) -> Fingerprint | None:
        return stat_fingerprint(path)

    def scrape(self, root: Path, files: Sequence[Path], state: dict[str, FileState], out: ScrapeOutput) -> None:
        base = storage_dir(root)
        sessions = self._sessions(base, out)
        touched: dict[str, Path] = {}  # message file -> read it with all its parts
        wanted: set[str] = set()  # message ids whose parts changed
        for path in files:
            state.setdefault(str(path), FileState())
            out.counts.files += 1
            kind = path.relative_to(base).parts[0]
            if kind == "message":
                touched[str(path)] = path
            elif kind == "part":
                wanted.add(path.parent.name)
        if wanted:
            # Files are named by message id; a store that names them otherwise is matched by content.
            by_stem = {p.stem: p for p in walk_files(base / "message", (".json",))}
            missing = {mid for mid in wanted if mid not in by_stem}
            for mid in wanted - missing:
                touched[str(by_stem[mid])] = by_stem[mid]
            if missing:
                for path in by_stem.values():
                    if _message_id(path) in missing:
                        touched[str(path)] = path
        for key in sorted(touched):
            pos = state.setdefault(key, FileState())
            out.file_counts = counts_of(pos)
            out.file_counts.clear()  # the message is read whole again: its counts start over
            guard(out, key, self._message, base, touched[key], sessions, out)
            out.file_counts = None
            if not pos.extra.get(FILE_COUNTS):
                pos.extra.pop(FILE_COUNTS, None)

    def _sessions(self, base: Path, out: ScrapeOutput) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for path in walk_files(base / "session", (".json",)):
            try:
                doc = loads(read_bounded(path, out.limits))
            except SkippedFile as exc:
                out.skipped(path, exc.reason)
                continue
            except (OSError, ValueError):
                out.malformed("unreadable session file", str(path))
                continue
            if isinstance(doc, dict) and isinstance(doc.get("id"), str):
                found[doc["id"]] = doc
                title = doc.get("title")
                out.session(SessionMeta(self.tool, doc["id"], project_path=str(doc.get("directory") or ""),
                                        title=title if isinstance(title, str) else "", title_rank=3))
        return found

    def _message(self, base: Path, path: Path, sessions: dict[str, dict[str, Any]], out: ScrapeOutput) -> None:
        out.counts.records += 1
        try:
            m = loads(read_bounded(path, out.limits))
        except SkippedFile as exc:
            out.skipped(path, exc.reason)
            self._orphan_parts(base, path.stem, out)
            return
        except (OSError, ValueError):
            out.malformed("not JSON", str(path))
            self._orphan_parts(base, path.stem, out)
            return
        if not isinstance(m, dict):
            out.malformed("not a JSON object", str(path))
            self._orphan_parts(base, path.stem, out)
            return
        # Older OpenCode versions kept time, session and model under `metadata` and the parts
        # inline (`parts`, with `tool-invocation` parts): read both layouts.
        legacy = obj(m.get("metadata"))
        mid = string(m.get("id")) or path.stem
        sid = string(m.get("sessionID")) or string(legacy.get("sessionID")) or path.parent.name
        time = obj(m.get("time")) or obj(legacy.get("time"))
        ts = parse_ts(time.get("created"))
        role = m.get("role")
        if role not in ("user", "assistant"):
            out.unknown(f"role:{label(role)}")
            self._orphan_parts(base, mid, out)
            return
        if ts is None:
            out.malformed("bad timestamp", str(path))
            self._orphan_parts(base, mid, out)
            return
        session = sessions.get(sid, {})
        project = str(session.get("directory") or (string(m.get("path"))) or "")
        common: dict[str, Any] = dict(tool=self.tool, session_id=sid, source_file=str(path), project_path=project,
                      parent_id=m.get("parentID"))
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        files: list[str] = []
        extra_rows: list[Msg] = []
        inline = items(m.get("parts"))
        out.counts.records += len(inline)
        for _ in range(sum(not isinstance(p, dict) for p in inline)):
            out.malformed("not a JSON object", f"{path}: parts")
        # Parts live under part/<message id>/; when the id inside the file drifted, under the file's name.
        own = self._parts(base, mid, out) if _part_files(base, mid) or mid == path.stem else self._parts(base, path.stem, out)
        for i, part in enumerate(own + dicts(inline)):
            ptype = string(part.get("type"))
            pid = str(part.get("id") or i)
            if ptype == "text":
                if isinstance(part.get("text"), str):
                    texts.append(part["text"])
            elif ptype == "tool":
                st = obj(part.get("state"))
                name = str(part.get("tool") or "unknown")
                calls.append(tool_call(name, st.get("input"), part.get("callID")))
                files += files_in(st.get("input"))
                meta = obj(st.get("metadata"))
                exit_code = meta.get("exit")
                is_error = st.get("status") == "error" or (isinstance(exit_code, int) and exit_code != 0)
                started = parse_ts((st.get("time") or {}).get("start")) if isinstance(st.get("time"), dict) else None
                extra_rows.append(Msg(
                    role="tool", kind="tool_result", text=str(st.get("output") or st.get("error") or ""),
                    timestamp=started or ts, seq=2 * i + 1, key=f"{mid}:{pid}",
                    tool_calls=[{"id": part.get("callID"), "name": name, "input": "", "is_error": is_error}], **common))
            elif ptype == "tool-invocation":  # legacy layout
                inv = obj(part.get("toolInvocation"))
                name = string(inv.get("toolName")) or "unknown"
                calls.append(tool_call(name, inv.get("args"), opt_string(inv.get("toolCallId"))))
                files += files_in(inv.get("args"))
                if "result" in inv:
                    result = inv.get("result")
                    extra_rows.append(Msg(
                        role="tool", kind="tool_result", text=result if isinstance(result, str) else text_of(result),
                        timestamp=ts, seq=2 * i + 1, key=f"{mid}:{pid}",
                        tool_calls=[{"id": opt_string(inv.get("toolCallId")), "name": name, "input": "",
                                     "is_error": None}], **common))
            elif ptype == "file":
                url = part.get("url")
                if isinstance(url, str) and url.startswith("file://"):
                    files.append(strip_file_uri(url))
            elif ptype == "patch":
                files += [f for f in items(part.get("files")) if isinstance(f, str)]
            elif ptype == "compaction":
                extra_rows.append(Msg(role="system", kind="compaction", text="conversation compacted",
                                      timestamp=ts, seq=2 * i + 1, key=f"{mid}:{pid}", **common))
            elif ptype in IGNORED_PARTS:
                out.ignored()
            else:
                out.unknown(f"part:{label(part.get('type'))}")
        tokens = obj(m.get("tokens")) or obj(obj(legacy.get("assistant")).get("tokens"))
        cache = obj(tokens.get("cache"))
        text = "\n".join(t for t in texts if t)
        if role == "user" and not text:
            summary = obj(m.get("summary"))
            text = str(summary.get("body") or "")
        if text or calls or role == "user":
            info = m.get("model")
            model = (m.get("modelID") or (info.get("modelID") if isinstance(info, dict) else None)
                     or obj(legacy.get("assistant")).get("modelID"))
            out.emit(Msg(role=str(role), kind="tool_call" if calls and not text else "text", text=text, timestamp=ts,
                         seq=0, key=mid, tool_calls=calls, files=list(dict.fromkeys(files)),
                         tokens_in=tokens.get("input"), tokens_out=tokens.get("output"), tokens_cached=cache.get("read"),
                         model=model if isinstance(model, str) else None, **common))
        for row in extra_rows:
            out.emit(row)
        error = m.get("error")
        if isinstance(error, dict):
            data = obj(error.get("data"))
            out.emit(Msg(role="system", kind="error", text=f"{error.get('name', 'error')}: {data.get('message', '')}".rstrip(": "),
                         timestamp=ts, seq=10_000, key=f"{mid}:error", **common))

    def _orphan_parts(self, base: Path, mid: str, out: ScrapeOutput) -> None:
        """The part files of a message that could not be read are counted, not silently left."""
        for path in _part_files(base, mid):
            out.counts.records += 1
            out.malformed("part of an unreadable message", str(path))

    def _parts(self, base: Path, mid: str, out: ScrapeOutput) -> list[dict[str, Any]]:
        parts = []
        for path in _part_files(base, mid):
            out.counts.records += 1
            try:
                part = loads(read_bounded(path, out.limits))
            except SkippedFile as exc:
                out.skipped(path, exc.reason)
                continue
            except (OSError, ValueError):
                out.malformed("not JSON", str(path))
                continue
            if isinstance(part, dict):
                parts.append(part)
            else:
                out.malformed("not a JSON object", str(path))
        return parts
