"""`ctx hooks install|uninstall|status` (wire agent tools' session hooks) and `ctx hooks session-start|session-end`
(what those hooks run: print the hand-off brief in the tool's output shape; ingest the finished session at once).

The hook commands fail open: a tool's session must start even when ctx cannot answer, so they exit 0 and say why
on stderr. With the service up, the thin client forwards them over the socket (no heavy imports here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxlake.errors import CtxError, InputError
from ctxlake.schemas.roots import CTX_DIR, _refuse_broad, find_root, git_toplevel, resolve_root

hooks_app = typer.Typer(help="Session hooks: hand the last session's brief to the next agent, ingest at session end.",
                        no_args_is_help=True)
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
AllowHomeOpt = Annotated[bool, typer.Option(
    "--allow-home", help="write hooks even when the project is your home folder or a filesystem root")]
ClientOpt = Annotated[str | None, typer.Option("--client", help=(
    "claude, codex, gemini, cursor, copilot, opencode or all (comma-separated); default: claude plus the tools "
    "whose folder the project already has"))]
# Knowledge shown after the brief: the newest current records, each one line.
KNOWLEDGE_LINES = 6
BRIEF_BUDGET = 1200
# A Stop hook fires after every turn (Codex, Cursor): one ingest start per this many seconds is enough.
DEBOUNCE_S = 5.0
INGEST_LOG = "hooks-ingest.log"


def _root(path: Path | None) -> Path:
    if path is not None:
        return resolve_root(path, for_write=False)
    cwd = Path.cwd()
    return find_root(cwd) or git_toplevel(cwd) or cwd.resolve()


def _write_root(path: Path | None, allow_home: bool) -> Path:
    """The project whose hook files install/uninstall change: the same refusal as `ctx init` and `ctx run index`
    of the home folder (whose `.claude/settings.json` is the user-wide one), a filesystem root, a system folder
    or ctxlake's own data folder."""
    root = _root(path)
    try:
        return _refuse_broad(root, allow_home)
    except InputError as exc:
        why = exc.message.removeprefix(f"refusing to index {root}: ")
        can_allow = "--allow-home" in (exc.hint or "")
        raise InputError(f"refusing to change hook files in {root}: {why}",
                         hint="run it in a project folder" + (", or add --allow-home if you really mean it"
                                                              if can_allow else "")) from exc


def _render(changes: list[Any], as_json: bool, root: Path) -> None:
    from ctxlake.serve.agents.hook_files import HOOK_CLIENTS

    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"root": str(root), "changes": [c.as_dict() for c in changes]})
        return
    for c in changes:
        label = HOOK_CLIENTS[c.client].label if c.client in HOOK_CLIENTS else c.client
        typer.echo(f"{label}: {c.action} {c.path}" + (f" ({c.detail})" if c.detail else ""))


def _apply_each(names: list[str], change: Callable[[str], list[Any]], as_json: bool, root: Path) -> None:
    """Change every client's files, then show what changed; a file that needs a hand edit does not stop
    the others, and the first one decides the exit code (3)."""
    from ctxlake.serve.agents import hook_files

    changes: list[Any] = []
    problems: list[hook_files.UnmergeableFile] = []
    for name in names:
        try:
            changes.extend(change(name))
        except hook_files.UnmergeableFile as exc:
            problems.append(exc)
            # Listed too, so that --json readers see the file left alone and what to paste into it.
            changes.append(hook_files.HookChange(name, exc.path, "skipped", exc.message, paste=exc.paste))
    _render(changes, as_json, root)
    if problems:
        for extra in problems[1:]:
            typer.echo(f"ctx: error: {extra}\n  {extra.hint}", err=True)
        raise problems[0]


@hooks_app.command("install")
def install(
    client: ClientOpt = None,
    path: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
    as_json: JsonOpt = False,
    allow_home: AllowHomeOpt = False,
) -> None:
    """Add ctx's session-start (hand-off brief) and session-end (ingest) hooks to each tool's project files."""
    from ctxlake.serve.agents import hook_files

    root = _write_root(path, allow_home)
    names = hook_files.parse_hook_clients(client, root)
    _apply_each(names, lambda name: hook_files.install(name, root), as_json, root)
    if not as_json:
        typer.echo("Start a new session in the tool to see the brief; `ctx hooks status` shows what is wired.")


@hooks_app.command("uninstall")
def uninstall(
    client: ClientOpt = None,
    path: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
    as_json: JsonOpt = False,
    allow_home: AllowHomeOpt = False,
) -> None:
    """Remove only ctx's hook entries (and its instruction-file section); everything else stays."""
    from ctxlake.serve.agents import hook_files

    root = _write_root(path, allow_home)
    names = hook_files.parse_hook_clients(client or "all", root)
    staying = [n for n in hook_files.HOOK_CLIENTS if n not in names and hook_files.status(n, root).action != "missing"]

    def remove(name: str) -> list[Any]:
        spec = hook_files.HOOK_CLIENTS[name]
        shared = any(hook_files.HOOK_CLIENTS[s].instructions == spec.instructions for s in staying)
        return hook_files.uninstall(name, root, shared_instructions=shared)

    _apply_each(names, remove, as_json, root)


@hooks_app.command("status")
def status(
    client: ClientOpt = None,
    path: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Which tools have ctx's session hooks in this project."""
    from ctxlake.serve.agents import hook_files

    root = _root(path)
    _render([hook_files.status(n, root) for n in hook_files.parse_hook_clients(client or "all", root)], as_json, root)


# -- what the hooks run --------------------------------------------------------------------------


def context_text(root: Path, budget: int = BRIEF_BUDGET) -> str:
    """The hand-off brief of the latest session plus the newest knowledge lines; "" when there is nothing yet."""
    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api.context_search import project_knowledge
    from ctxlake.serve.api.handoff import build_brief
    from ctxlake.serve.api.memory_lake import MemoryLake

    lake = MemoryLake(load_settings(root))
    parts: list[str] = []
    try:
        parts.append(build_brief(lake, budget=budget).text)
    except CtxError as exc:
        print(f"ctx hooks: no hand-off brief ({exc})", file=sys.stderr)
    try:
        found = project_knowledge(lake, limit=KNOWLEDGE_LINES)
    except CtxError:
        records = []
    else:
        records = found.records
        for warning in found.warnings:
            print(f"ctx hooks: {warning}", file=sys.stderr)
    if records:
        lines = [f"- [{k.type}] {k.title}" + (f": {' '.join(k.body.split())[:160]}" if k.body else "") for k in records]
        parts.append("## Project knowledge (newest; `ctx knowledge` for all)\n" + "\n".join(lines))
    if not parts:
        return ""
    return "\n\n".join(parts) + "\n\n(From ctx: `ctx handoff` or the handoff_brief MCP tool gives this again.)"


def shaped(client: str, text: str) -> str:
    """The context in the output shape the tool reads from a session-start hook."""
    if client in ("claude", "codex", "gemini"):
        return json.dumps({"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": text}})
    if client == "cursor":
        return json.dumps({"additional_context": text})
    return text


@hooks_app.command("session-start")
def session_start(
    client: Annotated[str, typer.Option("--client", help="the tool running the hook (sets the output shape)")] = "plain",
    path: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
    budget: Annotated[int, typer.Option("--budget", help="most tokens in the brief part (chars/4)")] = BRIEF_BUDGET,
) -> None:
    """Print the hand-off brief and recent knowledge as session context (run by the tools' start hooks)."""
    try:
        text = context_text(_root(path), budget)
    except Exception as exc:  # fail open: the agent's session must start anyway
        print(f"ctx hooks session-start: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        text = ""
    out = shaped(client, text)
    if out:
        typer.echo(out)


def start_ingest(root: Path, tool: str | None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes] | None:
    """Start `ctx run ingest --no-embed` for this project in the background (detached); None when debounced."""
    lake = root / CTX_DIR / "lake"
    lake.mkdir(parents=True, exist_ok=True)
    stamp = lake / "hooks-ingest.stamp"
    now = time.time()
    try:
        if now - stamp.stat().st_mtime < DEBOUNCE_S:
            return None
    except OSError:
        pass
    stamp.touch()
    # In a process of its own, not forwarded to the service: the service answers one CLI request at a time, and
    # a long ingest there would hold up the next tool's session-start hook.
    argv = [sys.executable, "-c", "from ctxlake.serve.cli import main; main()",
            "run", "ingest", "--no-embed", "--wait", "120"]
    if tool:
        argv += ["--tool", tool]
    with open(lake / INGEST_LOG, "ab") as log:
        log.write(f"\n== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv[3:])}\n".encode())
        log.flush()
        return subprocess.Popen(argv, cwd=root, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True)


@hooks_app.command("session-end")
def session_end(
    client: Annotated[str, typer.Option("--client", help="the tool whose session ended (only its logs are read)")] = "all",
    path: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
) -> None:
    """Ingest the session that just ended, in the background, so the next tool's brief sees it."""
    from ctxlake.serve.agents.hook_files import HOOK_CLIENTS

    if client in ("claude", "codex", "gemini", "cursor", "copilot"):
        typer.echo("{}")  # these read a JSON answer on stdout (Gemini CLI warns on anything else); no decision in it
    try:
        root = _root(path)
        if not (root / CTX_DIR).is_dir():
            print(f"ctx hooks session-end: {root} has no {CTX_DIR}/ (run `ctx init`); nothing ingested", file=sys.stderr)
            return
        proc = start_ingest(root, client if client in HOOK_CLIENTS else None)
        if proc is None:
            print("ctx hooks session-end: an ingest started moments ago; skipped", file=sys.stderr)
        else:
            print(f"ctx hooks session-end: ingest started (pid {proc.pid}; log {root / CTX_DIR / 'lake' / INGEST_LOG})",
                  file=sys.stderr)
    except Exception as exc:  # fail open
        print(f"ctx hooks session-end: {exc.__class__.__name__}: {exc}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.add_typer(hooks_app, name="hooks")
