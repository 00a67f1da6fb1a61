"""Start, find and stop the service process; standard library only (autostart runs it from the client)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ctxlake.serve.service import protocol
from ctxlake.serve.service.paths import ServicePaths, write_private_json
from ctxlake.tasks.lake import pid_alive

START_TIMEOUT_S = 60.0


def ping(paths: ServicePaths, timeout: float = 2.0, reply_timeout: float | None = None) -> dict[str, Any] | None:
    """The running service's info, or None when nothing answers on the socket. `timeout` bounds the
    connect (instant when no service listens); `reply_timeout` (default: the same) the answer, which
    on a busy machine can take seconds (the info asks Prefect for the schedules)."""
    try:
        sock = protocol.connect(str(paths.socket), timeout=timeout)
    except OSError:
        return None
    try:
        with sock:
            sock.settimeout(timeout if reply_timeout is None else reply_timeout)
            protocol.send(sock, {"op": "ping", "v": protocol.PROTOCOL_VERSION})
            reply = protocol.recv(sock)
    except (OSError, protocol.ProtocolError):
        return None
    return reply if reply.get("op") == "pong" else None


def lock_is_held(paths: ServicePaths) -> bool:
    """True while a service process holds its lock (alive, even if not answering yet)."""
    if not paths.lock.exists():
        return False
    with open(paths.lock, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def read_info(paths: ServicePaths) -> dict[str, Any] | None:
    try:
        data = json.loads(paths.info.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def start_detached(paths: ServicePaths, *, watch: list[Path] | None = None, quiet: bool = False,
                   timeout_s: float = START_TIMEOUT_S) -> dict[str, Any] | None:
    """Start the service in its own session unless one runs; returns its info once it answers.

    A `start.lock` flock serialises concurrent starters: the second waits, then finds the first's
    service answering and starts nothing.
    """
    paths.ensure_dir()
    with open(paths.start_lock, "a+") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        info = ping(paths)
        if info is not None:
            if watch:
                _register(paths, watch)
            return info
        argv = [sys.executable, "-m", "ctxlake.serve.service.daemon"]
        for folder in watch or []:
            argv += ["--watch", str(folder)]
        with open(paths.log, "ab") as log:
            os.chmod(paths.log, 0o600)
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                close_fds=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            info = ping(paths, timeout=1.0)
            if info is not None:
                return info
            code = proc.poll()
            if code is not None:
                if not quiet:
                    print(f"ctx: the service exited at start (code {code}); see {paths.log}", file=sys.stderr)
                return None
            time.sleep(0.05)
        if not quiet:
            print(f"ctx: the service did not answer within {timeout_s:.0f} s; see {paths.log}", file=sys.stderr)
        return None


def _register(paths: ServicePaths, folders: list[Path]) -> None:
    sock = protocol.connect(str(paths.socket), timeout=5.0)
    with sock:
        protocol.send(sock, {"op": "watch", "v": protocol.PROTOCOL_VERSION,
                             "paths": [str(f.resolve()) for f in folders]})
        protocol.recv(sock)


def stop(paths: ServicePaths, timeout_s: float = 30.0) -> int | None:
    """Ask the service to stop, wait for its lock to be released; SIGTERM then SIGKILL its group if stuck.

    Returns the pid that was stopped, or None when no service was running.
    """
    info = read_info(paths)
    pid = int(info["pid"]) if info and "pid" in info else None
    answered = False
    try:
        sock = protocol.connect(str(paths.socket), timeout=2.0)
        with sock:
            protocol.send(sock, {"op": "stop", "v": protocol.PROTOCOL_VERSION})
            answered = protocol.recv(sock).get("op") == "stopping"
    except (OSError, protocol.ProtocolError):
        pass
    if not answered and not lock_is_held(paths):
        reap_prefect_server(paths)  # no service, perhaps a server a killed one left
        return None
    deadline = time.monotonic() + timeout_s
    sig = signal.SIGTERM
    while lock_is_held(paths):
        if time.monotonic() > deadline and pid is not None:
            try:
                os.killpg(pid, sig)  # the service leads its session: its children go with it
            except ProcessLookupError:
                break
            if sig == signal.SIGKILL:
                break
            sig, deadline = signal.SIGKILL, time.monotonic() + 5.0
        time.sleep(0.05)
    # The lock is released just before the process exits: wait for the exit itself.
    while pid is not None and pid_alive(pid) and time.monotonic() < deadline + 10.0:
        time.sleep(0.05)
    if not lock_is_held(paths):
        reap_prefect_server(paths)  # a service killed here had no chance to stop its server
    return pid


def record_prefect_server(paths: ServicePaths, pid: int) -> None:
    """Note the Prefect server just started (0600), for reap_prefect_server."""
    import psutil

    write_private_json(paths.prefect_server, {"pid": pid, "started": psutil.Process(pid).create_time()})


def reap_prefect_server(paths: ServicePaths, grace_s: float = 10.0) -> int | None:
    """Stop the Prefect server a service started and did not stop (it died by kill -9, or was
    killed by `ctx down` while it hung): the server leads its own session, so the signal to the
    service's group missed it, and each `ctx up` after would have left one more. Only the process
    recorded (same pid and start time, a `prefect server` command line) is stopped. Returns its pid
    when one was stopped."""
    import psutil

    try:
        record = json.loads(paths.prefect_server.read_text(encoding="utf-8"))
        pid, started = int(record["pid"]), float(record["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    stopped = None
    try:
        server = psutil.Process(pid)
        if abs(server.create_time() - started) < 1.0 and "prefect" in " ".join(server.cmdline()):
            os.killpg(pid, signal.SIGTERM)
            stopped = pid
            try:
                server.wait(grace_s)
            except psutil.TimeoutExpired:
                os.killpg(pid, signal.SIGKILL)
    except (psutil.Error, ProcessLookupError, PermissionError):
        pass  # gone already, or a pid reused by someone else's process: nothing of ours to stop
    paths.prefect_server.unlink(missing_ok=True)
    return stopped
