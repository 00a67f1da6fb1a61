"""Session-hook wiring for `ctx hooks install|uninstall|status`: merge ctx's entries into each agent tool's hook file.

Formats checked against each tool's documentation on 2026-11-25 (README, "Session hooks", has the sources):
Claude Code `.claude/settings.json`, Codex `.codex/hooks.json` and Gemini CLI `.gemini/settings.json` share the
event -> [{matcher, hooks: [{type: command, command}]}] shape; Cursor `.cursor/hooks.json` and Copilot
`.github/hooks/*.json` are `{version: 1, hooks: {event: [{command | bash}]}}`; OpenCode loads JS plugins from
`.opencode/plugins/`. Tools whose start hook cannot add context also get a marked section in their instruction
file telling the agent to call the hand-off tool first. Only entries whose command runs `ctx hooks ...` are ours.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from ctxlake.errors import ConfigError, InputError
from ctxlake.serve.agents.clients import json_layout, read_config, read_json_object
from ctxlake.tasks.lake import remove_empty_folders, write_atomic
from ctxlake.tasks.safe_io import link_out, make_parent, unsafe_target

Style = Literal["nested", "cursor", "copilot", "plugin"]


@dataclass(frozen=True)
class HookClient:
    name: str
    label: str
    file: str  # relative to the project root
    style: Style
    start_event: str | None  # None: the tool's start hook cannot add context
    end_event: str
    instructions: str | None = None  # instruction file that gets the "call the hand-off tool first" section
    start_matcher: str | None = None
    timeout_key: str = "timeout"
    timeout_scale: int = 1  # Gemini counts milliseconds, the others seconds


HOOK_CLIENTS: dict[str, HookClient] = {
    "claude": HookClient("claude", "Claude Code", ".claude/settings.json", "nested", "SessionStart", "SessionEnd",
                         start_matcher="startup|resume|clear|compact"),
    "codex": HookClient("codex", "Codex", ".codex/hooks.json", "nested", "SessionStart", "Stop",
                        start_matcher="startup|resume|clear"),
    "gemini": HookClient("gemini", "Gemini CLI", ".gemini/settings.json", "nested", "SessionStart", "SessionEnd",
                         start_matcher="*", timeout_scale=1000),
    "cursor": HookClient("cursor", "Cursor", ".cursor/hooks.json", "cursor", "sessionStart", "stop",
                         instructions="AGENTS.md"),
    # Copilot CLI runs sessionStart but discards its output, so the brief comes from the instruction file.
    "copilot": HookClient("copilot", "GitHub Copilot", ".github/hooks/ctx.json", "copilot", None, "sessionEnd",
                          instructions=".github/copilot-instructions.md", timeout_key="timeoutSec"),
    "opencode": HookClient("opencode", "OpenCode", ".opencode/plugins/ctx-hooks.js", "plugin", None, "session.idle",
                           instructions="AGENTS.md"),
}
# What shows a project uses a tool (`.github/` alone does not mean Copilot).
MARKERS: dict[str, tuple[str, ...]] = {
    "codex": (".codex",), "gemini": (".gemini",), "cursor": (".cursor",),
    "copilot": (".github/hooks", ".github/copilot-instructions.md"), "opencode": (".opencode", "opencode.json"),
}
START_TIMEOUT_S = 10
END_TIMEOUT_S = 30
OURS = re.compile(r"\bhooks\s+session-(start|end)\b")
SECTION_START = "<!-- ctx:handoff:start (written by `ctx hooks install`; `ctx hooks uninstall` removes it) -->"
SECTION_END = "<!-- ctx:handoff:end -->"
SECTION_BODY = (
    "## Pick up where the last session stopped\n"
    "Before starting work, call the `handoff_brief` tool of the `ctx` MCP server (or run `ctx handoff`)\n"
    "and read the brief: the goal, files changed, decisions, errors, open tasks and the suggested next step of\n"
    "the latest session in any agent tool. Use `search_context` for anything older.\n"
)
UNDO_HOOKS = "remove the entries that run `ctx hooks session-start|session-end` by hand"
UNDO_SECTION = f"remove the lines from {SECTION_START.split(' (')[0]} to {SECTION_END} by hand"
PLUGIN_MARK = "// ctxlake session hooks (written by `ctx hooks install`; `ctx hooks uninstall` removes this file)"

Action = Literal["created", "updated", "unchanged", "removed", "absent", "installed", "partial", "missing", "skipped"]


@dataclass
class HookChange:
    client: str
    path: str
    action: Action
    detail: str = ""
    paste: str = ""  # the entry to add by hand when the file cannot be merged safely
    events: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class UnmergeableFile(ConfigError):
    """A settings file that cannot be rewritten without losing something (comments, odd shape): exit 3.
    `path` and `paste` (what to add by hand, if anything) let a command list it as a skipped change."""

    def __init__(self, message: str, hint: str | None = None, path: Path | None = None, paste: str = "") -> None:
        super().__init__(message, hint)
        self.path = str(path) if path is not None else ""
        self.paste = paste


def _refuse(path: Path, problem: str, paste: str = "", undo: str = "") -> UnmergeableFile:
    """The error for a file ctx will not change: with the text to paste (install) or what to remove (uninstall)."""
    return UnmergeableFile(f"{problem}; not changed", path=path, paste=paste,
                           hint=("add this by hand:\n" + paste) if paste else undo or None)


def _check_target(root: Path, rel: str, paste: str = "", undo: str = "") -> Path:
    """root / rel when ctx may write it (no symlink on the way, no file where a folder goes), its folder made."""
    path = root / rel
    problem = unsafe_target(root, rel) or make_parent(path)
    if problem:
        raise _refuse(path, problem, paste, undo)
    return path


def _refuse_link_out(root: Path, rel: str, paste: str) -> None:
    """Install reads nothing that leads out of the project: it would not write there either."""
    link = link_out(root, rel)
    if link:
        raise _refuse(root / rel, link, paste)


def _skipped_link_out(client: str, root: Path, rel: str) -> HookChange | None:
    """Uninstall's answer for a file that leads out of the project: not read, and nothing of ctx's can be in it
    that ctx wrote (install never writes through a link)."""
    link = link_out(root, rel)
    return HookChange(client, str(root / rel), "skipped", link) if link else None


def parse_hook_clients(value: str | None, root: Path) -> list[str]:
    """`--client` as a list; `all` or nothing given: every tool whose folder the project has, plus Claude Code."""
    if value is None:
        found = [n for n in HOOK_CLIENTS if n != "claude" and any((root / m).exists() for m in MARKERS[n])]
        return ["claude", *found]
    names: list[str] = []
    for raw in value.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        if name == "all":
            names.extend(n for n in HOOK_CLIENTS if n not in names)
        elif name in HOOK_CLIENTS:
            if name not in names:
                names.append(name)
        else:
            raise InputError(f"unknown client {raw.strip()!r}", hint=f"one of: {', '.join(HOOK_CLIENTS)}, all")
    if not names:
        raise InputError("--client is empty", hint=f"one of: {', '.join(HOOK_CLIENTS)}, all")
    return names


def hook_command(client: str, which: str, env: dict[str, str] | None = None) -> str:
    """The shell command a tool runs: `ctx` when PATH finds this installation (portable: nothing of this machine in
    a committed file), else its absolute path; CTX_HOME carried when the user set it."""
    from ctxlake.serve.agents.clients import carried_env, ctx_command

    exe = " ".join(shlex.quote(part) for part in ctx_command(env))
    prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in carried_env(env).items())
    return f"{prefix}{exe} hooks {which} --client {client}"


def _runs_ctx(entry: Any) -> bool:
    """One hook entry whose command runs `ctx hooks session-start|session-end`."""
    if not isinstance(entry, dict):
        return False
    return any(isinstance(entry.get(key), str) and OURS.search(entry[key]) for key in ("command", "bash"))


def _is_ours(entry: Any) -> bool:
    """An entry that is, or a group that holds, one of ctx's hooks (files are the user's: any shape may be there)."""
    inner = entry.get("hooks") if isinstance(entry, dict) else None
    return _runs_ctx(entry) or (isinstance(inner, list) and any(_runs_ctx(h) for h in inner))


def _without_ours(entries: list[Any]) -> list[Any]:
    """An event's entries less ctx's hooks. In a group (the nested shape) only ctx's inner hooks go: a user may
    have added a hook of their own beside ours; the group goes only when nothing is left in its hooks."""
    kept: list[Any] = []
    for entry in entries:
        if _runs_ctx(entry):
            continue
        inner = entry.get("hooks") if isinstance(entry, dict) else None
        if isinstance(inner, list) and any(_runs_ctx(h) for h in inner):
            rest = [h for h in inner if not _runs_ctx(h)]
            if not rest:
                continue
            entry = {**entry, "hooks": rest}
        kept.append(entry)
    return kept


def _entries(spec: HookClient, env: dict[str, str] | None) -> dict[str, dict[str, Any]]:
    """event -> our entry, in the tool's shape."""
    out: dict[str, dict[str, Any]] = {}
    events = ([("session-start", spec.start_event, START_TIMEOUT_S)] if spec.start_event else []) + \
        [("session-end", spec.end_event, END_TIMEOUT_S)]
    for which, event, timeout in events:
        command = hook_command(spec.name, which, env)
        assert event is not None
        if spec.style == "nested":
            hook: dict[str, Any] = {"type": "command", "command": command, spec.timeout_key: timeout * spec.timeout_scale}
            if spec.name == "gemini":
                hook = {"name": f"ctx-{which}", **hook}
            group: dict[str, Any] = {"hooks": [hook]}
            if which == "session-start" and spec.start_matcher:
                group = {"matcher": spec.start_matcher, **group}
            out[event] = group
        elif spec.style == "cursor":
            out[event] = {"command": command, "timeout": timeout}
        elif spec.style == "copilot":
            out[event] = {"type": "command", "bash": command, "cwd": ".", "timeoutSec": timeout}
    return out


def _hooks_of(data: dict[str, Any], spec: HookClient) -> dict[str, Any] | None:
    hooks = data.get("hooks")
    if hooks is None:
        return {}
    return hooks if isinstance(hooks, dict) else None


def _paste(spec: HookClient, entries: dict[str, dict[str, Any]]) -> str:
    shape: dict[str, Any] = {"hooks": {event: [entry] for event, entry in entries.items()}}
    if spec.style in ("cursor", "copilot"):
        shape = {"version": 1, **shape}
    return json.dumps(shape, indent=2)


def install_json(spec: HookClient, root: Path, env: dict[str, str] | None = None) -> HookChange:
    """Merge our entries into the tool's JSON hook file; other hooks and keys stay as they were."""
    path = root / spec.file
    entries = _entries(spec, env)
    _refuse_link_out(root, spec.file, _paste(spec, entries))
    data, problem = read_json_object(path)
    hooks = _hooks_of(data, spec) if data is not None else None
    if data is None or hooks is None:
        raise _refuse(path, f"{path}: {problem or 'its hooks is not an object'}", _paste(spec, entries))
    before = json.dumps(data, sort_keys=True)
    if spec.style in ("cursor", "copilot"):
        data.setdefault("version", 1)
    for event, entry in entries.items():
        current = hooks.get(event, [])
        if not isinstance(current, list):
            raise _refuse(path, f"{path}: hooks.{event} is not a list", _paste(spec, entries))
        hooks[event] = [*_without_ours(current), entry]
    data["hooks"] = hooks
    if json.dumps(data, sort_keys=True) == before:
        return HookChange(spec.name, str(path), "unchanged", "already installed", events=list(entries))
    _check_target(root, spec.file, _paste(spec, entries))
    action: Action = "updated" if path.exists() else "created"
    write_atomic(path, json_layout(path).dumps(data))
    return HookChange(spec.name, str(path), action, "hooks " + ", ".join(entries), events=list(entries))


def uninstall_json(spec: HookClient, root: Path) -> HookChange:
    """Remove only our entries (and the events or file they leave empty, when we created nothing else)."""
    path = root / spec.file
    if skipped := _skipped_link_out(spec.name, root, spec.file):
        return skipped
    data, problem = read_json_object(path)
    if data is not None and not path.exists():
        return HookChange(spec.name, str(path), "absent", "no hook file")
    hooks = _hooks_of(data, spec) if data is not None else None
    if data is None or hooks is None:
        raise _refuse(path, f"{path}: {problem or 'its hooks is not an object'}", undo=UNDO_HOOKS)
    removed: list[str] = []
    for event in list(hooks):
        current = hooks[event]
        if not isinstance(current, list):
            continue
        kept = _without_ours(current)
        if kept != current:
            removed.append(event)
            if kept:
                hooks[event] = kept
            else:
                del hooks[event]
    if not removed:
        return HookChange(spec.name, str(path), "absent", "no ctx hooks in it")
    if not hooks:
        del data["hooks"]
    _check_target(root, spec.file, undo=UNDO_HOOKS)
    # Nothing left but what install put there ({} or Cursor's and Copilot's {"version": 1}): the file (and a
    # folder it leaves empty) goes, rather than staying behind as a stub; anything else in it is kept.
    if set(data) <= ({"version"} if spec.style in ("cursor", "copilot") else set()):
        path.unlink()
        remove_empty_folders(path.parent, root)
        return HookChange(spec.name, str(path), "removed", "file deleted", events=removed)
    write_atomic(path, json_layout(path).dumps(data))
    return HookChange(spec.name, str(path), "removed", "hooks " + ", ".join(removed), events=removed)


def status_json(spec: HookClient, root: Path) -> HookChange:
    path = root / spec.file
    link = link_out(root, spec.file)
    if link:
        return HookChange(spec.name, str(path), "skipped", link)
    data, problem = read_json_object(path)
    if data is None:  # not "missing": a file it cannot parse (JSONC, say) may well hold the hooks
        return HookChange(spec.name, str(path), "skipped", problem)
    hooks = _hooks_of(data, spec) or {}
    want = list(_entries(spec, None))
    have = [e for e in want if isinstance(hooks.get(e), list) and any(_is_ours(x) for x in hooks[e])]
    action: Action = "installed" if have == want else "partial" if have else "missing"
    return HookChange(spec.name, str(path), action, ", ".join(have) or "not installed", events=have)


# -- OpenCode plugin -----------------------------------------------------------------------------


def plugin_source(env: dict[str, str] | None = None) -> str:
    """A small OpenCode plugin: ingest this session once OpenCode goes idle (Bun's `$` runs the command)."""
    command = hook_command("opencode", "session-end", env)
    return (f"{PLUGIN_MARK}\n"
            "// Ingest the session when OpenCode goes idle, so the next tool's hand-off brief sees it.\n"
            "export const CtxHooks = async ({ $ }) => ({\n"
            "  event: async ({ event }) => {\n"
            "    if (event.type === \"session.idle\") {\n"
            f"      await $`sh -c {json.dumps(command)}`.quiet().nothrow()\n"
            "    }\n"
            "  },\n"
            "})\n")


def install_plugin(spec: HookClient, root: Path, env: dict[str, str] | None = None) -> HookChange:
    path = root / spec.file
    text = plugin_source(env)
    _refuse_link_out(root, spec.file, text)
    if path.exists():
        old = _read_to_merge(path, errors="replace")
        if not old.startswith(PLUGIN_MARK):
            raise UnmergeableFile(f"{path} exists and is not ctx's plugin; not changed",
                                  hint="remove or rename it, or add this plugin by hand:\n" + text)
        if old == text:
            return HookChange(spec.name, str(path), "unchanged", "already installed", events=[spec.end_event])
    _check_target(root, spec.file, text)
    action: Action = "updated" if path.exists() else "created"
    write_atomic(path, text)
    return HookChange(spec.name, str(path), action, f"plugin on {spec.end_event}", events=[spec.end_event])


def uninstall_plugin(spec: HookClient, root: Path) -> HookChange:
    path = root / spec.file
    if skipped := _skipped_link_out(spec.name, root, spec.file):
        return skipped
    if not path.exists():
        return HookChange(spec.name, str(path), "absent", "no plugin")
    if not _read_to_merge(path, errors="replace").startswith(PLUGIN_MARK):
        return HookChange(spec.name, str(path), "absent", "not ctx's plugin; left alone")
    _check_target(root, spec.file, undo=f"delete {path} by hand")
    path.unlink()
    remove_empty_folders(path.parent, root)
    return HookChange(spec.name, str(path), "removed", "plugin deleted", events=[spec.end_event])


def status_plugin(spec: HookClient, root: Path) -> HookChange:
    path = root / spec.file
    link = link_out(root, spec.file)
    if link:
        return HookChange(spec.name, str(path), "skipped", link)
    ok = _text_or_empty(path).startswith(PLUGIN_MARK)
    return HookChange(spec.name, str(path), "installed" if ok else "missing",
                      f"plugin on {spec.end_event}" if ok else "not installed", events=[spec.end_event] if ok else [])


# -- instruction-file section --------------------------------------------------------------------


def _section() -> str:
    return f"{SECTION_START}\n{SECTION_BODY}{SECTION_END}\n"


def install_section(client: str, file: str, root: Path) -> HookChange:
    """Write or refresh our marked section; the rest of the file is kept byte for byte."""
    path = root / file
    _refuse_link_out(root, file, _section())
    old = _read_to_merge(path) if path.exists() else ""
    new = _replace_section(old, _section())
    if new is None:
        raise _refuse(path, f"{path}: {MARKER_PROBLEM}", _section())
    if new == old:
        return HookChange(client, str(path), "unchanged", "hand-off section present")
    _check_target(root, file, _section())
    write_atomic(path, new)
    return HookChange(client, str(path), "updated" if old else "created", "hand-off section")


def uninstall_section(client: str, file: str, root: Path) -> HookChange:
    path = root / file
    if skipped := _skipped_link_out(client, root, file):
        return skipped
    if not path.exists():
        return HookChange(client, str(path), "absent", "no file")
    old = _read_to_merge(path)
    new = _replace_section(old, "")
    if new is None:
        raise _refuse(path, f"{path}: {MARKER_PROBLEM}", undo=UNDO_SECTION)
    if new == old:
        return HookChange(client, str(path), "absent", "no hand-off section")
    _check_target(root, file, undo=UNDO_SECTION)
    if new.strip():
        write_atomic(path, new)
    else:
        path.unlink()
        remove_empty_folders(path.parent, root)
    return HookChange(client, str(path), "removed", "hand-off section")


def _read_to_merge(path: Path, errors: str = "strict") -> str:
    """A file ctx is about to change, as text; UnmergeableFile (exit 3) when it is no regular UTF-8
    file (a FIFO in a clone would block the read forever)."""
    try:
        return read_config(path, errors)
    except (OSError, UnicodeDecodeError) as exc:
        raise UnmergeableFile(f"cannot read {path} ({exc}); not changed",
                              hint="make it a UTF-8 text file, or remove it") from exc


def _text_or_empty(path: Path) -> str:
    """What a status check reads: the file's text, or "" when it is missing or no readable file."""
    try:
        return read_config(path, errors="replace")
    except OSError:
        return ""


MARKER_PROBLEM = "its ctx:handoff start and end markers do not make one section (one missing, repeated or swapped)"


def _replace_section(text: str, section: str) -> str | None:
    """`text` with our section replaced by `section` ("" removes it); None when the markers are not exactly one
    start followed by one end: guessing where the section stops could take the user's own lines with it."""
    starts, ends = text.count(SECTION_START), text.count(SECTION_END)
    start = text.find(SECTION_START)
    if starts == 0 and ends == 0:
        if not section:
            return text
        sep = "" if not text or text.endswith("\n\n") else ("\n" if text.endswith("\n") else "\n\n")
        return f"{text}{sep}{section}"
    if starts != 1 or ends != 1 or text.find(SECTION_END) < start:
        return None
    end = text.find(SECTION_END, start) + len(SECTION_END)
    if end < len(text) and text[end] == "\n":
        end += 1
    head, tail = text[:start], text[end:]
    if not section:
        head = head.rstrip("\n") + ("\n" if head.strip() else "")
        return head + (("\n" + tail) if tail.strip() and head.strip() else tail)
    return head + section + tail


# -- one client ----------------------------------------------------------------------------------


def install(client: str, root: Path, env: dict[str, str] | None = None) -> list[HookChange]:
    spec = HOOK_CLIENTS[client]
    changes = [install_plugin(spec, root, env) if spec.style == "plugin" else install_json(spec, root, env)]
    if spec.instructions:
        changes.append(install_section(client, spec.instructions, root))
    return changes


def uninstall(client: str, root: Path, shared_instructions: bool = False) -> list[HookChange]:
    """`shared_instructions`: another client that stays installed still relies on the same instruction file."""
    spec = HOOK_CLIENTS[client]
    changes = [uninstall_plugin(spec, root) if spec.style == "plugin" else uninstall_json(spec, root)]
    if spec.instructions and not shared_instructions:
        changes.append(uninstall_section(client, spec.instructions, root))
    return changes


def status(client: str, root: Path) -> HookChange:
    """Where a client's hooks stand: installed, partial or missing; skipped when its file leads out of the
    project through a symlink (not read) or cannot be parsed (JSON with comments, say)."""
    spec = HOOK_CLIENTS[client]
    change = status_plugin(spec, root) if spec.style == "plugin" else status_json(spec, root)
    if spec.instructions:
        link = link_out(root, spec.instructions)
        section = (f"not read ({link})" if link
                   else "yes" if SECTION_START in _text_or_empty(root / spec.instructions) else "no")
        change.detail += f"; {spec.instructions} section: {section}"
    return change
