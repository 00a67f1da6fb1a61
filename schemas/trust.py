"""Trust for a project's `.ctx/config.toml`: the settings in it that run commands (or read folders
outside the project) are ignored until the user trusts that exact file content (`ctx trust`), the
way direnv's `allow` works; and for `.ctx/sources.toml`'s sources that read outside the project.

A committed config arrives with `git clone`, so a repository's author would otherwise choose what
runs on the machine of whoever indexes it. The user's own settings (CTX_* environment, CLI flags)
are never gated: they cannot arrive from someone else.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRUST_FILE = "trusted-configs.json"

# section -> keys that run a command or code, or send the user's API key to a chosen endpoint.
# memory.roots and agents.sandbox_dir point reads and writes at folders of the author's choosing
# (a log store is read user-wide; ask/chat copy code into the sandbox folder).
GATED: dict[str, tuple[str, ...]] = {
    "memory": ("llm_command", "llm_url", "roots"),
    "agents": ("commands", "chat_commands", "sandbox_dir", "pass_env"),  # pass_env: hands keys to a process
    "embed": ("trust_remote_code", "base_url"),
    # Connecting to a scheduler ships pickled code and the project's files to it, and runs what it
    # sends back; executor alone is harmless (without an address it means a LocalCluster here).
    "run": ("dask_address",),
    # Starts a long-lived process for the user (watchers, schedules, the web UI on a local port).
    "service": ("autostart",),
}
# memory.llm mode -> the gated key it needs. Without that key the mode falls back to "off", so an
# untrusted `llm = "command"` turns LLM compaction off instead of failing every ingest.
_LLM_NEEDS = {"command": "llm_command", "ollama": "llm_url", "openai": "llm_url"}

_warned: set[tuple[str, str]] = set()


@dataclass
class TrustState:
    """How far a project config is trusted, for `ctx status` and `ctx trust --show`."""

    path: str
    exists: bool
    trusted: bool
    sha256: str = ""
    gated_keys: list[str] = field(default_factory=list)
    # sources.toml entries that read outside the project and are not trusted (filled by the caller)
    untrusted_sources: list[str] = field(default_factory=list)

    @property
    def summary(self) -> str:
        sources = (f"; sources.toml: not reading {', '.join(self.untrusted_sources)} (outside the project; "
                   "`ctx trust` after reviewing it)") if self.untrusted_sources else ""
        if not self.exists:
            return "no project config" + sources
        if self.trusted:
            return "trusted (`ctx trust --revoke` to undo)" + sources
        if not self.gated_keys:
            return "not trusted; sets no command settings" + sources
        return f"not trusted: ignoring {', '.join(self.gated_keys)} (`ctx trust` after reviewing it)" + sources

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "exists": self.exists, "trusted": self.trusted,
                "sha256": self.sha256, "gated_keys": self.gated_keys,
                "untrusted_sources": self.untrusted_sources}


def store_path(home: Path) -> Path:
    return home / TRUST_FILE


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _load(home: Path) -> dict[str, str]:
    try:
        data = json.loads(store_path(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # no store yet, or a damaged one: nothing is trusted
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save(home: Path, entries: dict[str, str]) -> None:
    home.mkdir(parents=True, exist_ok=True)
    target = store_path(home)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, target)  # a crash never leaves a half-written store


def _key(config_path: Path) -> str:
    return str(config_path.resolve())


def gated_keys(data: dict[str, Any]) -> list[str]:
    """The gated `section.key` names a parsed config sets."""
    return [f"{section}.{key}" for section, keys in GATED.items()
            if isinstance(data.get(section), dict) for key in keys if key in data[section]]


def is_trusted(config_path: Path, content: bytes, home: Path) -> bool:
    return _load(home).get(_key(config_path)) == digest(content)


def trust(config_path: Path, home: Path, content: bytes | None = None) -> str:
    """Record the file's content (as read now, or the bytes given) as trusted; returns its sha256."""
    value = digest(config_path.read_bytes() if content is None else content)
    entries = _load(home)
    entries[_key(config_path)] = value
    _save(home, entries)
    return value


def revoke(config_path: Path, home: Path) -> bool:
    """Forget the file; True when it was trusted (at any content)."""
    entries = _load(home)
    if entries.pop(_key(config_path), None) is None:
        return False
    _save(home, entries)
    return True


# .ctx/sources.toml arrives with `git clone` as well. A source that reads this machine outside the
# project (a local folder, a git repository by path or file://) is trusted entry by entry, for its
# exact type and origin: `ctx add` trusts what the user adds, and `ctx trust` every such entry the
# file declares now. A per-file hash would do for config.toml, but here the user's own `ctx add`
# edits the file too, and trusting its new content whole would trust whatever came with the clone.
def _source_key(registry: Path, name: str) -> str:
    return f"{_key(registry)}#{name}"


def _source_digest(kind: str, origin: str) -> str:
    return digest(f"{kind}\0{origin}".encode())


def source_trusted(registry: Path, name: str, kind: str, origin: str, home: Path) -> bool:
    return _load(home).get(_source_key(registry, name)) == _source_digest(kind, origin)


def trust_sources(registry: Path, home: Path, sources: Sequence[tuple[str, str, str]]) -> None:
    """Trust each (name, type, origin) of the sources.toml at `registry`."""
    entries = _load(home)
    entries.update({_source_key(registry, name): _source_digest(kind, origin) for name, kind, origin in sources})
    _save(home, entries)


def revoke_sources(registry: Path, home: Path, name: str | None = None) -> int:
    """Forget one source's trust (or every source's of that file); how many were trusted."""
    entries = _load(home)
    prefix = _source_key(registry, "")
    gone = [k for k in entries if (k == _source_key(registry, name) if name is not None else k.startswith(prefix))]
    for key in gone:
        del entries[key]
    if gone:
        _save(home, entries)
    return len(gone)


def outside_docs(paths: Any, root: Path) -> list[str]:
    """The [docs] paths entries that lead out of the project: absolute, `~`, `..`, or a symlink out."""
    if not isinstance(paths, list):
        return []
    real_root = root.resolve()
    out = []
    for entry in paths:
        try:
            folder = (real_root / Path(str(entry)).expanduser()).resolve()
        except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte: not a folder of the project
            out.append(str(entry))
            continue
        if folder != real_root and real_root not in folder.parents:
            out.append(str(entry))
    return out


def filter_docs_paths(paths: list[str], root: Path, config_path: Path, trusted: bool) -> list[str]:
    """[docs] paths less the folders outside the project, unless they come from a trusted file.

    The docs reader serves whatever these folders hold to any MCP client, so a cloned config (or a
    committed `docs` symlink) must not point it at the user's other folders. Warns once per process.
    """
    outside = [] if trusted else outside_docs(paths, root)
    if not outside:
        return paths
    seen = (str(config_path), "docs:" + "\0".join(outside))
    if seen not in _warned:
        _warned.add(seen)
        sys.stderr.write(f"ctx: warning: ignoring [docs] paths {', '.join(map(repr, outside))}: outside the "
                         f"project, and {config_path} is not trusted (review it, then run `ctx trust`; or set "
                         "CTX_DOCS_PATHS)\n")
    return [p for p in paths if p not in outside]


def state(config_path: Path, data: dict[str, Any], home: Path) -> TrustState:
    if not config_path.is_file():
        return TrustState(path=str(config_path), exists=False, trusted=False)
    content = config_path.read_bytes()
    gated = gated_keys(data)
    docs = data.get("docs")
    if isinstance(docs, dict) and outside_docs(docs.get("paths"), config_path.parent.parent):
        gated.append("docs.paths")
    return TrustState(path=str(config_path), exists=True, trusted=is_trusted(config_path, content, home),
                      sha256=digest(content), gated_keys=gated)


def filter_untrusted(data: dict[str, Any], config_path: Path, content: bytes, home: Path) -> dict[str, Any]:
    """`data` (the parsed project config) without its gated keys unless the content is trusted.

    Warns once per process and file content on stderr, naming the ignored keys.
    """
    names = gated_keys(data)
    if not names or is_trusted(config_path, content, home):
        return data
    out = {name: dict(value) if isinstance(value, dict) else value for name, value in data.items()}
    for section, keys in GATED.items():
        for key in keys:
            if isinstance(out.get(section), dict):
                out[section].pop(key, None)
    memory = out.get("memory")
    if isinstance(memory, dict) and f"memory.{_LLM_NEEDS.get(str(memory.get('llm')), '-')}" in names:
        memory.pop("llm", None)
    seen = (_key(config_path), digest(content))
    if seen not in _warned:
        _warned.add(seen)
        sys.stderr.write(f"ctx: warning: ignoring {', '.join(names)} from {config_path}: the file is not "
                         "trusted (review it, then run `ctx trust`)\n")
    return out
