"""A stub coding agent for tests: writes an executable that records what it saw, then answers (or misbehaves on request)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

SCRIPT = r'''#!{python}
import json, os, subprocess, sys, time
from pathlib import Path

cwd = Path.cwd()
links = {{}}
for link in sorted((cwd / "sources").iterdir()):
    target = Path(os.readlink(link)) if link.is_symlink() else link
    links[link.name] = {{
        "is_symlink": link.is_symlink(),
        "target": str(target) if link.is_symlink() else None,
        "files": sorted(str(p.relative_to(target)) for p in target.rglob("*")
                        if p.is_file() and ".git" not in p.parts),
    }}
configs = {{}}
for rel in [".mcp.json", ".gemini/settings.json", ".cursor/mcp.json", "opencode.json", "mcp-config.json"]:
    path = cwd / rel
    configs[rel] = json.loads(path.read_text()) if path.is_file() else None
record = {{
    "cwd": str(cwd), "argv": sys.argv[1:], "pid": os.getpid(),
    "links": links, "configs": configs,
    "prompt": Path(sys.argv[1]).read_text() if len(sys.argv) > 1 and Path(sys.argv[1]).is_file() else None,
    "stdin_is_tty": sys.stdin.isatty(),
    "env": dict(os.environ),
}}
mode = os.environ.get("STUB_MODE", "")
if mode in ("sleep", "background"):  # background: a job left running, as `(sleep 300) &` in a shell
    record["grandchild"] = subprocess.Popen(["sleep", "120"]).pid
if mode == "background":
    (cwd / "sources" / "notes" / "written-by-agent.txt").write_text("the links are not read-only\n")
Path(os.environ["STUB_RECORD"]).write_text(json.dumps(record))
if mode == "sleep":
    time.sleep(120)
elif mode == "flood":
    sys.stdout.write("x" * 3_000_000)
    sys.stdout.flush()
    sys.exit(0)
elif mode == "fail":
    print("partial answer")
    print("stub: model quota exceeded", file=sys.stderr)
    sys.exit(3)
print("ANSWER from stub: see " + ", ".join(sorted(links)))
'''


def install_stub(bin_dir: Path, name: str = "stub-agent") -> Path:
    """Write the stub as `bin_dir/name` (executable) and return its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / name
    exe.write_text(SCRIPT.format(python=sys.executable), encoding="utf-8")
    exe.chmod(0o755)
    return exe


def read_record(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data
