"""Conversation memory opened for reading (MESSAGES, SESSIONS, KNOWLEDGE): MemoryLake, the tables' columns, and the time and scope filters every memory query uses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ctxlake.errors import InputError, NotIndexedError
from ctxlake.schemas.config import Settings
from ctxlake.serve.api.handles import memo_schema
from ctxlake.tasks.lake import IndexState, connect, open_table
from ctxlake.tasks.memory_state import MANIFEST_FILE, PROJECTS_FILE, read_project_paths
from ctxlake.tasks.memory_store import KNOWLEDGE_TABLE, MESSAGES_TABLE, SESSIONS_TABLE
from ctxlake.tasks.sessionize import scope_filter
from ctxlake.tasks.store import sql_str

if TYPE_CHECKING:
    from lancedb.table import Table

    from ctxlake.tasks.embedder_base import Embedder

READ_CONSISTENCY = timedelta(seconds=1)
KNOWLEDGE_KINDS = ("decision", "error", "insight")
SESSION_COLUMNS = ["id", "tool", "title", "project_path", "started_at", "ended_at", "n_messages", "decisions",
                   "open_tasks", "errors", "files", "commits", "tokens_in", "tokens_out", "llm_summary", "text"]
MESSAGE_COLUMNS = ["id", "tool", "session_id", "timestamp", "seq", "role", "kind", "text", "tool_calls", "files",
                   "agent", "source_file"]
KNOWLEDGE_COLUMNS = ["id", "type", "title", "body", "created_at", "supersedes", "superseded_by", "source_tool",
                     "source_session", "files", "tags", "path", "text"]
RELATIVE = re.compile(r"^(\d+)\s*([dhm])$")


class MemoryLake:
    """Conversation memory opened for reading: the user-wide lake and this project's knowledge table.

    Rows are scoped to the project (its folder and below) unless `all_projects` is asked for.
    """

    def __init__(self, settings: Settings, load_embedder: Callable[[], Embedder] | None = None) -> None:
        self.settings = settings
        # How the model is had when a query first needs it (a long-lived reader passes its shared one).
        self._load_embedder = load_embedder
        self.state = IndexState.read(settings.memory_dir)
        self.messages: Table | None = None
        self.sessions: Table | None = None
        if self.state is not None:
            db = connect(settings.memory_dir, read_consistency=READ_CONSISTENCY)
            self.messages = memo_schema(open_table(db, MESSAGES_TABLE))
            self.sessions = memo_schema(open_table(db, SESSIONS_TABLE))
        self.knowledge: Table | None = None
        self.knowledge_model = ""
        if settings.lake_dir.is_dir():
            kdb = connect(settings.lake_dir, read_consistency=READ_CONSISTENCY)
            self.knowledge = memo_schema(open_table(kdb, KNOWLEDGE_TABLE))
            try:
                self.knowledge_model = json.loads((settings.lake_dir / MANIFEST_FILE).read_text(encoding="utf-8")).get("model_id", "")
            except (OSError, ValueError):
                self.knowledge_model = ""
        self._embedder: Embedder | None = None
        self._scope: tuple[int | None, str] | None = None

    def require_memory(self) -> tuple[Table, Table]:
        if self.messages is None or self.sessions is None:
            raise NotIndexedError("no agent conversations ingested yet", hint="run `ctx run ingest`")
        return self.messages, self.sessions

    def embedder(self) -> Embedder:
        if self._embedder is None:
            if self._load_embedder is not None:
                self._embedder = self._load_embedder()
            else:
                from ctxlake.tasks.embedders import make_embedder

                self._embedder = make_embedder(self.settings.embed, self.settings.models_dir)
        return self._embedder

    def scope(self, all_projects: bool) -> str | None:
        """SQL: this project's rows (None: every project's)."""
        if all_projects:
            return None
        # The record of project paths changes only when an ingest meets a new folder.
        path = self.settings.memory_dir / PROJECTS_FILE
        try:
            stamp = path.stat().st_mtime_ns
        except OSError:
            stamp = None
        if self._scope is None or self._scope[0] != stamp:
            paths = read_project_paths(self.settings.memory_dir) if stamp is not None else None
            self._scope = (stamp, scope_filter(self.settings.root, paths))
        return self._scope[1]


# -- filters -------------------------------------------------------------------------------------


def parse_when(value: str | None, name: str) -> datetime | None:
    """An ISO date/time, or a relative age like 7d, 12h, 30m (that long ago)."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    match = RELATIVE.match(text)
    try:
        if match:
            n, unit = int(match.group(1)), match.group(2)
            return datetime.now(UTC) - {"d": timedelta(days=n), "h": timedelta(hours=n), "m": timedelta(minutes=n)}[unit]
        when = datetime.fromisoformat(text)
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except OverflowError:  # an age before year 1 (9999999999d), or a date at its edge moved to UTC
        raise InputError(f"{name}: {value!r} is outside the dates a record can have",
                         hint="e.g. 2025-12-01, 2025-12-01T14:00, 7d, 12h") from None
    except ValueError:
        raise InputError(f"{name}: not a date, time or age: {value!r}", hint="e.g. 2025-12-01, 2025-12-01T14:00, 7d, 12h") from None


def _ts(when: datetime) -> str:
    # isoformat pads the year to 4 digits (strftime's %Y gives '110-05-18', which Lance cannot parse).
    return f"CAST('{when.astimezone(UTC).replace(tzinfo=None).isoformat(timespec='microseconds')}' AS TIMESTAMP)"


def _since(column: str, when: datetime | None) -> str | None:
    return f"{column} >= {_ts(when)}" if when else None


def _until(column: str, when: datetime | None) -> str | None:
    return f"{column} <= {_ts(when)}" if when else None


def _and(*parts: str | None) -> str | None:
    kept = [p for p in parts if p]
    return " AND ".join(f"({p})" for p in kept) or None


def _in(column: str, values: Sequence[str] | None) -> str | None:
    return f"{column} IN ({', '.join(sql_str(v) for v in values)})" if values else None


def _trim(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
