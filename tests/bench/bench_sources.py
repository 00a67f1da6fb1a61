"""Benchmark: fetching and syncing sources (git clone/update, web crawl/refresh, the sync flow) on local fixtures.

    python3 dev.py bench sources [--files 400] [--pages 200]

Everything is local: a bare git repository made in a temp folder (file:// URL) and a docs site
served on 127.0.0.1, so the numbers are this machine's git, HTTP and indexing costs, not a
network's. The flow steps use the test suite's deterministic fake embedder so that they time
fetching, scanning, chunking and writing, not the embedding model (see bench_index for that).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.com"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=GIT_ENV).stdout.strip()


def module(i: int) -> str:
    funcs = "\n\n".join(
        f"def handler_{i}_{j}(request, retries={j}):\n"
        f"    \"\"\"Handle request kind {j} of module {i}.\"\"\"\n"
        f"    for attempt in range(retries):\n"
        f"        if request.ok(attempt):\n"
        f"            return request.value + {j}\n"
        f"    return None\n"
        for j in range(6)
    )
    return f'"""Module {i}."""\n\n{funcs}\n'


def make_remote(tmp: Path, n_files: int) -> tuple[Path, str]:
    work = tmp / "lib"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    for i in range(n_files):
        sub = work / ("core" if i % 2 else "docs_src") / f"pkg{i % 10}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"mod{i}.py").write_text(module(i))
    git(work, "add", "-A")
    git(work, "commit", "-qm", "init")
    bare = tmp / "lib.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True, env=GIT_ENV)
    git(bare, "config", "uploadpack.allowFilter", "true")
    return work, f"file://{bare}"


def push_change(work: Path, url: str) -> None:
    target = next((work / "core").rglob("*.py"))
    target.write_text(target.read_text() + "\n\ndef added_later():\n    return 42\n")
    git(work, "commit", "-qam", "change")
    git(work, "push", "-q", url.removeprefix("file://"), "main")


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=400, help="files in the git source")
    parser.add_argument("--pages", type=int, default=200, help="pages linked from the llms.txt")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ctx-bench-sources-"))
    os.environ.update({"CTX_HOME": str(tmp / "home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
                       "PREFECT_HOME": str(tmp / "prefect"), "PREFECT_LOGGING_LEVEL": "CRITICAL",
                       # A loaded machine can take longer than the default 20 s to start it.
                       "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
                       "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_LOGGING_LEVEL": "CRITICAL"})
    from docsite import DocSite, Page, serve

    from ctxlake.schemas.config import SourcesSettings, load_settings
    from ctxlake.schemas.sources import SourceSpec
    from ctxlake.tasks.sources import fetch_git, storage_dir
    from ctxlake.tasks.webdocs import fetch_web

    rows: list[tuple[str, float, str]] = []
    work, url = make_remote(tmp, args.files)
    home = tmp / "home"
    limits = SourcesSettings()
    full = SourceSpec(name="lib", type="git", origin=url)
    sparse = SourceSpec(name="lib-core", type="git", origin=url, paths=["core"])

    s, got = timed(lambda: fetch_git.fn(full, storage_dir(home, full), limits, tmp / "p"))
    rows.append(("git: shallow clone (all files)", s, f"{args.files} files"))
    s, got = timed(lambda: fetch_git.fn(sparse, storage_dir(home, sparse), limits, tmp / "p"))
    rows.append(("git: sparse clone, blob:none (--paths core)", s, f"{args.files // 2} files"))
    s, got = timed(lambda: fetch_git.fn(full, storage_dir(home, full), limits, tmp / "p"))
    rows.append(("git: update, nothing new (ls-remote only)", s, f"changed={got.changed}"))
    push_change(work, url)
    s, got = timed(lambda: fetch_git.fn(full, storage_dir(home, full), limits, tmp / "p"))
    rows.append(("git: update after 1-file commit (fetch depth 1)", s, f"changed={got.changed}"))

    pages = {f"/docs/page{i}.md": Page(f"# Page {i}\n\n" + f"Paragraph about topic {i}.\n\n" * 40)
             for i in range(args.pages)}
    llms = "# Bench\n\n> Bench docs.\n\n## Docs\n\n" + "".join(f"- [P{i}](/docs/page{i}.md)\n" for i in range(args.pages))
    with serve(DocSite(pages={"/llms.txt": Page(llms, "text/plain"), **pages})) as site:
        web = SourceSpec(name="docs", type="web", origin=site.url("/llms.txt"))
        s, got = timed(lambda: fetch_web.fn(web, storage_dir(home, web), limits, tmp / "p"))
        rows.append(("web: llms.txt crawl, cold", s, f"{args.pages} pages, {args.pages / s:.0f} pages/s, {got.status}"))
        s, got = timed(lambda: fetch_web.fn(web, storage_dir(home, web), limits, tmp / "p"))
        rows.append(("web: refresh, all 304 (ETag)", s, f"changed={got.changed}"))

        project = tmp / "proj"
        (project / ".ctx").mkdir(parents=True)
        settings = load_settings(project)
        from ctxlake.tasks.embedders import FakeEmbedder

        s, _ = timed(lambda: __import__("ctxlake.flows.sync_sources"))
        rows.append(("flow: import Prefect + flows", s, ""))
        from ctxlake.flows.sync_sources import sync_sources

        s, rep = timed(lambda: sync_sources(settings, [sparse]))
        rows.append(("flow: first sync_sources run (starts Prefect's temp server)", s,
                     f"{rep[0].index['added'] if rep[0].index else 0} files indexed"))
        FakeEmbedder.reset_counters()
        s, rep = timed(lambda: sync_sources(settings, [full]))
        rows.append(("flow: sync git source, cold index", s,
                     f"{rep[0].index['added']} files, {rep[0].index['chunks_inserted']} chunks"))
        s, rep = timed(lambda: sync_sources(settings, [full]))
        rows.append(("flow: sync git source, nothing new", s, f"index ran={rep[0].index is not None}"))
        from ctxlake.tasks.sources import is_current, source_root

        s, current = timed(lambda: is_current(full, source_root(settings, full), settings.lake_dir,
                                              full.index_settings(settings.index), "ok", 60.0))
        rows.append(("ctx update pre-check, nothing new (no Prefect)", s, f"current={current}"))
        push_change(work, url)
        FakeEmbedder.reset_counters()
        s, rep = timed(lambda: sync_sources(settings, [full]))
        rows.append(("flow: sync after 1-file commit", s,
                     f"~{rep[0].index['modified']} file, {FakeEmbedder.texts_embedded} texts embedded"))
        s, rep = timed(lambda: sync_sources(settings, [web]))
        rows.append(("flow: sync web source (304s + cold index)", s, f"{rep[0].index['added']} pages indexed"))

    width = max(len(r[0]) for r in rows)
    print(f"{'step':<{width}}  {'seconds':>8}  note")
    for name, secs, note in rows:
        print(f"{name:<{width}}  {secs:>8.2f}  {note}")
    print(f"\n{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
