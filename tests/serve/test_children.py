"""Children that end with the process that started them (serve/service/children.py), in a real
parent process that has LanceDB's runtime running, as the service and the CLI's flow runs have."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from helpers import gone_within

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")

# The parent: opens a lake (LanceDB's runtime up), starts a sleeper from a short-lived thread through
# `on_lifetime_thread`, lets that thread end, prints the sleeper's pid and waits to be killed.
PARENT = """
import subprocess, sys, threading, time
import lancedb
from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread

db = lancedb.connect(sys.argv[1])
db.create_table("t", [{"a": 1}])
started = []
def request():
    started.append(on_lifetime_thread(lambda: subprocess.Popen(
        dying_with_this_process([sys.executable, "-c", "import time; time.sleep(120)"]))))
worker = threading.Thread(target=request)
worker.start()
worker.join()
print(started[0].pid, flush=True)
time.sleep(120)
"""


def test_a_child_outlives_the_thread_that_asked_for_it_and_dies_with_the_process(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "lake")], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), parent.communicate(timeout=30)[1][-2000:]
        child = int(line)
        time.sleep(0.5)  # the thread that asked for it is gone: the child stays
        assert psutil.pid_exists(child) and psutil.Process(child).ppid() == parent.pid
        assert "time.sleep(120)" in " ".join(psutil.Process(child).cmdline())  # the launcher exec'd it
        os.kill(parent.pid, signal.SIGKILL)
        assert gone_within(child, 5), "the child outlived its parent's kill -9"
        _, err = parent.communicate(timeout=30)
        # Spawned without a preexec_fn: no fork, so no LanceDB fork handler and no warning of it.
        assert "fork" not in err, err[-2000:]
    finally:
        if parent.poll() is None:
            parent.kill()
