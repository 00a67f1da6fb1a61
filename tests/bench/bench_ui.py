"""Benchmark: the web UI in a real browser on django's lake: first page load and search-as-you-type.

    python3 dev.py bench ui                         # django from ../.mirror, static profile
    python3 dev.py bench ui --repo PATH             # any folder (indexed first if needed)
    python3 dev.py bench ui --loads 10 --out ui.json

Targets (issue 13): first page load <= 300 ms, search-as-you-type answers p95 <= 150 ms.

- First page load: a fresh browser context per load (empty browser cache), Navigation Timing read
  in the page (`loadEventEnd`, from navigation start); the very first load of each page is shown
  apart (the server's caches are cold), p50/p95 over the others; for the Overview and Settings
  also the time until the data their script fetches after load has arrived (first, p50, p95).
- Search as you type: queries typed a key at a time (50 ms apart, a quick typist) into the box;
  every /api/search request the debounced page sends is timed by the browser (Resource Timing of
  the response, start to end), and each settled query's in-page time (fetch + render, measured with
  performance.now) is read from the page.
- The UI is the one the service hosts, as `ctx up` gives it to a user: the service is started
  (state under the bench's folder, any free port), the project registered with `--watch`, and the
  pages are loaded once its schedules are up. `--standalone` serves it from `ctx ui --standalone`
  instead (a process of its own; the first pages then also pay LanceDB's import).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from uibench import ROOT, ServiceUi, UiProcess, ensure_indexed, launch

QUERIES = [
    "queryset filter lookups",
    "middleware that handles exceptions",
    "send an email with attachments",
    "template rendering context processors",
    "validate form fields and report errors",
    "session cookie signing",
    "url routing with converters",
    "database connection pooling and transaction commit",
    "get_object_or_404",
    "ModelAdmin list_display",
    "cache backend timeout",
    "csrf token check failure",
    "paginator page out of range",
    "migration autodetector renamed field",
    "static files storage manifest",
    "signal receivers disconnect",
    "json serializer for datetime",
    "prefetch_related on a generic relation",
    "password hasher upgrade",
    "select_for_update skip locked",
]
PAGES = ["/", "/search", "/sessions", "/knowledge", "/sources", "/analytics", "/settings"]
DATA_AFTER_LOAD = {"/", "/settings"}  # pages whose script fetches their data once loaded (data-ready timed too)


def log(msg: str) -> None:
    print(f"[bench ui] {msg}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def page_loads(browser: Any, url: str, path: str, n: int) -> dict[str, Any]:
    loads, ready = [], []
    for _ in range(n):
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        t0 = time.perf_counter()
        page.goto(url.rstrip("/") + path, wait_until="load")
        if path in DATA_AFTER_LOAD:
            page.wait_for_selector("body[data-ready='1']", timeout=120_000)
            ready.append((time.perf_counter() - t0) * 1000)
        nav = page.evaluate("JSON.stringify(performance.getEntriesByType('navigation')[0])")
        loads.append(float(json.loads(nav)["loadEventEnd"]))
        context.close()
    # The first load of a page pays once for what the server caches (templates, settings, the lake).
    out: dict[str, Any] = {"page": path, "n": n, "first_ms": round(loads[0], 1),
                           "load_p50_ms": round(statistics.median(loads[1:] or loads), 1),
                           "load_p95_ms": round(pct(loads[1:] or loads, 0.95), 1), "load_max_ms": round(max(loads), 1)}
    if ready:
        out["data_first_ms"] = round(ready[0], 1)
        out["data_ready_p50_ms"] = round(statistics.median(ready), 1)
        out["data_ready_p95_ms"] = round(pct(ready, 0.95), 1)
    return out


def search_as_you_type(browser: Any, url: str, kind: str) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(url + "search", wait_until="load")
    if kind != "all":
        page.select_option("#kind", kind)
    timings: list[float] = []
    page.on("requestfinished", lambda r: timings.append(r.timing["responseEnd"]) if "/api/search" in r.url else None)
    box = page.locator("#q")
    # Warm-up: the first query of a fresh process opens the lake (a user's service is already warm).
    with page.expect_response(lambda r: "/api/search" in r.url, timeout=120_000):
        box.fill("warm up the lake")
    page.wait_for_selector("#results[data-state='done']", state="attached", timeout=120_000)
    timings.clear()
    settled: list[float] = []
    for query in QUERIES:
        box.fill("")
        page.wait_for_selector("#results[data-state='idle']", state="attached", timeout=60_000)
        box.press_sequentially(query, delay=50)
        # The answer to the whole query (a slow keystroke may have sent a prefix first).
        page.wait_for_selector(f"#results[data-state='done'][data-q='{query}']", state="attached", timeout=120_000)
        status = page.text_content("#search-status") or ""
        if " in " in status:
            settled.append(float(status.rsplit(" in ", 1)[1].split()[0]))
    time.sleep(0.3)
    context.close()
    return {"kind": kind, "queries": len(QUERIES), "requests": len(timings),
            "request_p50_ms": round(statistics.median(timings), 1) if timings else None,
            "request_p95_ms": round(pct(timings, 0.95), 1), "request_max_ms": round(max(timings), 1) if timings else None,
            "settled_p50_ms": round(statistics.median(settled), 1) if settled else None,
            "settled_p95_ms": round(pct(settled, 0.95), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", type=Path, help="an existing folder to serve (default: django from the mirror)")
    parser.add_argument("--mirrors", type=Path, default=ROOT.parent / ".mirror")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "ctx-bench-ui")
    parser.add_argument("--profile", default="static", help="embedding profile used to index")
    parser.add_argument("--loads", type=int, default=10, help="page loads per page")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", choices=["pages", "search"], help="run one half")
    parser.add_argument("--standalone", action="store_true",
                        help="serve the UI from `ctx ui --standalone` instead of the service (`ctx up`)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    repo = args.repo or args.workdir / "django"
    mirror = None if args.repo else args.mirrors / "swe-bench+django__django" / "repo"
    env = {**os.environ, "CTX_HOME": str(args.workdir / "home"), "CTX_EMBED_MODEL": args.profile,
           "PREFECT_HOME": str(args.workdir / "prefect"), "HF_HUB_OFFLINE": "1"}
    env.pop("CTX_EMBED_PROVIDER", None)
    ensure_indexed(repo, mirror, env, log)
    load = os.getloadavg()
    ui: UiProcess | ServiceUi = UiProcess(repo, env) if args.standalone else ServiceUi(repo, env)
    log(f"UI at {ui.url} ({'standalone' if args.standalone else 'service'})")
    try:
        with sync_playwright() as pw:
            browser = launch(pw)
            results: dict[str, Any] = {"repo": str(repo.name), "host": "standalone" if args.standalone else "service",
                                       "loadavg_before": [round(x, 2) for x in load],
                                       "pages": [], "search": []}
            for path in PAGES if args.only != "search" else []:
                row = page_loads(browser, ui.url, path, args.loads)
                results["pages"].append(row)
                log(json.dumps(row))
            for kind in ("code", "all") if args.only != "pages" else ():
                row = search_as_you_type(browser, ui.url, kind)
                results["search"].append(row)
                log(json.dumps(row))
            results["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
            browser.close()
    finally:
        ui.stop()
    print(f"web UI on {results['repo']}, served by the {results['host']} (load average {results['loadavg_before']} -> {results['loadavg_after']})")
    print(f"{'page':<12} {'first':>9} {'load p50':>9} {'load p95':>9} {'data first':>11} {'data p50':>9} "
          f"{'data p95':>9}   (target: load <= 300 ms)")
    for row in results["pages"]:
        print(f"{row['page']:<12} {row['first_ms']:>9} {row['load_p50_ms']:>9} {row['load_p95_ms']:>9} "
              f"{row.get('data_first_ms', '-')!s:>11} {row.get('data_ready_p50_ms', '-')!s:>9} "
              f"{row.get('data_ready_p95_ms', '-')!s:>9}")
    print(f"{'search':<12} {'requests':>9} {'req p50':>9} {'req p95':>9} {'settled p95':>12}   (target: p95 <= 150 ms)")
    for row in results["search"]:
        print(f"{row['kind']:<12} {row['requests']:>9} {row['request_p50_ms']!s:>9} {row['request_p95_ms']!s:>9} "
              f"{row['settled_p95_ms']!s:>12}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
