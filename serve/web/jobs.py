"""Background jobs of the web UI (add / update / remove a source): the real `ctx` command in a child
process, its output lines kept as live progress for the page to poll.

A child process, not a thread of the service: the command changes folder and environment (per
process), may run a Prefect flow for minutes, and must not take the service down when it fails.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread

MAX_LINES = 200
KEEP_JOBS = 50
# Runs the CLI in-process in the child (not through the thin client: the service would run it in
# its own process, and the page would see no progress until the end).
CHILD = "import sys; from ctxlake.serve.cli.app import run; sys.exit(run(sys.argv[1:]))"


@dataclass
class Job:
    id: str
    title: str
    argv: list[str]
    cwd: str
    state: str = "queued"  # queued | running | done | failed
    started: float = field(default_factory=time.time)
    finished: float | None = None
    code: int | None = None
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LINES))
    output: str = ""

    def as_dict(self) -> dict[str, Any]:
        end = self.finished or time.time()
        return {"id": self.id, "title": self.title, "state": self.state, "code": self.code,
                "elapsed_s": round(end - self.started, 1), "lines": list(self.lines), "output": self.output[-4000:]}


class Jobs:
    """One job per source at a time; the newest KEEP_JOBS are kept for polling."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._ids = itertools.count(1)

    def start(self, title: str, argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Job:
        with self._lock:
            busy = [j for j in self._jobs.values() if j.state in ("queued", "running") and j.cwd == str(cwd)]
            if busy:
                from ctxlake.errors import InputError

                raise InputError(f"another job runs in this project: {busy[0].title}", hint="wait for it to finish")
            job = Job(id=str(next(self._ids)), title=title, argv=argv, cwd=str(cwd))
            self._jobs[job.id] = job
            for old in list(self._jobs)[:-KEEP_JOBS]:
                del self._jobs[old]
        threading.Thread(target=self._run, args=(job, env), name=f"ui-job-{job.id}", daemon=True).start()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def _run(self, job: Job, env: dict[str, str] | None) -> None:
        job.state = "running"
        job.lines.append(f"$ ctx {' '.join(job.argv)}")
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
        try:
            # Ends with the process that serves the UI, `kill -9` included (see children.py).
            proc = on_lifetime_thread(lambda: subprocess.Popen(
                dying_with_this_process([sys.executable, "-c", CHILD, *job.argv]), cwd=job.cwd, env=child_env,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                errors="replace"))
        except OSError as exc:
            job.lines.append(f"could not start: {exc}")
            job.state, job.code, job.finished = "failed", -1, time.time()
            return
        out: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            out.append(line)
            if line.strip() and not line.lstrip().startswith("{") and not line.startswith((" ", "}", "]")):
                job.lines.append(line[:500])
        job.code = proc.wait()
        job.output = "\n".join(out)
        job.lines.append("finished" if job.code == 0 else f"failed (exit {job.code})")
        job.state = "done" if job.code == 0 else "failed"
        job.finished = time.time()
