"""Shared by bench_ui.py and ui_screenshots.py: materialise and index a repository, start the web UI
as its own process (`ctx ui --standalone`), and open Debian's Chromium with Playwright."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CTX = Path(sys.executable).parent / "ctx"
CHROMIUM = "/usr/bin/chromium"


def ensure_indexed(repo: Path, mirror: Path | None, env: dict[str, str], log: Any) -> None:
    """Index `repo` (materialised from the bare `mirror` first when absent); a no-op when up to date."""
    if not repo.exists():
        if mirror is None or not mirror.exists():
            raise SystemExit(f"no repository at {repo} and no mirror to build it from ({mirror}); "
                             "fetch one (e.g. github:django/django) or pass --mirrors")
        sys.path.insert(0, str(Path(__file__).parent))
        from bench_index import materialise

        log(f"materialising {mirror} into {repo}")
        materialise(mirror, repo)
    started = time.perf_counter()
    proc = subprocess.run([str(CTX), "run", "index", str(repo)], cwd=repo, env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ctx run index failed:\n{proc.stderr[-3000:]}")
    log(f"indexed {repo} in {time.perf_counter() - started:.1f} s: {proc.stdout.strip().splitlines()[-1]}")


class UiProcess:
    """`ctx ui --standalone` for one project, in its own process as the service would host it."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([str(CTX), "ui", "--standalone", "--no-open", "--json", "--port", "0"], cwd=repo,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"ctx ui did not start:\n{self.proc.stderr.read() if self.proc.stderr else ''}")
        self.url: str = json.loads(line)["url"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def launch(playwright: Any) -> Any:
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
