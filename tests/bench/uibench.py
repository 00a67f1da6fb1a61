"""Shared by bench_ui.py and ui_screenshots.py: materialise and index a repository, serve the web UI
(hosted by the service, or as its own process with `ctx ui --standalone`), and open Debian's
Chromium with Playwright."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
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


class ServiceUi:
    """The UI as a user gets it: `ctx up --watch REPO` starts the service (state under the bench's
    CTX_HOME), and `ctx ui` reports the address of the UI the service hosts."""

    def __init__(self, repo: Path, env: dict[str, str]) -> None:
        self.env = {**env, "CTX_UI_PORT": "0"}  # any free port: never a user's running service's
        self.repo = repo
        up = subprocess.run([str(CTX), "up", "--watch", str(repo)], cwd=repo, env=self.env, capture_output=True,
                            text=True, check=False)
        if up.returncode != 0:
            raise SystemExit(f"ctx up failed:\n{up.stderr[-3000:]}")
        shown = subprocess.run([str(CTX), "ui", "--no-open", "--json"], cwd=repo, env=self.env, capture_output=True,
                               text=True, check=False)
        answer = json.loads(shown.stdout or "{}")
        if shown.returncode != 0 or answer.get("mode") != "service":
            self.stop()
            raise SystemExit(f"the service serves no UI: {shown.stdout.strip()} {shown.stderr[-2000:]}")
        self.url: str = answer["url"]
        # Measure the service as it runs once started: its orchestrator (the schedules) comes up
        # after the UI, within seconds.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not self.schedules():
            time.sleep(1.0)

    def schedules(self) -> list[Any]:
        host = self.url.split("/")[2]
        request = urllib.request.Request(self.url + "api/schedules", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=60) as res:
                return list(json.loads(res.read())["schedules"])
        except (OSError, ValueError, KeyError):
            return []

    def stop(self) -> None:
        subprocess.run([str(CTX), "down"], cwd=self.repo, env=self.env, capture_output=True, check=False, timeout=120)


def launch(playwright: Any) -> Any:
    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
