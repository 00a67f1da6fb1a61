"""Subagent stage: question + sources + search hits -> a sandbox (empty MCP configs, linked sources, prompt.md) -> an agent's answer; the sandbox is removed after."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from ctxlake.errors import AgentError, InputError
from ctxlake.schemas.config import AgentsSettings
from ctxlake.schemas.sources import NAME_RE
from ctxlake.tasks.stage import stage
from ctxlake.tasks.tokens import CHARS_PER_TOKEN, estimate_tokens

SANDBOX_PREFIX = "ctx-"
MARKER_FILE = ".ctx-agent-sandbox"  # only folders holding it are ever swept
SWEEP_AFTER_S = 24 * 3600
PROMPT_FILE = "prompt.md"
MCP_CONFIG_FILE = "mcp-config.json"
LINKS_DIR = "sources"
_NO_SERVERS: dict[str, Any] = {"mcpServers": {}}
# Every place a known agent looks for project MCP servers, written empty so that the agent
# cannot call back into ctxlake (and spawn agents of its own) or any other server.
EMPTY_MCP_CONFIGS: dict[str, dict[str, Any]] = {
    ".mcp.json": _NO_SERVERS,  # Claude Code, project scope
    ".gemini/settings.json": _NO_SERVERS,  # Gemini CLI
    ".cursor/mcp.json": _NO_SERVERS,  # Cursor
    "opencode.json": {"$schema": "https://opencode.ai/config.json", "mcp": {}},  # opencode
    MCP_CONFIG_FILE: _NO_SERVERS,  # handed over with {mcp_config} (claude --mcp-config ...)
}
PLACEHOLDERS = ("{prompt_file}", "{mcp_config}")
KILL_GRACE_S = 3.0
# What an agent's process gets of ours: what a shell and a Node/Python CLI need, the agents' own
# configuration and keys, proxies and CA bundles; never the rest (cloud keys, tokens for other
# services). [agents] pass_env adds names or globs (AWS_* for Claude Code on Bedrock, say).
AGENT_ENV: tuple[str, ...] = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "COLORTERM", "NO_COLOR", "TZ", "TMPDIR",
    "LANG", "LANGUAGE", "LC_*", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
    "XDG_STATE_HOME", "XDG_RUNTIME_DIR",
    "ANTHROPIC_*", "CLAUDE_*", "DISABLE_*",  # Claude Code (DISABLE_TELEMETRY, DISABLE_AUTOUPDATER ...)
    "OPENAI_*", "CODEX_*",  # Codex CLI
    "GEMINI_*", "GOOGLE_*", "CLOUDSDK_*",  # Gemini CLI (API key, or Vertex: project, location, ADC file)
    "OPENCODE_*",  # opencode (its provider keys: add them with pass_env)
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
)


class SourceLink(NamedTuple):
    """A source to link into the sandbox (validated by the caller: the name is a known source)."""

    name: str
    type: str
    origin: str
    version: str | None  # resolved sha, page digest, or none for local folders
    root: Path


class PromptHit(NamedTuple):
    source: str
    path: str
    start_line: int
    end_line: int
    symbol: str | None
    text: str


@dataclass
class AgentRun:
    """One `ctx ask`: what ran, what it printed (capped), and how it ended."""

    agent: str
    argv: list[str]
    exit_code: int | None
    stdout: str
    stderr: str
    stdout_dropped: int = 0  # bytes over the cap, not kept
    stderr_dropped: int = 0
    timed_out: bool = False
    seconds: float = 0.0
    prompt_tokens: int = 0
    hits_in_prompt: int = 0
    swept: int = 0  # leftover sandboxes older than a day removed before this run
    sources: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- the sandbox -----------------------------------------------------------------------------------


def sandbox_parent(agents: AgentsSettings) -> Path:
    return agents.sandbox_dir or Path(tempfile.gettempdir())


def sweep_leftovers(parent: Path, max_age_s: float = SWEEP_AFTER_S) -> int:
    """Remove sandboxes left by killed runs (older than `max_age_s`); only folders we marked."""
    removed = 0
    cutoff = time.time() - max_age_s
    try:
        candidates = list(parent.glob(f"{SANDBOX_PREFIX}*"))
    except OSError:
        return 0
    for folder in candidates:
        marker = folder / MARKER_FILE
        try:
            if folder.is_symlink() or not marker.is_file() or marker.stat().st_mtime > cutoff:
                continue
        except OSError:
            continue
        shutil.rmtree(folder, ignore_errors=True)  # links inside are unlinked, never followed
        removed += 1
    return removed


def make_sandbox(parent: Path, links: Sequence[SourceLink]) -> Path:
    """A fresh `<parent>/ctx-<uuid>/` with empty MCP configs and ./sources/<name> links."""
    for link in links:
        if not NAME_RE.match(link.name):
            raise InputError(f"invalid source name {link.name!r}")
        if not link.root.is_dir():
            raise InputError(f"source {link.name!r} has no folder at {link.root}",
                             hint=f"run `ctx update {link.name}`")
    parent.mkdir(parents=True, exist_ok=True)
    sandbox = parent / f"{SANDBOX_PREFIX}{uuid.uuid4().hex}"
    sandbox.mkdir(mode=0o700)
    try:
        (sandbox / MARKER_FILE).write_text(f"{os.getpid()}\n", encoding="utf-8")
        for rel, body in EMPTY_MCP_CONFIGS.items():
            path = sandbox / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
        (sandbox / LINKS_DIR).mkdir()
        for link in links:
            os.symlink(link.root.resolve(), sandbox / LINKS_DIR / link.name, target_is_directory=True)
    except BaseException:
        shutil.rmtree(sandbox, ignore_errors=True)
        raise
    return sandbox


# --- the prompt ------------------------------------------------------------------------------------


def _fence(text: str) -> str:
    ticks = 3
    while "`" * ticks in text:
        ticks += 1
    return "`" * ticks


def build_prompt(question: str, links: Sequence[SourceLink], hits: Sequence[PromptHit],
                 budget_tokens: int) -> tuple[str, int]:
    """(prompt.md text, hits included): question, source listing, then hits while the budget lasts."""
    parts = []
    if question:
        parts += ["# Question", "", question.strip(), ""]
    parts += [
        "# Sources", "",
        f"Each source is linked under ./{LINKS_DIR}/<name>/ in this folder. Read the files there to "
        "answer; cite paths as <name>/<path>:<line>. The links lead to the real folders (a user's "
        "project among them): do not create, change or delete anything under them.", "",
        "| name | type | origin | version |", "|---|---|---|---|",
    ]
    parts += [f"| {s.name} | {s.type} | {s.origin} | {s.version or '-'} |" for s in links]
    text = "\n".join(parts) + "\n"
    if not hits:
        return text, 0
    text += "\n# Search hits\n\nThe index's best matches for the question, best first:\n"
    left = budget_tokens - estimate_tokens(text)
    used = 0
    for i, hit in enumerate(hits, start=1):
        title = f"\n## {i}. {hit.source}/{hit.path}:{hit.start_line}-{hit.end_line}"
        title += f" ({hit.symbol})\n\n" if hit.symbol else "\n\n"
        body = hit.text.rstrip("\n")
        cost = estimate_tokens(title + body) + 4
        if cost > left:
            room = (left - estimate_tokens(title) - 4) * CHARS_PER_TOKEN
            if room < 400:  # a stub of a hit helps no one; stop here
                break
            body = body[:room].rsplit("\n", 1)[0] + "\n…"
        fence = _fence(body)
        block = f"{title}{fence}\n{body}\n{fence}\n"
        text += block
        left -= estimate_tokens(block)
        used += 1
        if left <= 0:
            break
    return text, used


# --- running the agent -------------------------------------------------------------------------------


def agent_env(environ: Mapping[str, str] | None, extra: Sequence[str] = ()) -> dict[str, str]:
    """The part of `environ` (None: this process's environment) an agent gets: names matching
    AGENT_ENV or `extra` (exact or glob). `ask` and `chat` both pass what they were given here."""
    patterns = (*AGENT_ENV, *extra)
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}


def agent_command(templates: dict[str, str], agent: str, sandbox: Path) -> list[str]:
    """The argv of `agent`'s template with {prompt_file} and {mcp_config} filled in; its binary must be on PATH."""
    if agent not in templates:
        raise InputError(f"unknown agent {agent!r}", hint=f"known: {', '.join(sorted(templates))}; "
                         "add one under [agents.commands] in .ctx/config.toml (a project's commands run only "
                         "once `ctx trust` accepted the file)")
    try:
        argv = shlex.split(templates[agent])
    except ValueError as exc:
        raise InputError(f"cannot parse the command of agent {agent!r}: {exc}") from exc
    if not argv:
        raise InputError(f"agent {agent!r} has an empty command")
    values = {"{prompt_file}": str(sandbox / PROMPT_FILE), "{mcp_config}": str(sandbox / MCP_CONFIG_FILE)}
    for key, value in values.items():
        argv = [arg.replace(key, value) for arg in argv]
    exe = shutil.which(argv[0])
    if exe is None:
        raise AgentError(f"agent {agent!r} runs `{argv[0]}`, which is not on PATH",
                         hint=f"install it, or change [agents.commands] {agent} in .ctx/config.toml")
    return [exe, *argv[1:]]


def _drain(stream: IO[bytes], cap: int, kept: list[bytes], dropped: list[int]) -> None:
    size = 0
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        take = chunk[: max(cap - size, 0)]
        if take:
            kept.append(take)
            size += len(take)
        dropped[0] += len(chunk) - len(take)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """End the agent's whole process group (it runs in its own session, and may have started
    tools or left background jobs), whether or not the agent itself has exited: TERM, a grace
    for the agent to finish, then KILL for whatever of the group is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)  # at once when it had exited already
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=KILL_GRACE_S)


def run_captured(argv: list[str], cwd: Path, timeout_s: float, cap: int,
                 env: Mapping[str, str] | None = None) -> AgentRun:
    """Run `argv` in `cwd` without a terminal, with `env` only; stdout/stderr kept up to `cap`
    bytes each; whatever it left running in its process group is ended when it returns."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env=None if env is None else dict(env))
    assert proc.stdout is not None and proc.stderr is not None
    out: list[bytes] = []
    err: list[bytes] = []
    out_dropped, err_dropped = [0], [0]
    readers = [threading.Thread(target=_drain, args=(proc.stdout, cap, out, out_dropped), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, cap, err, err_dropped), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        # Also after a normal exit: a background job (`cmd &`) would outlive the run, holding
        # the sandbox, the pipes and whatever it was doing.
        _stop(proc)
        for reader in readers:
            reader.join(timeout=5)
    return AgentRun(
        agent="", argv=argv, exit_code=proc.returncode,
        stdout=b"".join(out).decode("utf-8", errors="replace"),
        stderr=b"".join(err).decode("utf-8", errors="replace"),
        stdout_dropped=out_dropped[0], stderr_dropped=err_dropped[0], timed_out=timed_out,
        seconds=round(time.perf_counter() - started, 3),
    )


@stage("ask-agent")
def ask_agent(question: str, links: Sequence[SourceLink], hits: Sequence[PromptHit],
              agents: AgentsSettings, agent: str | None = None, timeout_s: float | None = None,
              environ: Mapping[str, str] | None = None) -> AgentRun:
    """Question + sources + hits -> the agent's captured answer, run in a sandbox removed after;
    the agent sees `agent_env(environ)` (default: this process's environment) only."""
    if not question.strip():
        raise InputError("empty question")
    name = agent or agents.default_agent
    parent = sandbox_parent(agents)
    swept = sweep_leftovers(parent)
    sandbox = make_sandbox(parent, links)
    try:
        argv = agent_command(agents.commands, name, sandbox)
        prompt, used = build_prompt(question, links, hits, agents.prompt_tokens)
        (sandbox / PROMPT_FILE).write_text(prompt, encoding="utf-8")
        run = run_captured(argv, sandbox, float(timeout_s or agents.timeout_s), agents.max_output_bytes,
                           agent_env(environ, agents.pass_env))
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
    run.agent, run.swept, run.sources = name, swept, [s.name for s in links]
    run.prompt_tokens, run.hits_in_prompt = estimate_tokens(prompt), used
    if run.timed_out:
        raise AgentError(f"agent {name!r} did not answer within {timeout_s or agents.timeout_s:.0f} s",
                         hint="pass --timeout, or raise [agents] timeout_s")
    return run


def chat_agent(links: Sequence[SourceLink], agents: AgentsSettings, agent: str | None = None,
               environ: Mapping[str, str] | None = None) -> int:
    """Sources -> an interactive agent session in the terminal, in a sandbox removed after; its exit code."""
    name = agent or agents.default_agent
    parent = sandbox_parent(agents)
    sweep_leftovers(parent)
    sandbox = make_sandbox(parent, links)
    try:
        argv = agent_command(agents.chat_commands, name, sandbox)
        prompt, _ = build_prompt("", links, [], agents.prompt_tokens)
        (sandbox / PROMPT_FILE).write_text(prompt, encoding="utf-8")
        # In the terminal's process group (it reads the keyboard), so its background jobs are not
        # ended here; the environment is filtered as for `ask`.
        proc = subprocess.Popen(argv, cwd=sandbox, env=agent_env(environ, agents.pass_env))
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:
                continue  # the agent got the same Ctrl-C from the terminal: it decides whether to quit
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)
