"""Read API of the config registry (`.ctx/registry/`): the CLI and the MCP tools call these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxlake.errors import InputError
from ctxlake.schemas.registry import KINDS
from ctxlake.tasks.registry import _source, get_item, load_registry


def list_configs(root: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """Every item's kind, name, description and source file (no bodies)."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}", hint=f"one of: {', '.join(KINDS)}")
    return [{"kind": i.kind, "name": i.name, "description": i.description, "source": _source(i.kind, i.name)}
            for i in load_registry(root) if kind is None or i.kind == kind]


def get_config(root: Path, name: str, kind: str | None = None) -> dict[str, Any]:
    """One item with every field and its body."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}", hint=f"one of: {', '.join(KINDS)}")
    item = get_item(root, name, kind)
    return {**item.to_dict(), "source": _source(item.kind, item.name)}
