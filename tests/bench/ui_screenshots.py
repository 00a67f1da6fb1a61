"""Regenerate the README's screenshots of the web UI: docs/screenshots/<page>.png at 1280x800.

    .venv/bin/python tests/bench/ui_screenshots.py [--out docs/screenshots]

Builds the small shop project of the browser tests (real index and ingest, fake embedder) in a
temporary folder, adds a knowledge record, serves the UI and photographs each page with Debian's
Chromium.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "web")]
os.environ.setdefault("PREFECT_HOME", tempfile.mkdtemp(prefix="ctx-shots-prefect-"))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")  # a busy 2-core machine is slow to start it


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=HERE.parents[1] / "docs" / "screenshots")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright
    from uibench import launch
    from uisite import ui_site

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.api.context_search import remember

    args.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="ctx-shots-"))
    with ui_site(base) as site:
        saved = {k: os.environ.get(k) for k in site.env}
        os.environ.update(site.env)
        try:
            settings = load_settings(site.repo)
            remember(settings, "decision", "Refunds go out as vouchers", "Finance: vouchers keep the money in the shop.",
                     tags=["billing"])
            remember(settings, "error", "Label printer times out on large parcels",
                     "Raise the printer timeout to 30 s; the driver blocks while it rasterises.", tags=["shipping"])
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        with sync_playwright() as pw:
            browser = launch(pw)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            shots = {"overview": "", "sessions": "sessions", "knowledge": "knowledge", "sources": "sources",
                     "analytics": "analytics", "settings": "settings"}
            for name, path in shots.items():
                page.goto(site.url + path)
                if name == "overview":
                    page.wait_for_selector("body[data-ready='1']")
                page.screenshot(path=str(args.out / f"{name}.png"))
            page.goto(site.url + "search")
            page.locator("#q").press_sequentially("refund voucher", delay=20)
            page.wait_for_selector("#results[data-state='done']")
            page.locator("#results .hit-open").first.click()
            page.wait_for_selector("#viewer .hit-line")
            page.screenshot(path=str(args.out / "search.png"))
            page.goto(site.url + "sessions")
            page.locator("ol.timeline a").first.click()
            page.wait_for_selector("ol.messages")
            page.screenshot(path=str(args.out / "session.png"))
            narrow = browser.new_page(viewport={"width": 420, "height": 800})
            narrow.goto(site.url + "search")
            narrow.locator("#q").press_sequentially("label printer", delay=20)
            narrow.wait_for_selector("#results[data-state='done']")
            narrow.screenshot(path=str(args.out / "search-narrow.png"))
            browser.close()
    for png in sorted(args.out.glob("*.png")):
        print(png.relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
