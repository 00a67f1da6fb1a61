"""The benchmarks' own helpers: the memory sampler counts each process of a tree once; the history bench checks its disk first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_history_bench_stops_before_generating_what_the_disk_cannot_hold(tmp_path: Path) -> None:
    from bench_history import check_free_disk

    check_free_disk(tmp_path / "new" / "workdir", 10, 70)  # a folder not made yet: its disk is asked
    with pytest.raises(SystemExit, match=r"this run needs about .* pass --workdir on a bigger disk"):
        check_free_disk(tmp_path / "workdir", 10**9, 70)
    assert not (tmp_path / "workdir").exists()
