"""The lake's writer lock (tasks/lake.py WriterLock) when the disk is full as it is taken."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctxlake.errors import LockBusyError
from ctxlake.tasks import lake
from ctxlake.tasks.lake import WriterLock


def test_a_full_disk_while_taking_the_lock_leaves_it_releasable(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner record failed to write (ENOSPC) after the flock was taken, before the lock kept
    its descriptor: the error escaped with the lock held for the life of the process, and a
    long-lived service then refused every later ingest with "another writer holds the lake: pid ?"."""
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lake.os, "write", full)
    first = WriterLock(tmp_path).acquire()
    monkeypatch.setattr(lake.os, "write", real_write)
    with pytest.raises(LockBusyError):  # held, as the run that took it goes on
        WriterLock(tmp_path).acquire()
    first.release()
    again = WriterLock(tmp_path).acquire()  # and free once that run ends
    assert again.owner()["pid"] == os.getpid()
    again.release()


def test_a_killed_writer_not_yet_reaped_counts_as_gone_when_the_next_takes_the_lock(tmp_path: Path) -> None:
    """A killed index child of a living service is a zombie until the service reaps it: signal 0
    still reaches it, and the next writer did not say it took over a lock left behind."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom ctxlake.tasks.lake import WriterLock\n"
         "from pathlib import Path\n"
         f"WriterLock(Path({str(tmp_path)!r})).acquire()\nprint('held', flush=True)\ntime.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        os.kill(holder.pid, signal.SIGKILL)
        stat = Path(f"/proc/{holder.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":  # exited; not waited for
            assert time.monotonic() < deadline, "the holder did not die"
            time.sleep(0.02)
        assert not lake.pid_alive(holder.pid)
        assert lake.pid_alive(os.getpid())
        lock = WriterLock(tmp_path).acquire()
        assert lock.took_over_from == holder.pid
        lock.release()
    finally:
        holder.kill()
        holder.wait()
