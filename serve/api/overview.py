"""Read side for the dashboard faces: per-tool ingestion (SESSIONS, MESSAGES), the effective settings
with where each value came from, and a project's headline (status + sources); used by the web UI."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from ctxlake.schemas.config import SECTIONS, Settings, _env_layer, read_project_config
from ctxlake.schemas.roots import CONFIG_FILE, CTX_DIR, default_home
from ctxlake.serve.api.index_status import memory_malformed

if TYPE_CHECKING:
    from ctxlake.serve.api.memory_lake import MemoryLake

MASK = "•••• (set, hidden)"
# A key that names a secret: the last word(s) of its name (api_key, llm_api_key, token, password), never a
# word inside it, so max_tokens, prompt_tokens and secret_files (a policy, not a secret) are shown.
SECRET_KEY = re.compile(r"(?:^|_)(?:key|token|secret|password|passwd|credentials?)$")


class ToolIngestion(BaseModel):
    """Conversation ingestion of one agent tool."""

    tool: str
    sessions: int = 0
    messages: int = 0
    last_message: str | None = Field(None, description="newest message time (UTC, ISO 8601)")
    malformed: dict[str, int] = Field(default_factory=dict, description="malformed records / skipped files by reason")


class Ingestion(BaseModel):
    tools: list[ToolIngestion]
    last_ingest: str | None = Field(None, description="when `ctx run ingest` (or its schedule) last finished")
    ingested: bool = False


class ConfigValue(BaseModel):
    section: str
    key: str
    value: Any
    origin: str = Field(description="flag | env | file | default")
    detail: str = Field("", description="the variable or file that set it")
    description: str = ""
    hidden: bool = Field(False, description="a secret: value is MASK when it is set, None when not")


def tool_ingestion(lake: MemoryLake) -> Ingestion:
    """Sessions, messages, newest message and malformed records per agent tool (all projects)."""
    import pyarrow.compute as pc

    malformed = memory_malformed(lake.settings.memory_dir)
    state = lake.state
    last = (state.last_run or {}).get("finished_at") if state is not None else None
    if lake.messages is None or lake.sessions is None:
        tools = [ToolIngestion(tool=t, malformed=m) for t, m in sorted(malformed.items())]
        return Ingestion(tools=tools, last_ingest=str(last) if last else None)
    sessions = lake.sessions.search().select(["tool"]).limit(None).to_arrow()
    messages = lake.messages.search().select(["tool", "timestamp"]).limit(None).to_arrow()
    per: dict[str, ToolIngestion] = {}
    for item in pc.value_counts(sessions.column("tool")).to_pylist():
        per.setdefault(item["values"], ToolIngestion(tool=item["values"])).sessions = int(item["counts"])
    if messages.num_rows:
        grouped = messages.group_by("tool").aggregate([("timestamp", "count"), ("timestamp", "max")]).to_pylist()
        for g in grouped:
            info = per.setdefault(g["tool"], ToolIngestion(tool=g["tool"]))
            info.messages = int(g["timestamp_count"])
            newest = g["timestamp_max"]
            info.last_message = newest.isoformat(timespec="seconds") if newest is not None else None
    for tool, counts in malformed.items():
        per.setdefault(tool, ToolIngestion(tool=tool)).malformed = counts
    return Ingestion(tools=sorted(per.values(), key=lambda t: (-t.messages, t.tool)),
                     last_ingest=str(last) if last else None, ingested=True)


def _secret(section: type, key: str) -> bool:
    info = section.model_fields[key]  # type: ignore[attr-defined]
    return bool(info.exclude) or bool(SECRET_KEY.search(key))


def effective_settings(settings: Settings, env: Mapping[str, str] | None = None,
                       flags: Mapping[str, Mapping[str, Any]] | None = None) -> list[ConfigValue]:
    """Every setting's value now and where it came from: flag > env (CTX_*) > .ctx/config.toml > default.

    The layers are read the way load_settings reads them; secret values are never shown.
    """
    environ = dict(os.environ if env is None else env)
    from_file = read_project_config(settings.root, default_home(environ))
    from_env = _env_layer(environ)
    config_path = (settings.root / CTX_DIR / CONFIG_FILE)
    out: list[ConfigValue] = []
    for name, section in SECTIONS.items():
        current = getattr(settings, name)
        for key, info in section.model_fields.items():
            if (flags or {}).get(name, {}).get(key) is not None:
                origin, detail = "flag", ""
            elif key in from_env.get(name, {}):
                origin, detail = "env", f"CTX_{name.upper()}_{key.upper()}"
            elif isinstance(from_file.get(name), dict) and key in from_file[name]:
                origin, detail = "file", _display(config_path)
            else:
                origin, detail = "default", ""
            value = getattr(current, key)
            hidden = _secret(section, key)
            if hidden:
                value = MASK if value else None
            elif isinstance(value, Path):
                value = str(value)
            elif hasattr(value, "model_dump"):
                value = value.model_dump()
            out.append(ConfigValue(section=name, key=key, value=value, origin=origin, detail=detail,
                                   description=info.description or "", hidden=hidden))
    return out


def _display(path: Path) -> str:
    home = Path.home()
    return "~/" + path.relative_to(home).as_posix() if path.is_relative_to(home) else str(path)
