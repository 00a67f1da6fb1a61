"""Client registration for `ctx init`: merge the `ctx serve` entry into each MCP client's config file, never clobbering.

Project files (committed with the project, absolute paths as the clients require):
Claude Code `.mcp.json`, Cursor `.cursor/mcp.json`, Gemini CLI `.gemini/settings.json` (all under
`mcpServers`), VS Code `.vscode/mcp.json` (under `servers`). Codex keeps one user-wide file,
`$CODEX_HOME/config.toml` (default ~/.codex), written only on request and after showing the change.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ctxlake.errors import InputError
from ctxlake.tasks.lake import write_atomic

SERVER_NAME = "ctx"
# Where each project client keeps its servers: file, key holding them, display name.
PROJECT_CLIENTS: dict[str, tuple[str, str, str]] = {
    "claude": (".mcp.json", "mcpServers", "Claude Code"),
    "cursor": (".cursor/mcp.json", "mcpServers", "Cursor"),
    "gemini": (".gemini/settings.json", "mcpServers", "Gemini CLI"),
    "vscode": (".vscode/mcp.json", "servers", "VS Code"),
}
CLIENTS = (*PROJECT_CLIENTS, "codex")
# Codex's default start-up wait is 10 s; a cold start that also opens a big lake deserves more.
CODEX_STARTUP_TIMEOUT_S = 30
GITIGNORE_LINE = ".ctx/lake/"

Action = Literal["created", "updated", "unchanged", "skipped"]


@dataclass
class Change:
    client: str
    path: str
    action: Action
    detail: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def ctx_command() -> list[str]:
    """The absolute command that starts this installation's `ctx` (clients launch it without a shell)."""
    beside = Path(sys.executable).parent / "ctx"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    found = shutil.which("ctx")
    if found:
        return [str(Path(found).resolve())]
    return [str(Path(sys.executable)), "-c", "from ctxlake.serve.cli import main; main()"]


def server_entry(client: str, root: Path | None, command: list[str]) -> dict[str, Any]:
    """The `ctx serve` entry in the shape `client` reads. `root` pins the project (project files);
    None serves whichever project the client was started in (Codex's one user-wide file)."""
    args = [*command[1:], "serve", *(["--root", str(root)] if root is not None else [])]
    if client in ("claude", "cursor", "vscode"):
        return {"type": "stdio", "command": command[0], "args": args}
    if client == "gemini":
        return {"command": command[0], "args": args, "cwd": str(root)}
    if client == "codex":
        return {"command": command[0], "args": args, "startup_timeout_sec": CODEX_STARTUP_TIMEOUT_S}
    raise InputError(f"unknown client {client!r}", hint=f"one of: {', '.join(CLIENTS)}, all")


def parse_clients(value: str | None, root: Path) -> list[str]:
    """`--client` as a list: names, comma-separated, or `all` (the project clients; Codex only by
    name). Without the flag: Claude Code plus every client whose project folder already exists."""
    if value is None:
        found = [name for name, (file, _, _) in PROJECT_CLIENTS.items()
                 if name != "claude" and (root / file).parent.is_dir()]
        return ["claude", *found]
    names: list[str] = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            names.extend(n for n in PROJECT_CLIENTS if n not in names)
        elif name in CLIENTS:
            if name not in names:
                names.append(name)
        else:
            raise InputError(f"unknown client {raw.strip()!r}", hint=f"one of: {', '.join(CLIENTS)}, all")
    if not names:
        raise InputError("--client is empty", hint=f"one of: {', '.join(CLIENTS)}, all")
    return names


def _read_json(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(data, problem): the file's JSON object, or why it cannot be merged safely."""
    if not path.exists():
        return {}, ""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read it ({exc})"
    if not text.strip():
        return {}, ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # VS Code and Gemini accept comments (JSONC); rewriting would drop them, so we do not.
        return None, f"it is not plain JSON (comments?): {exc.msg} at line {exc.lineno}"
    if not isinstance(data, dict):
        return None, "its top level is not a JSON object"
    return data, ""


def register_project_client(client: str, root: Path, command: list[str]) -> Change:
    """Merge the ctx entry into one project client's file; other servers and keys stay as they are."""
    file, key, _ = PROJECT_CLIENTS[client]
    path = root / file
    entry = server_entry(client, root, command)
    data, problem = _read_json(path)
    if data is None or not isinstance(data.get(key, {}), dict):
        problem = problem or f"its {key!r} is not an object"
        snippet = json.dumps({key: {SERVER_NAME: entry}}, indent=2)
        return Change(client, str(path), "skipped", f"{problem}; add this by hand:\n{snippet}")
    servers = data.setdefault(key, {})
    if servers.get(SERVER_NAME) == entry:
        return Change(client, str(path), "unchanged", "already registered")
    action: Action = "updated" if SERVER_NAME in servers or path.exists() else "created"
    servers[SERVER_NAME] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    others = sorted(k for k in servers if k != SERVER_NAME)
    detail = f"server {SERVER_NAME!r}" + (f"; kept {', '.join(others)}" if others else "")
    return Change(client, str(path), action, detail)


def codex_config_path(env: dict[str, str] | None = None) -> Path:
    source = os.environ if env is None else env
    home = source.get("CODEX_HOME") or str(Path.home() / ".codex")
    return Path(home).expanduser() / "config.toml"


def codex_plan(path: Path, command: list[str]) -> tuple[str, str, str]:
    """(old text, new text, unified diff) of registering ctx in Codex's config.toml; formatting,
    comments and other servers are kept (tomlkit round-trips the document)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    old = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        doc = tomlkit.parse(old)
    except TOMLKitError as exc:
        raise InputError(f"cannot parse {path}: {exc}", hint="fix the file, then run ctx init --client codex again") from exc
    servers = doc.get("mcp_servers")
    if servers is None:
        servers = tomlkit.table(is_super_table=True)
        doc["mcp_servers"] = servers
    elif not isinstance(servers, dict):
        raise InputError(f"{path}: mcp_servers is not a table")
    table = tomlkit.table()
    for k, v in server_entry("codex", None, command).items():
        table[k] = v
    servers[SERVER_NAME] = table
    new = tomlkit.dumps(doc)
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=str(path)))
    return old, new, diff


def write_codex(path: Path, old: str, new: str) -> Change:
    if old == new:
        return Change("codex", str(path), "unchanged", "already registered")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new)
    return Change("codex", str(path), "updated" if old else "created",
                  f"[mcp_servers.{SERVER_NAME}], startup_timeout_sec = {CODEX_STARTUP_TIMEOUT_S}")


def ensure_gitignored(root: Path) -> Change:
    """`.ctx/lake/` in the project's .gitignore (the lake is rebuilt by `ctx run index`)."""
    path = root / ".gitignore"
    try:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        return Change("git", str(path), "skipped", f"cannot read it ({exc}); add {GITIGNORE_LINE} by hand")
    covered = {".ctx", ".ctx/", "/.ctx", "/.ctx/", ".ctx/lake", ".ctx/lake/", "/.ctx/lake", "/.ctx/lake/"}
    if any(line.strip() in covered for line in text.splitlines()):
        return Change("git", str(path), "unchanged", "the lake is already ignored")
    sep = "" if not text or text.endswith("\n") else "\n"
    write_atomic(path, f"{text}{sep}# ctxlake's index, rebuilt by `ctx run index`\n{GITIGNORE_LINE}\n")
    return Change("git", str(path), "updated" if text else "created", f"added {GITIGNORE_LINE}")
