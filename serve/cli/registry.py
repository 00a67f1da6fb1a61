"""`ctx sync` (registry -> each agent tool's native files) and `ctx registry list|show|import`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")]
RootOpt = Annotated[Path | None, typer.Option("--root", help="project folder (default: found from here)")]

registry_app = typer.Typer(help="Portable skills, commands, agents and rules in .ctx/registry/.",
                           no_args_is_help=True)


def _root(path: Path | None) -> Path:
    from ctxlake.schemas.roots import find_root, git_toplevel, resolve_root

    if path is not None:
        return resolve_root(path, for_write=False)
    cwd = Path.cwd()
    return find_root(cwd) or git_toplevel(cwd) or cwd.resolve()


def sync(
    client: Annotated[str | None, typer.Option("--client", help="claude, codex, gemini, cursor, copilot or all "
                                                                  "(comma-separated; default all)")] = None,
    check: Annotated[bool, typer.Option("--check", help="write nothing; exit 1 when anything is out of date")] = False,
    force: Annotated[bool, typer.Option("--force", help="overwrite files a person edited since the last sync")] = False,
    path: RootOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write each agent tool's native files from .ctx/registry/ (idempotent; edited files are conflicts)."""
    from ctxlake.serve.cli.render import print_json
    from ctxlake.tasks.registry import parse_clients
    from ctxlake.tasks.registry import sync as do_sync

    root = _root(path)
    result = do_sync(root, parse_clients(client), check=check, force=force)
    if as_json:
        print_json({"root": str(root), "check": check, **result.to_dict()})
    else:
        pending = result.pending
        for c in pending:
            verb = f"would {c.action}" if check and c.action != "conflict" else c.action
            typer.echo(f"{verb} {c.path}" + (f" ({c.detail})" if c.detail else ""))
        if not pending:
            typer.echo("Up to date.")
    if result.conflicts and not force:
        typer.echo(f"ctx: {len(result.conflicts)} conflict(s): edit the registry instead, or run "
                   "`ctx sync --force` to overwrite", err=True)
        raise typer.Exit(1)
    if check and result.pending:
        raise typer.Exit(1)


@registry_app.command("list")
def list_items(path: RootOpt = None, as_json: JsonOpt = False) -> None:
    """The registry's items: kind, name, description."""
    from ctxlake.serve.api.registry import list_configs
    from ctxlake.serve.cli.render import print_json

    items = list_configs(_root(path))
    if as_json:
        print_json({"items": items})
        return
    if not items:
        typer.echo("No registry items yet (add .ctx/registry/<kind>s/<name>.md, or `ctx registry import`).")
    for i in items:
        typer.echo(f"{i['kind']:<8} {i['name']:<24} {i['description']}")


@registry_app.command("show")
def show(
    name: Annotated[str, typer.Argument(help="item name")],
    kind: Annotated[str | None, typer.Option("--kind", help="skill, command, agent or rule")] = None,
    path: RootOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One registry item with its body."""
    from ctxlake.serve.api.registry import get_config
    from ctxlake.serve.cli.render import print_json

    item = get_config(_root(path), name, kind)
    if as_json:
        print_json(item)
        return
    from ctxlake.schemas.registry import ConfigItem

    typer.echo(ConfigItem(**{k: v for k, v in item.items() if k != "source"}).to_markdown(), nl=False)


@registry_app.command("import")
def import_cmd(
    client: Annotated[str | None, typer.Option("--client", help="claude, cursor, gemini or copilot "
                                                                  "(comma-separated; default all)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="say what would be imported; write nothing")] = False,
    path: RootOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read existing native files (skills, commands, agents, rules) into the registry; never overwrites an item."""
    from ctxlake.serve.cli.render import print_json
    from ctxlake.tasks.registry import import_native

    clients = [c.strip() for c in client.split(",") if c.strip()] if client and client != "all" else None
    result = import_native(_root(path), clients, dry_run=dry_run)
    if as_json:
        print_json(result.to_dict())
        return
    for src in result.imported:
        typer.echo(("would import " if dry_run else "imported ") + src)
    for s in result.skipped:
        typer.echo(f"skipped {s['path']} ({s['why']})")
    if not result.imported and not result.skipped:
        typer.echo("Nothing to import.")


def register(app: typer.Typer) -> None:
    app.command("sync")(sync)
    app.add_typer(registry_app, name="registry")
