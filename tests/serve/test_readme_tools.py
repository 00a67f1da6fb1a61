"""The README's MCP tool signatures match the tools: every argument it names exists, with the default
it says (read from the tools/list snapshot that test_mcp_tools checks against the real server)."""

from __future__ import annotations

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
SNAPSHOT = Path(__file__).parent / "snapshots" / "mcp_tools_list.json"
SIGNATURE = re.compile(r"`(\w+)\(([^`]*)\)`")


def documented() -> list[tuple[str, str]]:
    """(tool, argument list) for each `name(args)` in the first column of a README table row."""
    out = []
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            out += SIGNATURE.findall(line.split(" | ")[0])
    return out


def test_readme_tool_arguments_and_defaults_are_the_tools() -> None:
    tools = {t["name"]: t["inputSchema"]["properties"] for t in json.loads(SNAPSHOT.read_text(encoding="utf-8"))}
    checked = 0
    for name, args in documented():
        if name not in tools:
            continue
        checked += 1
        for arg in filter(None, (a.strip() for a in args.split(","))):
            key, _, default = arg.rstrip("?").partition("=")
            assert key in tools[name], f"README: {name}({args}): no argument {key!r}"
            if default:
                assert json.dumps(tools[name][key].get("default")) == default, \
                    f"README: {name}({args}): {key} defaults to {tools[name][key].get('default')!r}"
    assert checked >= 8
