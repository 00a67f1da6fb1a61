"""`ctx init` (register the MCP server with clients) and `ctx serve` (run it over stdio or local HTTP)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ctxlake.errors import InputError
from ctxlake.schemas.config import load_settings
from ctxlake.schemas.roots import CTX_DIR, find_root, git_toplevel, resolve_root

if TYPE_CHECKING:
    from ctxlake.serve.agents.clients import Change


def serve_root(path: Path | None) -> Path:
    """The project `ctx serve` answers for: --root, else the nearest folder with .ctx/, else the
    enclosing git work tree, else the current folder (tools then say it is not indexed yet)."""
    if path is not None:
        return resolve_root(path, for_write=False)
    cwd = Path.cwd()
    return find_root(cwd) or git_toplevel(cwd) or cwd.resolve()


def _log_to_stderr(verbose: bool) -> str:
    import logging

    level = "INFO" if verbose else "WARNING"
    logging.basicConfig(stream=sys.stderr, level=level, format="ctx serve: %(levelname)s %(message)s")
    return level


def serve(
    http: Annotated[bool, typer.Option("--http", help="streamable HTTP on 127.0.0.1 instead of stdio")] = False,
    port: Annotated[int | None, typer.Option("--port", min=1, max=65535, help="HTTP port (default: the mcp.port setting, 8765)")] = None,
    root: Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")] = None,
    allow_index: Annotated[bool, typer.Option("--allow-index", help=(
        "expose index_codebase, which starts `ctx run index` in a separate process"))] = False,
    allow_agents: Annotated[bool, typer.Option("--allow-agents", help=(
        "expose ask_codebase, which runs a CLI agent in a sandbox over the sources"))] = False,
    allow_writes: Annotated[bool, typer.Option("--allow-writes", help=(
        "expose save_decision, save_error_solution and save_insight, which write .ctx/knowledge/ "
        "files (never tables; `ctx run ingest` picks them up)"))] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log requests on stderr")] = False,
) -> None:
    """Run the MCP server: stdio by default (what MCP clients launch), or --http on 127.0.0.1."""
    if port is not None and not http:
        raise InputError("--port needs --http (stdio has no port)")
    project = serve_root(root)
    settings = load_settings(project, {"mcp": {"port": port}} if port is not None else None)
    level = _log_to_stderr(verbose)
    if not (settings.lake_dir / "state.json").is_file():
        typer.echo(f"ctx serve: {project} is not indexed yet; tools will say so until "
                   "`ctx run index` has run there (docs tools work meanwhile).", err=True)
    from ctxlake.serve.mcp.server import ServeOptions, run_http, run_stdio

    options = ServeOptions(allow_index=allow_index, allow_agents=allow_agents, allow_writes=allow_writes,
                           log_level=level)
    if http:
        _check_port_free(settings.mcp.port)
        typer.echo(f"ctx serve: MCP over streamable HTTP at http://127.0.0.1:{settings.mcp.port}/mcp "
                   f"for {project}", err=True)
        run_http(settings, options, settings.mcp.port)
    else:
        run_stdio(settings, options)


def _check_port_free(port: int) -> None:
    """A clear error before the server starts, instead of uvicorn's `[Errno 98]` line after it
    announced its address. MCP clients are configured with the URL, so no other port is taken."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise InputError(f"port {port} on 127.0.0.1 is in use ({exc.strerror})",
                             hint="pass --port N, or set [mcp] port in .ctx/config.toml") from exc


def init(
    path: Annotated[Path | None, typer.Argument(help="project folder (default: this project)")] = None,
    client: Annotated[str | None, typer.Option("--client", help=(
        "claude, cursor, gemini, vscode, opencode, codex (project .codex/config.toml), copilot (VS Code + Copilot "
        "CLI), or the user-wide codex-user, copilot-cli, antigravity; comma-separated, or all (the project files). "
        "Default: claude plus the clients whose folder the project already has"))] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="write user-wide config files without asking")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
) -> None:
    """Register `ctx serve` with MCP clients for this project, and keep the lake out of git."""
    from ctxlake.errors import ConfigError
    from ctxlake.serve.agents import clients
    from ctxlake.serve.cli.base import ensure_project

    root = resolve_root(path, for_write=True)
    created = ensure_project(root)
    names = clients.parse_clients(client, root)
    command = clients.ctx_command()
    changes = [clients.register_project_client(name, root, command) for name in names if name not in clients.USER_CLIENTS]
    changes += [_user_file(name, root, command, yes) for name in names if name in clients.USER_CLIENTS]
    changes.append(clients.ensure_gitignored(root))
    indexed = (root / CTX_DIR / "lake" / "state.json").is_file()
    unmerged = [c for c in changes if c.action == "skipped" and c.paste]
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json({"root": str(root), "created_ctx_dir": created, "command": command,
                    "changes": [c.as_dict() for c in changes], "indexed": indexed})
    else:
        if created:
            typer.echo(f"Created {root / CTX_DIR}/ (config.toml, knowledge/).")
        labels = {name: label for name, (_, _, label) in clients.PROJECT_CLIENTS.items()}
        labels.update({name: label for name, (label, _) in clients.USER_CLIENTS.items()})
        labels.update(codex="Codex (project)", git=".gitignore")
        for change in changes:
            typer.echo(f"{labels.get(change.client, change.client)}: {change.action} {change.path}"
                       + (f" ({change.detail})" if change.detail and change.action != "skipped" else ""))
            if change.action == "skipped":
                typer.echo(f"  not changed: {change.detail}", err=True)
        typer.echo(f"Server command: {' '.join(command)} serve")
        if command[0] != "ctx":
            typer.echo("Note: `ctx` on your PATH is not this installation, so the files name its path on this "
                       "machine; put it on PATH and run `ctx init` again for entries you can commit.", err=True)
        left = [n for n in clients.CLIENTS if n not in names]
        if left:
            typer.echo(f"Other clients: ctx init --client {','.join(left)}")
        if not indexed:
            typer.echo("Next: `ctx run index` builds the index the tools search.")
    if unmerged:
        # The other files are written; a file we could not merge safely must not pass for success.
        raise ConfigError(f"{len(unmerged)} file(s) not changed: " + ", ".join(c.path for c in unmerged),
                          hint="paste the entry shown above into each, or fix what its line names and run again")


def _user_file(client: str, root: Path, command: list[str], yes: bool) -> Change:
    """Show the change to a user-wide config file, then write it when confirmed (or --yes)."""
    from ctxlake.serve.agents import clients

    path, old, new, diff, done = clients.user_plan(client, root, command)
    if done is not None:
        return done
    label = clients.USER_CLIENTS[client][0]
    # The preview goes to stderr, so that --json keeps stdout for its one document.
    typer.echo(f"{label} keeps MCP servers in {path}. The change:\n{diff}", err=True)
    if not yes:
        if not sys.stdin.isatty():
            raise InputError(f"not writing {path} without --yes (no terminal to ask)",
                             hint="read the change above, then run again with --yes")
        if not typer.confirm(f"Write {path}?", default=False):
            return clients.Change(client, str(path), "skipped", "not confirmed")
    return clients.write_user(client, path, old, new)


def register(app: typer.Typer) -> None:
    """Add `ctx init` and `ctx serve` to the CLI."""
    app.command("init")(init)
    app.command("serve")(serve)
