"""Symbol graph benchmark: per-language reference recall/precision on the test fixtures, then on
django (from the bare mirror): cold index time and lake size and the graph's share of both,
find_references p50 through the MCP in-memory client, and `ctx refs` output for 20 symbols.

    python3 dev.py bench graph                    # django from ../.mirror (or --mirror DIR)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "tasks"))
CTX = Path(sys.executable).parent / "ctx"
SYMBOLS = ["get_object_or_404", "reverse", "QuerySet.filter", "render", "HttpResponse", "slugify",
           "get_user_model", "cached_property", "Signal.send", "ValidationError", "force_str",
           "import_string", "Model.save", "transaction.atomic", "mark_safe", "timezone.now",
           "BaseCommand", "override_settings", "ContentType", "format_html"]


def fixture_scores() -> None:
    from test_graph import FIXTURES

    from ctxlake.tasks.graph import graph_rows

    print("language      recall  precision   (call sites of `compute` in tests/tasks/test_graph.py)")
    for lang, (path, body) in sorted(FIXTURES.items()):
        rows = graph_rows(body, lang, "project", path)
        want = {i for i, line in enumerate(body.split("\n"), 1) if "CALL" in line}
        got = {r["line"] for r in rows.references if r["name"] == "compute" and r["kind"] == "call"}
        hit = len(want & got)
        print(f"{lang:12} {hit / len(want):7.0%} {hit / max(1, len(got)):10.0%}")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def django(mirror: Path) -> None:
    from mcp import Client

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.mcp.server import build_server
    from ctxlake.tasks.chunk import chunk_text, language_for
    from ctxlake.tasks.graph import graph_files
    from ctxlake.tasks.graph_store import open_graph, optimize_graph, write_graph

    work = Path(tempfile.mkdtemp(prefix="bench-graph-"))
    tree = work / "django"
    tree.mkdir()
    archive = subprocess.Popen(["git", f"--git-dir={mirror}", "archive", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    archive.wait()
    # The default embedding profile (static), as a user's cold index runs; `seconds` leaves out
    # the one-time model build. Once without the graph, once with it: the difference is its cost.
    env = {**os.environ, "CTX_HOME": str(work / "home")}
    lake = tree / ".ctx" / "lake"

    def cold_index(graph: bool) -> float:
        subprocess.run(["rm", "-rf", str(tree / ".ctx"), str(work / "home" / "embeddings")], check=True)
        out = subprocess.run([str(CTX), "run", "index", "--json"], cwd=tree, check=True, capture_output=True,
                             text=True, env={**env, "CTX_INDEX_GRAPH": "true" if graph else "false"})
        return float(json.loads(out.stdout)["seconds"])

    without_s = cold_index(graph=False)
    without_bytes = folder_bytes(lake)
    index_s = cold_index(graph=True)
    graph_bytes = sum(folder_bytes(lake / f"{t}.lance") for t in ("definitions", "refs", "imports"))
    lake_bytes = folder_bytes(lake)

    # The graph stage alone, in process, as the indexer runs it: on the chunker's parse (its cost
    # counted with the chunks, where it is paid), then written to a fresh lake (cold append),
    # compacted and indexed.
    files, trees = {}, {}
    for p in tree.rglob("*"):
        rel = p.relative_to(tree).as_posix()
        lang = language_for(rel)
        if p.is_file() and lang and not rel.startswith(".ctx/"):
            with contextlib.suppress(UnicodeDecodeError, OSError):
                files[rel] = (p.read_text("utf-8"), lang)
                parsed = chunk_text(files[rel][0], lang).tree
                if parsed is not None:
                    trees[rel] = parsed
    t0 = time.perf_counter()
    defs, refs, imports, bad = graph_files(files, "project", None, trees)
    extract_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    graph = open_graph(work / "graph-lake")
    write_graph(graph, "project", (defs, refs, imports), sorted(files), cold=True)
    optimize_graph(graph)
    store_s = time.perf_counter() - t0
    print(f"\ndjango: {len(files)} code files; cold index (static profile) without the graph {without_s:.1f} s, "
          f"with it {index_s:.1f} s = +{(index_s - without_s) / without_s:.0%}; the graph stage alone, in "
          f"process: rows {extract_s:.1f} s + write, compact, index {store_s:.1f} s")
    print(f"lake {lake_bytes / 1e6:.1f} MB, without the graph {without_bytes / 1e6:.1f} MB; graph tables "
          f"{graph_bytes / 1e6:.1f} MB = +{graph_bytes / max(1, lake_bytes - graph_bytes):.0%} over the rest; rows: {defs.num_rows} "
          f"definitions, {refs.num_rows} refs, {imports.num_rows} imports, {len(bad)} bad files")
    resolved = sum(1 for r in imports.column("resolved").to_pylist() if r)
    print(f"imports resolved to a django file: {resolved}/{imports.num_rows}")

    os.environ.update({k: v for k, v in env.items() if k.startswith("CTX_")})
    server = build_server(load_settings(tree, {"mcp": {"stale_check_s": 0}}))

    async def timings() -> list[float]:
        out = []
        async with Client(server) as client:
            await client.call_tool("find_references", {"symbol": "render"})  # opens the tables
            for _ in range(3):
                for sym in SYMBOLS:
                    t = time.perf_counter()
                    await client.call_tool("find_references", {"symbol": sym, "limit": 20})
                    out.append((time.perf_counter() - t) * 1000)
        return out

    ms = asyncio.run(timings())
    print(f"find_references through MCP (in-memory client), {len(ms)} calls: p50 {statistics.median(ms):.1f} ms, "
          f"p90 {sorted(ms)[int(len(ms) * 0.9)]:.1f} ms")
    print(f"load: {os.getloadavg()[0]:.2f}")
    for sym in SYMBOLS:
        out = subprocess.run([str(CTX), "refs", sym, "-n", "3", "--no-imports"], cwd=tree, env=env,
                             capture_output=True, text=True)
        print(f"\n$ ctx refs {sym} -n 3 --no-imports   (exit {out.returncode})")
        print(out.stdout.rstrip() or out.stderr.strip())
        print(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=ROOT.parent / ".mirror" / "swe-bench+django__django" / "repo",
                        help="a bare git mirror of django")
    args = parser.parse_args()
    fixture_scores()
    if args.mirror.is_dir():
        django(args.mirror)
    else:
        print(f"\n(no django mirror at {args.mirror}: fetch github:django/django into ../.mirror)")


if __name__ == "__main__":
    main()
