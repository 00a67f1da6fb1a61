"""Client registration for `ctx init`: merge the `ctx serve` entry into each MCP client's config file, never clobbering.

Project files, meant to be committed, hold no path of this machine when the client has a portable form: the
command is `ctx` when that is on PATH (this installation), and the project is the client's working folder or its
workspace variable. Claude Code `.mcp.json`, Cursor `.cursor/mcp.json` and Gemini CLI `.gemini/settings.json`
(`mcpServers`), VS Code / GitHub Copilot `.vscode/mcp.json` (`servers`, `${workspaceFolder}`), OpenCode
`opencode.json` (`mcp`, a local command array) and Codex `.codex/config.toml` (`[mcp_servers.ctx]`, read in
trusted projects). User-wide files are written only when named, after showing the change: Codex
`$CODEX_HOME/config.toml`, Copilot CLI `~/.copilot/mcp-config.json`, Antigravity
`~/.gemini/antigravity/mcp_config.json`. Formats checked against each tool's documentation on 2026-11-25.
"""

from __future__ import annotations

import difflib
import errno
import json
import os
import re
import shutil
import stat
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ctxlake.errors import InputError
from ctxlake.tasks import safe_io
from ctxlake.tasks.lake import write_atomic

SERVER_NAME = "ctx"
# Where each project client keeps its servers: file, key holding them, display name.
PROJECT_CLIENTS: dict[str, tuple[str, str, str]] = {
    "claude": (".mcp.json", "mcpServers", "Claude Code"),
    "cursor": (".cursor/mcp.json", "mcpServers", "Cursor"),
    "gemini": (".gemini/settings.json", "mcpServers", "Gemini CLI"),
    "vscode": (".vscode/mcp.json", "servers", "VS Code / GitHub Copilot"),
    "opencode": ("opencode.json", "mcp", "OpenCode"),
}
# TOML project file (tomlkit keeps its comments and formatting).
CODEX_PROJECT_FILE = ".codex/config.toml"
# User-wide files: (display name, key holding the servers); paths from user_config_path().
USER_CLIENTS: dict[str, tuple[str, str]] = {
    "codex-user": ("Codex (user-wide)", "mcp_servers"),
    "copilot-cli": ("GitHub Copilot CLI (user-wide)", "mcpServers"),
    "antigravity": ("Antigravity (user-wide)", "mcpServers"),
}
ALIASES = {"copilot": ["vscode", "copilot-cli"]}
CLIENTS = (*PROJECT_CLIENTS, "codex", *USER_CLIENTS)
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
    paste: str = ""  # the entry to add by hand when the file could not be merged safely

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def ctx_command(env: dict[str, str] | None = None) -> list[str]:
    """How clients start this installation's `ctx` (without a shell): plain `ctx` when PATH finds this very
    installation (portable: nothing of this machine in a committed file), else its absolute path."""
    source = os.environ if env is None else env
    beside = Path(sys.executable).parent / "ctx"
    found = shutil.which("ctx", path=source.get("PATH"))
    if beside.is_file() and os.access(beside, os.X_OK):
        if found and Path(found).resolve() == beside.resolve():
            return ["ctx"]
        return [str(beside)]
    if found:
        return ["ctx"]
    return [str(Path(sys.executable)), "-c", "from ctxlake.serve.cli import main; main()"]


def carried_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """Settings the server must see as the user set them: CTX_HOME (where the lakes' user data lives)."""
    source = os.environ if env is None else env
    return {"CTX_HOME": source["CTX_HOME"]} if source.get("CTX_HOME") else {}


def server_entry(client: str, root: Path | None, command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The `ctx serve` entry in the shape `client` reads. Project files name no folder (the client starts the
    server in the project, or passes its workspace variable); `root` pins one only for Antigravity's user file."""
    extra = carried_env(env)
    if client in ("cursor", "vscode"):
        entry: dict[str, Any] = {"type": "stdio", "command": command[0],
                                 "args": [*command[1:], "serve", "--root", "${workspaceFolder}"]}
        return {**entry, "env": extra} if extra else entry
    if client in ("claude", "gemini", "codex", "codex-user", "copilot-cli", "antigravity"):
        args = [*command[1:], "serve", *(["--root", str(root)] if client == "antigravity" and root else [])]
        entry = {"type": "stdio", "command": command[0], "args": args} if client == "claude" else \
            {"type": "local", "command": command[0], "args": args, "tools": ["*"]} if client == "copilot-cli" else \
            {"command": command[0], "args": args}
        if client in ("codex", "codex-user"):
            entry["startup_timeout_sec"] = CODEX_STARTUP_TIMEOUT_S
        return {**entry, "env": extra} if extra else entry
    if client == "opencode":
        entry = {"type": "local", "command": [*command, "serve"], "enabled": True}
        return {**entry, "environment": extra} if extra else entry
    raise InputError(f"unknown client {client!r}", hint=f"one of: {', '.join(CLIENTS)}, copilot, all")


def _present(root: Path, client: str) -> bool:
    """Whether the project already uses a client: its folder (or, for root-level files, the file) exists."""
    if client == "codex":
        return (root / ".codex").is_dir()
    file = PROJECT_CLIENTS[client][0]
    return (root / file).exists() if "/" not in file else (root / file).parent.is_dir()


def parse_clients(value: str | None, root: Path) -> list[str]:
    """`--client` as a list: names, comma-separated, `copilot` (VS Code + Copilot CLI) or `all` (every project
    client; user-wide files only by name). Without the flag: Claude Code plus every client the project uses."""
    if value is None:
        found = [name for name in (*PROJECT_CLIENTS, "codex") if name != "claude" and _present(root, name)]
        return ["claude", *found]
    names: list[str] = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        wanted = [*PROJECT_CLIENTS, "codex"] if name == "all" else ALIASES.get(name, [name])
        for one in wanted:
            if one not in CLIENTS:
                raise InputError(f"unknown client {raw.strip()!r}", hint=f"one of: {', '.join(CLIENTS)}, copilot, all")
            if one not in names:
                names.append(one)
    if not names:
        raise InputError("--client is empty", hint=f"one of: {', '.join(CLIENTS)}, copilot, all")
    return names


# Far above any tool's config file; a bound on what a cloned project's file can make us read.
MAX_CONFIG_BYTES = 4 << 20


def read_config(path: Path, errors: str = "strict") -> str:
    """A tool's file in the project as UTF-8 text. OSError for a FIFO, device or folder (a clone can
    hold one where `.mcp.json` is expected: opening a FIFO blocks, a device never ends) or a file over
    MAX_CONFIG_BYTES; UnicodeDecodeError for bytes that are not UTF-8 when errors is "strict"."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    try:
        data = safe_io.read_fd(fd, path.name, MAX_CONFIG_BYTES)
    except safe_io.TooLarge as exc:
        raise OSError(errno.EFBIG, exc.message, str(path)) from exc
    return data.decode("utf-8", errors)


def read_json_object(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(data, problem): the file's JSON object, or why it cannot be merged safely."""
    if not path.exists():
        return {}, ""
    try:
        text = read_config(path)
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"cannot read it ({exc})"
    if not text.strip():
        return {}, ""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        # VS Code, Gemini and OpenCode accept comments (JSONC); rewriting would drop them, so we do not.
        return None, f"it is not plain JSON (comments?): {exc.msg.removesuffix(' at')} at line {exc.lineno}"
    if not isinstance(data, dict):
        return None, "its top level is not a JSON object"
    return data, ""


def registered_file(root: Path, client: str) -> str | None:
    """The project file that registers ctx's server for `client` (a PROJECT_CLIENTS name or codex), or
    None: no entry there, a file that cannot be read or parsed (it is not merged either), or one that leads out
    of the project through a symlink (not read)."""
    if safe_io.link_out(root, CODEX_PROJECT_FILE if client == "codex" else PROJECT_CLIENTS[client][0]):
        return None
    if client == "codex":
        import tomllib

        try:
            servers = tomllib.loads(read_config(root / CODEX_PROJECT_FILE)).get("mcp_servers")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        return CODEX_PROJECT_FILE if isinstance(servers, dict) and SERVER_NAME in servers else None
    file, key, _ = PROJECT_CLIENTS[client]
    data, _problem = read_json_object(root / file)
    servers = (data or {}).get(key)
    return file if isinstance(servers, dict) and SERVER_NAME in servers else None


def json_plan(client: str, path: Path, key: str, entry: dict[str, Any]) -> tuple[dict[str, Any] | None, Change | None]:
    """(merged data to write, None) or (None, the Change saying why not / that nothing changes)."""
    data, problem = read_json_object(path)
    if data is None or not isinstance(data.get(key, {}), dict):
        problem = problem or f"its {key!r} is not an object"
        snippet = json.dumps({key: {SERVER_NAME: entry}}, indent=2)
        return None, Change(client, str(path), "skipped", f"{problem}; add this by hand:\n{snippet}", paste=snippet)
    if client == "opencode" and not data:
        data = {"$schema": "https://opencode.ai/config.json"}
    servers = data.setdefault(key, {})
    current = servers.get(SERVER_NAME)
    if current == entry:
        return None, Change(client, str(path), "unchanged", "already registered")
    if current is not None and not is_ctx_entry(current):
        # Another tool's server under the same name: replacing it would break that tool without a word.
        snippet = json.dumps({key: {SERVER_NAME: entry}}, indent=2)
        return None, Change(client, str(path), "skipped",
                            f"its {key}.{SERVER_NAME} is another server ({_command_of(current)}); rename or remove "
                            f"it, or add this by hand:\n{snippet}", paste=snippet)
    servers[SERVER_NAME] = entry
    return data, None


def _words(entry: Any) -> list[str]:
    """A server entry's command and arguments: `command` + `args`, or OpenCode's one `command` array."""
    if not isinstance(entry, dict):
        return []
    command, args = entry.get("command"), entry.get("args")
    words = [*(command if isinstance(command, list) else [command]), *(args if isinstance(args, list) else [])]
    return [w for w in words if isinstance(w, str)]


def _command_of(entry: Any) -> str:
    return " ".join(_words(entry))[:120] or json.dumps(entry)[:80]


def is_ctx_entry(entry: Any) -> bool:
    """Whether a `ctx` server entry starts some ctxlake `ctx serve` (an earlier `ctx init`'s, maybe with another
    path or shape, which init refreshes), not another tool that took the same name."""
    words = _words(entry)
    return "serve" in words and (Path(words[0]).name == "ctx" or any("ctxlake" in w for w in words))


@dataclass(frozen=True)
class JsonLayout:
    """How a JSON file is laid out, so that a rewrite changes only the lines whose entries changed."""

    indent: str | None = "  "  # one level; None: the whole document on one line
    separators: tuple[str, str] = (",", ": ")
    ensure_ascii: bool = False  # the file spells non-ASCII characters as \u escapes
    newline: str = "\n"
    final_newline: bool = True

    def dumps(self, data: Any) -> str:
        text = json.dumps(data, indent=self.indent, separators=self.separators, ensure_ascii=self.ensure_ascii)
        if self.newline != "\n":
            text = text.replace("\n", self.newline)  # json.dumps escapes newlines inside strings: only layout changes
        return text + (self.newline if self.final_newline else "")


def json_layout(path: Path) -> JsonLayout:
    """The layout of the JSON file at `path`, to write it back in: a user's settings file is often committed, and
    one rewritten in another style shows as a diff of every line. The indent is the leading whitespace of the first
    indented line (tabs or N spaces); a file on one line stays on one line, with `,`/`:` when it had no spaces
    after them (it was written compactly, and the diff stays one line); line endings (LF or CRLF), a final newline
    and \\u escapes are kept as the file had them; a multi-line file without indentation gets 2 spaces. A new,
    empty or unreadable file and a one-line `{}` (nothing of the user's to keep the look of) get 2 spaces and a
    final newline."""
    try:
        text = read_config(path)
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return JsonLayout()
    if not isinstance(data, dict) or not data:
        return JsonLayout()
    body = text.strip()
    newline = "\r\n" if "\r\n" in text else "\n"
    final = text.endswith("\n")
    escapes = text.isascii() and not json.dumps(data, ensure_ascii=False).isascii()
    if "\n" not in body:
        compact = json.dumps(data, separators=(",", ":"), ensure_ascii=escapes) == body
        return JsonLayout(None, (",", ":") if compact else (", ", ": "), escapes, newline, final)
    first = re.search(r"^([ \t]+)\S", text, re.MULTILINE)
    return JsonLayout(first.group(1) if first else "  ", (",", ": "), escapes, newline, final)


def register_project_client(client: str, root: Path, command: list[str], env: dict[str, str] | None = None) -> Change:
    """Merge the ctx entry into one project client's file; other servers and keys stay as they are."""
    if client == "codex":
        return register_codex_project(root, command, env)
    file, key, _ = PROJECT_CLIENTS[client]
    path = root / file
    entry = server_entry(client, root, command, env)
    link = safe_io.link_out(root, file)
    if link:  # not read: ctx would not write there either
        snippet = json.dumps({key: {SERVER_NAME: entry}}, indent=2)
        return Change(client, str(path), "skipped", f"{link}; add this by hand:\n{snippet}", paste=snippet)
    data, done = json_plan(client, path, key, entry)
    if done is not None or data is None:
        assert done is not None
        return done
    problem = safe_io.unsafe_target(root, file) or safe_io.make_parent(path)
    if problem:
        snippet = json.dumps({key: {SERVER_NAME: data[key][SERVER_NAME]}}, indent=2)
        return Change(client, str(path), "skipped", f"{problem}; add this by hand:\n{snippet}", paste=snippet)
    action: Action = "updated" if path.exists() else "created"
    write_atomic(path, json_layout(path).dumps(data))
    others = sorted(k for k in data[key] if k != SERVER_NAME)
    detail = f"server {SERVER_NAME!r}" + (f"; kept {', '.join(others)}" if others else "")
    return Change(client, str(path), action, detail)


def register_codex_project(root: Path, command: list[str], env: dict[str, str] | None = None) -> Change:
    """`[mcp_servers.ctx]` in the project's .codex/config.toml (Codex reads it once the project is trusted)."""
    path = root / CODEX_PROJECT_FILE
    link = safe_io.link_out(root, CODEX_PROJECT_FILE)
    if link:
        snippet = codex_snippet(command, "codex", env)
        return Change("codex", str(path), "skipped", f"{link}; add this by hand:\n{snippet}", paste=snippet)
    try:
        old, new, _ = codex_plan(path, command, "codex", env)
    except ForeignServer as exc:
        return exc.skipped("codex", path)
    if old == new:
        return Change("codex", str(path), "unchanged", "already registered")
    problem = safe_io.unsafe_target(root, CODEX_PROJECT_FILE) or safe_io.make_parent(path)
    if problem:
        snippet = codex_snippet(command, "codex", env)
        return Change("codex", str(path), "skipped", f"{problem}; add this by hand:\n{snippet}", paste=snippet)
    write_atomic(path, new)
    return Change("codex", str(path), "updated" if old else "created",
                  f"[mcp_servers.{SERVER_NAME}]; Codex reads it once you trust the project")


def codex_config_path(env: dict[str, str] | None = None) -> Path:
    source = os.environ if env is None else env
    home = source.get("CODEX_HOME") or str(Path.home() / ".codex")
    return Path(home).expanduser() / "config.toml"


def user_config_path(client: str, env: dict[str, str] | None = None) -> Path:
    """The user-wide file of `client` (Codex honours CODEX_HOME)."""
    if client == "codex-user":
        return codex_config_path(env)
    source = os.environ if env is None else env
    home = Path(source.get("HOME") or Path.home()).expanduser()
    if client == "copilot-cli":
        return home / ".copilot" / "mcp-config.json"
    if client == "antigravity":
        return home / ".gemini" / "antigravity" / "mcp_config.json"
    raise InputError(f"unknown user-wide client {client!r}")


def codex_snippet(command: list[str], client: str = "codex", env: dict[str, str] | None = None) -> str:
    """The `[mcp_servers.ctx]` table as TOML, to paste by hand."""
    import tomlkit

    doc = tomlkit.document()
    servers = tomlkit.table(is_super_table=True)
    servers[SERVER_NAME] = server_entry(client, None, command, env)
    doc["mcp_servers"] = servers
    return tomlkit.dumps(doc).strip()


class ForeignServer(InputError):
    """The `ctx` name in a client's config belongs to another tool's server; `paste` is ours, by hand."""

    def __init__(self, message: str, paste: str) -> None:
        super().__init__(message, hint=f"add this by hand:\n{paste}")
        self.paste = paste

    def skipped(self, client: str, path: Path) -> Change:
        """The Change that reports it: skipped, with the entry to add by hand."""
        return Change(client, str(path), "skipped", f"{self.message}:\n{self.paste}", paste=self.paste)


def codex_plan(path: Path, command: list[str], client: str = "codex-user",
               env: dict[str, str] | None = None) -> tuple[str, str, str]:
    """(old text, new text, unified diff) of registering ctx in a Codex config.toml; formatting,
    comments and other servers are kept (tomlkit round-trips the document)."""
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    try:
        old = read_config(path) if path.exists() else ""
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}", hint="make it a UTF-8 text file, or remove it") from exc
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
    for k, v in server_entry(client, None, command, env).items():
        table[k] = v
    current = servers.get(SERVER_NAME)
    if current is not None and not isinstance(current, dict):
        raise InputError(f"{path}: mcp_servers.{SERVER_NAME} is not a table ({current!r}); not changed",
                         hint=f"remove that line, then run ctx init again, or add this by hand:\n"
                              f"{codex_snippet(command, client, env)}")
    if current is not None and dict(current) == dict(table):
        return old, old, ""
    if current is not None and not is_ctx_entry(dict(current)):
        # Another tool's server under the same name, as json_plan refuses it: replacing it would
        # break that tool without a word.
        raise ForeignServer(f"{path}: its mcp_servers.{SERVER_NAME} is another server ({_command_of(dict(current))}); "
                            "rename or remove it, or add this by hand", paste=codex_snippet(command, client, env))
    servers[SERVER_NAME] = table
    new = tomlkit.dumps(doc)
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=str(path)))
    return old, new, diff


def user_plan(client: str, root: Path, command: list[str], env: dict[str, str] | None = None) -> tuple[Path, str, str, str, Change | None]:
    """(path, old text, new text, diff, a Change when there is nothing to write) for a user-wide client."""
    path = user_config_path(client, env)
    if client == "codex-user":
        try:
            old, new, diff = codex_plan(path, command, client, env)
        except ForeignServer as exc:
            return path, "", "", "", exc.skipped(client, path)
        return path, old, new, diff, (Change(client, str(path), "unchanged", "already registered") if old == new else None)
    key = USER_CLIENTS[client][1]
    data, done = json_plan(client, path, key, server_entry(client, root, command, env))
    if done is not None or data is None:
        assert done is not None
        return path, "", "", "", done
    # json_plan read it once already (a FIFO, folder or non-UTF-8 file there is a skipped change, with the paste).
    old = read_config(path) if path.exists() else ""
    new = json_layout(path).dumps(data)
    diff = "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=str(path), tofile=str(path)))
    return path, old, new, diff, None


def write_user(client: str, path: Path, old: str, new: str) -> Change:
    if old == new:
        return Change(client, str(path), "unchanged", "already registered")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, new)
    detail = f"[mcp_servers.{SERVER_NAME}], startup_timeout_sec = {CODEX_STARTUP_TIMEOUT_S}" \
        if client == "codex-user" else f"server {SERVER_NAME!r}"
    return Change(client, str(path), "updated" if old else "created", detail)


def ensure_gitignored(root: Path) -> Change:
    """`.ctx/lake/` in the project's .gitignore (the lake is rebuilt by `ctx run index`)."""
    path = root / ".gitignore"
    link = safe_io.link_out(root, ".gitignore")
    if link:
        return Change("git", str(path), "skipped", f"{link}; add {GITIGNORE_LINE} by hand", paste=GITIGNORE_LINE)
    try:
        # read_config, not read_text: a FIFO there (a clone can hold one) would block the read forever.
        text = read_config(path) if path.exists() or path.is_symlink() else ""
    except (OSError, UnicodeDecodeError) as exc:
        return Change("git", str(path), "skipped", f"cannot read it ({exc}); add {GITIGNORE_LINE} by hand",
                      paste=GITIGNORE_LINE)
    covered = {".ctx", ".ctx/", "/.ctx", "/.ctx/", ".ctx/lake", ".ctx/lake/", "/.ctx/lake", "/.ctx/lake/"}
    if any(line.strip() in covered for line in text.splitlines()):
        return Change("git", str(path), "unchanged", "the lake is already ignored")
    problem = safe_io.unsafe_target(root, ".gitignore")
    if problem:
        return Change("git", str(path), "skipped", f"{problem}; add {GITIGNORE_LINE} by hand", paste=GITIGNORE_LINE)
    sep = "" if not text or text.endswith("\n") else "\n"
    write_atomic(path, f"{text}{sep}# ctxlake's index, rebuilt by `ctx run index`\n{GITIGNORE_LINE}\n")
    return Change("git", str(path), "updated" if text else "created", f"added {GITIGNORE_LINE}")
