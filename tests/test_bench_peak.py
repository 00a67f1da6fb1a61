"""The benchmarks' memory sampler counts each process of a tree once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "bench"))

from bench_index import PeakRSS

# Touches 200 MB, then starts `true` through a fork that waits a second before it execs.
CHILD = """
import subprocess, time
block = bytearray(200 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1
subprocess.run(["true"], preexec_fn=lambda: time.sleep(1.0))
"""


def test_a_fork_that_has_not_exec_d_is_not_counted_twice() -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    sampler = PeakRSS(proc.pid)
    assert proc.wait(timeout=60) == 0
    peak_mb = sampler.stop() / 2**20
    assert 200 <= peak_mb < 320, peak_mb  # counted twice it is ~410
