"""Benchmark: many repositories as sources of one lake, indexed in the flow's process and on Dask.

    python3 dev.py bench dask                                  # the SWE-bench repos in ../.mirror, 1 and 2 workers
    python3 dev.py bench dask --repos flask,requests --workers 1,2 --local
    python3 dev.py bench dask --mirrors DIR --workdir DIR --out results.json

Mirrors are bare git repositories, `<mirrors>/<owner>+<name>/repo` (or the git dir itself), found
in --mirrors, $CTX_BENCH_MIRRORS, or ../.mirror beside the checkout; by default the twelve
SWE-bench Lite repositories, those present. Each is materialised once (git archive HEAD) and
added as a local source of one project; every mode then runs
`sync_sources` over all of them into its own empty lake, in a process of its own, with its own
empty embedding cache. Prefect's start and the cluster's start are timed apart from the index.

Reported per mode: index seconds, peak RSS of the flow process (which also hosts the
LocalCluster's scheduler) and of each worker process, and whether its lake equals the first
mode's: FILES rows, chunk ids with their vectors, and the three graph tables, compared by digest.
The fake embedder is the default (the pipeline, not a model, is what is compared); --embed static
times the static model, distilled once into a models folder every mode shares.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


# The repositories of SWE-bench Lite (the dev split's twelve), by source name: the default set.
SWE_BENCH = ("astropy", "django", "flask", "matplotlib", "pylint", "pytest", "requests", "scikit-learn",
             "seaborn", "sphinx", "sympy", "xarray")


def find_mirrors(folder: Path) -> dict[str, Path]:
    """Source name -> bare git dir, for every mirror in `folder`; a swe-bench+ mirror (it holds the
    benchmark's base commits) wins over another of the same repository."""
    found: dict[str, Path] = {}
    entries = sorted(folder.iterdir() if folder.is_dir() else [], key=lambda e: (not e.name.startswith("swe-bench+"), e.name))
    for entry in entries:
        git_dir = entry / "repo" if (entry / "repo" / "HEAD").is_file() else entry
        if not (git_dir / "HEAD").is_file() or not (git_dir / "objects").is_dir():
            continue
        # owner+name, or swe-bench+owner__name: the repository's own name is the source's
        name = re.sub(r"[^a-z0-9._-]", "-", entry.name.split("+")[-1].split("__")[-1].lower())
        found.setdefault(name, git_dir)
    return found


def materialise(git_dir: Path, dest: Path) -> None:
    """The tree at HEAD, as plain files (no checkout, no .git: a local source indexes a folder)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", f"--git-dir={git_dir}", "archive", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive failed for {git_dir}")


def max_rss() -> int:
    """This process's peak resident set, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(args: argparse.Namespace) -> int:
    """One mode in this process: index every tree as a source, print one JSON line."""
    os.environ.update({"CTX_HOME": str(args.home), "CTX_EMBED_PROVIDER": "fake" if args.embed == "fake" else "local",
                       "CTX_EMBED_MODEL": "hash" if args.embed == "fake" else "static",
                       "PREFECT_HOME": str(args.home / "prefect"), "PREFECT_LOGGING_LEVEL": "CRITICAL",
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL"})
    from ctxlake.schemas.config import load_settings
    from ctxlake.schemas.sources import SourceSpec

    (args.project / ".ctx").mkdir(parents=True, exist_ok=True)
    run = {"executor": "local"} if args.mode == "local" else {"executor": "dask", "dask_address": args.mode}
    settings = load_settings(args.project, overrides={"run": run})
    specs = [SourceSpec(name=tree.name, type="local", origin=str(tree)) for tree in sorted(args.trees.iterdir())]
    from ctxlake.flows.sync_sources import sync_sources

    out: dict[str, Any] = {"mode": args.mode}
    started = time.perf_counter()
    sync_sources(settings, [])  # Prefect's temporary server starts here, outside the timings
    out["prefect_start_s"] = time.perf_counter() - started
    client = None
    if args.mode != "local":
        from ctxlake.tasks import dask_run

        started = time.perf_counter()
        client = dask_run.client_for(args.mode)
        client.wait_for_workers(int(args.mode.removeprefix("local:")))
        out["cluster_start_s"] = time.perf_counter() - started
    started = time.perf_counter()
    reports = sync_sources(settings, specs)
    out["index_s"] = time.perf_counter() - started
    failed = [f"{r.name}: {r.message}" for r in reports if r.status == "failed"]
    out["failed"] = failed
    out["files"] = sum((r.index or {}).get("added", 0) for r in reports)
    out["chunks"] = sum((r.index or {}).get("chunks_inserted", 0) for r in reports)
    out["graph_rows"] = sum((r.index or {}).get("graph_rows", 0) for r in reports)
    out["embedded"] = sum((r.index or {}).get("embedded", 0) for r in reports)
    out["flow_rss"] = max_rss()
    if client is not None:
        # A LocalCluster's scheduler and nannies live in this process: flow_rss covers them.
        out["worker_rss"] = sorted(client.run(max_rss).values())
        from ctxlake.tasks import dask_run

        dask_run.close_clients()
    print(json.dumps(out))
    return 0


def lake_digest(lake: Path) -> dict[str, Any]:
    """Table -> (rows, xxh3 of its content sorted by key): equal digests, equal lakes."""
    import lancedb
    import pyarrow as pa
    import xxhash

    db = lancedb.connect(str(lake))
    wanted = {
        "files": ["source", "path", "hash", "size", "lang", "n_chunks"],
        "chunks": ["id", "source", "path", "start_line", "end_line", "symbol", "content_hash", "vector"],
    }
    out: dict[str, Any] = {}
    for name in ("files", "chunks", "definitions", "refs", "imports"):
        table = db.open_table(name).to_arrow()
        columns = wanted.get(name) or [f.name for f in table.schema if not pa.types.is_list(f.type)]
        table = table.select(columns)
        keys = [c for c in columns if c != "vector"]
        table = table.sort_by([(c, "ascending") for c in keys]).combine_chunks()
        h = xxhash.xxh3_128()
        for column in columns:
            values = table.column(column)
            if column == "vector":
                h.update(values.combine_chunks().flatten().to_numpy().tobytes())
                h.update(str(values.null_count).encode())
            else:
                h.update("\x1f".join(map(str, values.to_pylist())).encode("utf-8", "surrogatepass"))
        out[name] = {"rows": table.num_rows, "digest": h.hexdigest()}
        if name == "chunks":
            out[name]["duplicate_ids"] = table.num_rows - len(set(table.column("id").to_pylist()))
            out[name]["missing_vectors"] = table.column("vector").null_count
    return out


def mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_mirrors = Path(os.environ.get("CTX_BENCH_MIRRORS") or ROOT.parent / ".mirror")
    parser.add_argument("--mirrors", type=Path, default=default_mirrors,
                        help="folder of bare git mirrors (default: $CTX_BENCH_MIRRORS or ../.mirror)")
    parser.add_argument("--repos", default="", help="comma-separated source names; default: every mirror found")
    parser.add_argument("--workers", default="1,2", help="LocalCluster sizes to run (comma-separated)")
    parser.add_argument("--local", action="store_true", help="also index in the flow's process (executor local)")
    parser.add_argument("--embed", choices=["fake", "static"], default="fake")
    parser.add_argument("--workdir", type=Path, default=None, help="trees and lakes go here (default: a temp dir)")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--trees", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--project", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--home", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.mode = args.child
        return child(args)

    mirrors = find_mirrors(args.mirrors)
    if args.repos:
        names = [n.strip() for n in args.repos.split(",") if n.strip()]
        missing = [n for n in names if n not in mirrors]
        if missing:
            raise SystemExit(f"no mirror for {', '.join(missing)} in {args.mirrors} (found: {', '.join(mirrors)})")
        mirrors = {n: mirrors[n] for n in names}
    else:
        absent = [n for n in SWE_BENCH if n not in mirrors]
        if absent:
            print(f"no mirror for {', '.join(absent)} in {args.mirrors}: running without them", flush=True)
        mirrors = {n: mirrors[n] for n in SWE_BENCH if n in mirrors}
    if not mirrors:
        raise SystemExit(f"no git mirrors in {args.mirrors}: pass --mirrors or set CTX_BENCH_MIRRORS")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="ctx-bench-dask-"))
    trees = work / "trees"
    started = time.perf_counter()
    for name, git_dir in mirrors.items():
        materialise(git_dir, trees / name)
    tracked = sum(sum(1 for p in (trees / n).rglob("*") if p.is_file()) for n in mirrors)
    print(f"{len(mirrors)} repositories ({', '.join(mirrors)}), {tracked} files in their trees, "
          f"materialised in {time.perf_counter() - started:.0f} s", flush=True)

    modes = (["local"] if args.local else []) + [f"local:{n.strip()}" for n in args.workers.split(",") if n.strip()]
    models = work / "models"  # one distillation of the static model, shared by every mode
    results: list[dict[str, Any]] = []
    for mode in modes:
        tag = mode.replace(":", "-")
        home, project = work / f"home-{tag}", work / f"lake-{tag}"
        for folder in (home, project):  # every mode starts from an empty lake and cache
            shutil.rmtree(folder, ignore_errors=True)
        home.mkdir(parents=True)
        models.mkdir(exist_ok=True)
        (home / "models").symlink_to(models, target_is_directory=True)
        cmd = [sys.executable, __file__, "--child", mode, "--trees", str(trees), "--project",
               str(project), "--home", str(home), "--embed", args.embed]
        wall = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        row["process_s"] = time.perf_counter() - wall
        row["lake"] = lake_digest(project / ".ctx" / "lake")
        results.append(row)
        workers = ", ".join(mb(n) for n in row.get("worker_rss", [])) or "-"
        print(f"{mode:<8} index {row['index_s']:7.1f} s  files {row['files']}  chunks {row['chunks']}  "
              f"graph rows {row['graph_rows']}  flow RSS {mb(row['flow_rss'])}  worker RSS {workers}  "
              f"(prefect start {row['prefect_start_s']:.0f} s, cluster start {row.get('cluster_start_s', 0):.0f} s)"
              + (f"  FAILED: {row['failed']}" if row["failed"] else ""), flush=True)

    base = results[0]
    print(f"\nlakes compared with {base['mode']}'s (files, chunk ids + vectors, definitions, refs, imports):")
    differ = 0
    for row in results[1:]:
        same = {t: row["lake"][t] == base["lake"][t] for t in base["lake"]}
        differ += not all(same.values())
        print(f"  {row['mode']:<8} {'EQUAL' if all(same.values()) else 'DIFFERENT: ' + str(same)}")
    chunks = base["lake"]["chunks"]
    print(f"  ({base['lake']['files']['rows']} files, {chunks['rows']} chunks, {chunks['duplicate_ids']} duplicate "
          f"ids, {chunks['missing_vectors']} without a vector)")
    print(f"\n{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end; work folder {work}")
    if args.out:
        args.out.write_text(json.dumps({"repos": list(mirrors), "files_in_trees": tracked, "modes": results},
                                       indent=2) + "\n")
    return 1 if differ else 0  # a lake that differs is a failure, not a figure


if __name__ == "__main__":
    sys.exit(main())
