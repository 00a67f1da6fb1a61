"""Security benchmark for the file readers: `python3 dev.py bench security [--race N] [--workdir DIR]`.

Builds a small project in a temporary folder, indexes it with `ctx run index` (fake embedder: no
model download, the readers are what is measured), plants an outside file and a .git/config with
marker strings, then drives every file-reading path through the real MCP server (SDK in-memory
client): docs_content, get_file_context and the ctx://file resource.

Prints: hostile inputs tried, reads outside a root (must be 0), hidden or .git files served (must
be 0), the symlink race (calls, served, refused, outside reads), and per hostile file (FIFO, link
to /dev/zero, 300 MB sparse file, 200k-character query) the latency, with the max over all.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import anyio

OUTSIDE_MARK = "OUTSIDE-MARK-7f3a"
GIT_MARK = "GIT-CONFIG-MARK-91c2"
HIDDEN_MARK = "HIDDEN-MARK-55e0"
FILES = {
    "src/app.py": "def main():\n    return 'hello'\n",
    "src/util/helpers.py": "def helper(x):\n    return x * 2\n",
    "docs/guide.md": "# Guide\n\nUse the app.\n",
    "docs/sub/deep.md": "# Deep\n",
    "README.md": "# Project\n",
    ".github/ci.yml": "on: push\n",
}


def build(work: Path) -> tuple[Path, Path]:
    root = work / "proj"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    (root / ".git" / "config").write_text(f"[core]\n\t# {GIT_MARK}\n", encoding="utf-8")
    (root / ".env").write_text(f"TOKEN={HIDDEN_MARK}\n")
    (root / "docs" / ".secret.md").write_text(f"{HIDDEN_MARK}\n")
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text(f"{OUTSIDE_MARK}\n")
    (outside / "secret.py").write_text(f"# {OUTSIDE_MARK}\n")
    env = {**os.environ, "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash", "CTX_HOME": str(work / "home")}
    ctx = str(Path(sys.executable).parent / "ctx")
    subprocess.run([ctx, "init"], cwd=root, env=env, check=True, capture_output=True)
    subprocess.run([ctx, "run", "index"], cwd=root, env=env, check=True, capture_output=True, timeout=600)
    os.environ.update({k: env[k] for k in ("CTX_EMBED_PROVIDER", "CTX_EMBED_MODEL", "CTX_HOME")})
    return root, outside


def plant_links(root: Path, outside: Path) -> None:
    """Links and odd files a hostile checkout (or an agent's earlier write) could hold."""
    d, s = root / "docs", root / "src"
    links = {
        d / "out_abs.md": outside / "secret.md", d / "out_rel.md": Path("../../outside/secret.md"),
        d / "git.md": Path("../.git/config"), d / "git_abs.md": root / ".git" / "config",
        d / "env.md": Path("../.env"), d / "hidden.md": Path(".secret.md"), d / "loop.md": Path("loop.md"),
        d / "outdir": outside, d / "passwd.md": Path("/etc/passwd"), d / "zero.md": Path("/dev/zero"),
        root / "README.txt": outside / "secret.md", root / "CHANGES.md": Path(".git/config"),
    }
    for link, target in links.items():
        link.symlink_to(target)
    # Indexed files swapped after the index run: a link out, a link into .git, a link to a hidden file.
    (s / "app.py").unlink()
    (s / "app.py").symlink_to(outside / "secret.py")
    (s / "util" / "helpers.py").unlink()
    (s / "util" / "helpers.py").symlink_to("../../.git/config")


def hostile_paths() -> list[str]:
    bases = ["../outside/secret.md", "../../etc/passwd", "/etc/passwd", "~/.bashrc", "C:/Windows/win.ini",
             "..\\..\\etc\\passwd", ".git/config", ".env", "docs/.secret.md", "docs/../.git/config",
             "docs/./../../outside/secret.md", "docs/out_abs.md", "docs/out_rel.md", "docs/git.md",
             "docs/git_abs.md", "docs/env.md", "docs/hidden.md", "docs/loop.md", "docs/outdir/secret.md",
             "docs/passwd.md", "docs/zero.md", "README.txt", "CHANGES.md", "src/app.py", "src/util/helpers.py",
             "docs/a\0.md", "", " ", "/", ".", "..", "docs/", "docs//../..//etc/passwd", "%2e%2e/etc/passwd",
             "docs/%2e%2e/%2e%2e/etc/passwd", "docs/\u2025/x.md", "file:///etc/passwd", "\\\\server\\share\\x.md",
             "docs/guide.md/../../.git/config", "/proc/self/environ", "/dev/zero", ".github/../.git/config",
             str(Path("/tmp")), "docs/sub/../../../outside/secret.md", "docs/" + "a/" * 200 + "x.md"]
    out = list(bases)
    for base in bases[:40]:  # the same inputs with a leading ./, a trailing slash, backslashes
        out += ["./" + base, base + "/", base.replace("/", "\\")]
    return out


async def corpus(server: Any, root: Path, verbose: bool = True) -> dict[str, Any]:
    from mcp import Client

    paths = hostile_paths()
    outside_reads = hidden_served = served = 0
    marks = (OUTSIDE_MARK, GIT_MARK, HIDDEN_MARK, "root:x:0:0")
    async with Client(server) as client:
        for path in paths:
            for kind in ("docs_content", "get_file_context", "resource"):
                try:
                    if kind == "docs_content":
                        result = await client.call_tool("docs_content", {"path": path})
                        text = result.content[0].text if result.content else ""
                        ok = not result.is_error
                    elif kind == "get_file_context":
                        result = await client.call_tool("get_file_context", {"filepath": path})
                        text = result.content[0].text if result.content else ""
                        ok = not result.is_error
                    else:
                        res = await client.read_resource(f"ctx://file/{path}")
                        text = "".join(getattr(c, "text", "") for c in res.contents)
                        ok = True
                except Exception as exc:  # a refusal surfaced as a protocol error
                    text, ok = str(exc), False
                served += ok
                outside_reads += (OUTSIDE_MARK in text) or ("root:x:0:0" in text)
                leaked = any(m in text for m in marks)
                hidden_served += (GIT_MARK in text) or (HIDDEN_MARK in text)
                if leaked and verbose:
                    print(f"  LEAK {kind} {path!r}: {text[:80]!r}")
        # Controls: legitimate reads still work (a benchmark that refuses everything proves nothing).
        controls = 0
        for tool, key, path in [("docs_content", "path", "docs/guide.md"), ("docs_content", "path", "README.md"),
                                ("get_file_context", "filepath", "docs/guide.md"),
                                ("get_file_context", "filepath", ".github/ci.yml")]:
            result = await client.call_tool(tool, {key: path})
            controls += not result.is_error
    return {"inputs": len(paths), "calls": 3 * len(paths), "served": served, "controls": controls,
            "outside": outside_reads, "hidden": hidden_served}


def race(root: Path, outside: Path, calls: int) -> dict[str, int]:
    """docs_content and get_file_context's reader while a thread flips a path between a file and
    a link to an outside file (and to .git/config)."""
    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api.docs import DocsReader
    from ctxlake.tasks.safe_io import open_inside

    settings = load_settings(root)
    docs = DocsReader(root, settings.docs)
    path = root / "docs" / "race.md"
    path.write_text("inside\n")
    stop = threading.Event()

    def flip() -> None:
        link, plain = root / "docs" / ".race-link", root / "docs" / ".race-file"
        targets = [outside / "secret.md", root / ".git" / "config"]
        i = 0
        while not stop.is_set():
            link.unlink(missing_ok=True)
            link.symlink_to(targets[i % 2])
            os.replace(link, path)
            plain.write_text("inside\n")
            os.replace(plain, path)
            i += 1

    thread = threading.Thread(target=flip, daemon=True)
    thread.start()
    out = {"calls": 0, "served": 0, "refused": 0, "outside": 0, "hidden": 0}
    try:
        for i in range(calls):
            try:
                if i % 2:
                    text = docs.content("docs/race.md").content
                else:
                    text = open_inside(root, "docs/race.md", 10_000, allow_hidden=True).decode()
                out["served"] += 1
                out["outside"] += OUTSIDE_MARK in text
                out["hidden"] += GIT_MARK in text
            except Exception:
                out["refused"] += 1
            out["calls"] += 1
    finally:
        stop.set()
        thread.join()
    return out


async def hostile_files(server: Any, root: Path) -> dict[str, float]:
    from mcp import Client

    os.mkfifo(root / "docs" / "pipe.md")
    (root / "src" / "pipe.py").unlink(missing_ok=True)
    os.mkfifo(root / "src" / "pipe_target.py")
    with (root / "docs" / "huge.md").open("wb") as fh:
        fh.truncate(300 * 1024 * 1024)
    with (root / "docs" / "sub" / "deep.md").open("wb") as fh:  # an indexed file grown to 300 MB
        fh.truncate(300 * 1024 * 1024)
    token = "a" * 200_000
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("fifo docs_content", "docs_content", {"path": "docs/pipe.md"}),
        ("/dev/zero link docs_content", "docs_content", {"path": "docs/zero.md"}),
        ("300 MB docs_content", "docs_content", {"path": "docs/huge.md"}),
        ("300 MB get_file_context", "get_file_context", {"filepath": "docs/sub/deep.md"}),
        ("300 MB ctx://file", "", {"uri": "ctx://file/docs/sub/deep.md"}),
        ("fifo get_file_context", "get_file_context", {"filepath": "docs/pipe.md"}),
        ("200k query search_code", "search_code", {"query": token, "search_type": "keyword"}),
        ("200k query find_files", "find_files", {"query": token}),
        ("200k fuzzy_find", "fuzzy_find", {"symbol_name": token}),
    ]
    out: dict[str, float] = {}
    async with Client(server) as client:
        for label, tool, args in cases:
            started = time.monotonic()
            with anyio.fail_after(30):
                if tool:
                    result = await client.call_tool(tool, args)
                    text = result.content[0].text if result.content else ""
                    status = "error" if result.is_error else "ok"
                else:
                    try:
                        res = await client.read_resource(args["uri"])
                        text, status = "".join(getattr(c, "text", "") for c in res.contents), "ok"
                    except Exception as exc:
                        text, status = str(exc), "error"
            out[label] = time.monotonic() - started
            print(f"  {label:<30} {out[label] * 1000:8.1f} ms  {status}: {text[:90]!r}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--race", type=int, default=10_000, help="symlink-race calls (default 10,000)")
    parser.add_argument("--workdir", type=Path, default=None, help="where to build the project (default: a temp folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        started = time.monotonic()
        root, outside = build(work)
        print(f"project indexed in {time.monotonic() - started:.1f} s")
        plant_links(root, outside)
        from ctxlake.schemas.config import load_settings
        from ctxlake.serve.mcp.server import build_server

        server = build_server(load_settings(root))
        c = anyio.run(corpus, server, root)
        print(f"hostile path corpus: {c['inputs']} inputs x 3 readers = {c['calls']} calls, {c['served']} served; "
              f"reads outside a root: {c['outside']}; hidden/.git served: {c['hidden']}; "
              f"legitimate controls served: {c['controls']}/4")
        r = race(root, outside, args.race)
        print(f"symlink race: {r['calls']} calls, {r['served']} served, {r['refused']} refused; "
              f"reads outside: {r['outside']}; .git served: {r['hidden']}")
        print("hostile files (each must answer within 2 s):")
        latencies = anyio.run(hostile_files, server, root)
        worst = max(latencies.values())
        print(f"max latency: {worst * 1000:.1f} ms")
        failed = c["outside"] + c["hidden"] + r["outside"] + r["hidden"] + (worst >= 2) + (c["controls"] != 4)
        print("RESULT: " + ("ok" if not failed else "FAILED"))
        return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
