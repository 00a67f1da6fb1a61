"""The resident service: accepts requests on a 0600 Unix socket and runs them in this warm process.

Started by `ctx up` (detached, in its own session) or `ctx up --foreground`. One per user: the
flock on service.lock is held for the process's life, so a stale pid or socket after a SIGKILL is
recognised (the lock is free) and replaced.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import gc
import os
import signal
import socket
import sys
import threading
import time
import traceback
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

from ctxlake import __version__
from ctxlake.serve.service import capture
from ctxlake.serve.service.capture import log
from ctxlake.serve.service.paths import ServicePaths, service_paths, write_private_json
from ctxlake.serve.service.request_handling import RequestHandling, rss_bytes
from ctxlake.serve.service.watchers import imports_ready
from ctxlake.tasks.heap import bound_heap, bound_index_builds

EXIT_DISK = 8
HOUSEKEEPING_S = 2.0  # how often deleted project folders are dropped and idle lakes evicted
# Queries, watcher batches and ingests free their buffers, but glibc keeps the freed pages for
# reuse, and an idle service would hold them. Once the process has done this many CPU seconds of
# work since it last gave them back, and then used under IDLE_CPU_SHARE of a core for one
# housekeeping interval, it gives them back (malloc_trim, while idle). An idle service still
# uses ~2% of a core (Prefect's runner polls its server), which stays under the share and takes
# ~100 s to add up to a trim.
TRIM_AFTER_CPU_S = 2.0
IDLE_CPU_SHARE = 0.10
# accept() errors that pass (descriptors or memory short for a moment), how long to wait after
# one, and how often to log them while they last.
ACCEPT_RETRY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                                 errno.EPROTO, errno.EINTR})
ACCEPT_RETRY_S = 0.1
ACCEPT_LOG_EVERY_S = 10.0
MAX_SOCKET_PATH = 100  # sun_path holds 104-108 bytes depending on the OS  # LakeError's code: the state under $CTX_HOME cannot be written


class Service(RequestHandling):
    def __init__(self, paths: ServicePaths, watch: list[Path]) -> None:
        self.paths = paths
        self.started = time.time()
        self.stopping = threading.Event()
        self._accept_logged = -ACCEPT_LOG_EVERY_S  # when a failed accept was last logged
        self._listener: socket.socket | None = None
        self._lock_fh: IO[str] | None = None
        self._cli_lock = threading.Lock()  # cwd and os.environ are per process: one CLI request at a time
        self.initial_watch = watch
        self.orchestrator: Any = None
        self.orchestrator_note = "not started"
        self.ui: Any = None
        self.ui_note = "not started"
        from ctxlake.serve.service.engine import EngineCache, install
        from ctxlake.serve.service.watchers import Watchers

        self.engine = EngineCache(idle_evict_s=float(os.environ.get("CTX_SERVICE_IDLE_EVICT_S", "1800")))
        install(self.engine)
        self.watchers = Watchers(self.engine, on_drop=log)
        self._last_schedules: list[dict[str, Any]] = []
        self.watch_state_shared = threading.Event()  # the read layer follows the watchers from then on

    # -- lifecycle -------------------------------------------------------------------------------

    def acquire(self) -> bool:
        """Take the service lock; False when another service holds it."""
        self.paths.ensure_dir()
        fh = open(self.paths.lock, "a+")  # noqa: SIM115 - held for the process's life
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            return False
        self._lock_fh = fh
        return True

    def bind(self) -> None:
        sock_path = self.paths.socket
        if len(os.fsencode(sock_path)) > MAX_SOCKET_PATH:
            raise SystemExit(f"ctx: error: the socket path {sock_path} is too long for a Unix socket; "
                             "set CTX_HOME to a shorter folder")
        # We hold the lock, so any socket file here is left by a dead service.
        if sock_path.is_dir() and not sock_path.is_symlink():
            raise SystemExit(f"ctx: error: {sock_path} is a folder where the service's socket belongs; "
                             "move it away and run `ctx up` again")
        if sock_path.exists() or sock_path.is_symlink():
            log(f"replacing a stale socket {sock_path}")
            sock_path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # created 0600: no window in which another user could connect
        try:
            listener.bind(str(sock_path))
        finally:
            os.umask(old)
        os.chmod(sock_path, 0o600)
        listener.listen(64)
        self._listener = listener

    def write_info(self) -> None:
        info = {"pid": os.getpid(), "started": self.started, "socket": str(self.paths.socket),
                "version": __version__, "log": str(self.paths.log), "ui_url": self.ui.url if self.ui else None,
                # `ctx schedule` finds the persistent Prefect server here.
                "prefect_api_url": self.orchestrator.api_url if self.orchestrator is not None else None}
        write_private_json(self.paths.info, info)

    def _warm_then_orchestrate(self) -> None:
        started = time.monotonic()
        try:
            _warm_imports()
            # What the imports made lives as long as the process: out of the collector's way, so
            # the full collections (the idle trim's included) walk only what requests leave.
            gc.collect()
            gc.freeze()
            log(f"imports warmed in {time.monotonic() - started:.1f} s")
        except Exception as exc:  # each path imports what it needs itself anyway
            log(f"warming imports failed: {exc!r}")
        finally:
            imports_ready.set()
        self.start_orchestrator()

    def start_orchestrator(self) -> None:
        try:
            from ctxlake.serve.service.orchestrator import Orchestrator  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            self.orchestrator_note = "absent (serve/service/orchestrator.py is not in this build)"
            log(f"orchestrator {self.orchestrator_note}")
            return
        try:
            from ctxlake.schemas.config import load_settings

            home = self.paths.home
            settings = load_settings(home)
            if not settings.service.schedules:
                self.orchestrator_note = "off ([service] schedules = false)"
                log(f"orchestrator {self.orchestrator_note}")
                return
            orchestrator = Orchestrator(home, settings)
            self.orchestrator_note = "starting"
            orchestrator.start()
            if orchestrator.missed_runs_dropped:
                log(f"dropped {orchestrator.missed_runs_dropped} scheduled run(s) missed while the service was down")
            # Projects watched so far get their deployments before the API URL is published, so the
            # first `ctx schedule list` already shows them; a project that registers while this runs
            # is caught by the second pass (register_project skips the ones it has).
            for root in self.watchers.roots():
                orchestrator.register_project(Path(root))
            self.orchestrator = orchestrator
            for root in self.watchers.roots():
                orchestrator.register_project(Path(root))
            self.orchestrator_note = f"up at {orchestrator.api_url}"
            self.write_info()
        except Exception as exc:  # the service still serves queries without schedules
            self.orchestrator_note = f"failed: {exc}"
            log(f"orchestrator failed to start: {exc!r}\n{traceback.format_exc()}")

    def _share_watch_state(self) -> None:
        # On a thread: the read layer's import (pyarrow, lancedb) must not delay listening.
        from ctxlake.serve.api.watched import use_watch_state

        use_watch_state(self.watchers.state, self.watchers.settle)
        self.watch_state_shared.set()

    def start_ui(self) -> None:
        """The web UI on 127.0.0.1 in a thread of this process: it shares the warm engine."""
        try:
            from ctxlake.schemas.config import load_settings
            from ctxlake.serve.web.server import service_ui

            ui = load_settings(self.paths.home).ui
            if not ui.enabled:
                self.ui_note = "off ([ui] enabled = false)"
                return
            self.ui = service_ui(self.watchers.roots, lambda: self.orchestrator, ui.port)
            self.ui_note = f"up at {self.ui.url}"
            log(f"web UI at {self.ui.url}")
        except Exception as exc:  # queries and schedules still work without the UI
            self.ui_note = f"failed: {exc}"
            log(f"web UI failed to start: {exc!r}")

    def serve_forever(self) -> None:
        assert self._listener is not None
        capture.install()
        self.start_ui()
        self.write_info()
        # One thread imports the heavy modules, then starts the orchestrator: two threads importing
        # Prefect at once once failed with a circular-import error; watcher batches wait for it too.
        imports_ready.clear()
        threading.Thread(target=self._warm_then_orchestrate, name="orchestrator", daemon=True).start()
        threading.Thread(target=self._housekeeping, name="housekeeping", daemon=True).start()
        threading.Thread(target=self._share_watch_state, name="freshness", daemon=True).start()
        for folder in self.initial_watch + self.remembered():
            self.register(folder)
        log(f"listening on {self.paths.socket}")
        self._listener.settimeout(0.5)
        while not self.stopping.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self.stopping.is_set():
                    break
                if exc.errno not in ACCEPT_RETRY_ERRNOS:
                    raise
                # Out of descriptors (a client holding thousands of connections, or LanceDB's open
                # files): the waiting connections stay queued; take them once some are closed.
                self._accept_failed(exc)
                time.sleep(ACCEPT_RETRY_S)
                continue
            try:
                threading.Thread(target=self._handle, args=(conn,), name="request", daemon=True).start()
            except RuntimeError as exc:  # no thread left to start: this client is refused, not the service
                conn.close()
                self._accept_failed(exc)
        self.shutdown()

    def _accept_failed(self, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._accept_logged >= ACCEPT_LOG_EVERY_S:
            self._accept_logged = now
            log(f"cannot take a connection now ({exc}); retrying")

    def _housekeeping(self) -> None:
        cpu_seen = cpu_trimmed = time.process_time()
        while not self.stopping.wait(HOUSEKEEPING_S):
            for root in self.engine.evict_idle():
                log(f"evicted idle project {root}")
            if self.watchers.drop_missing():
                self.remember()
            cpu = time.process_time()  # all threads of the service
            if cpu - cpu_seen < IDLE_CPU_SHARE * HOUSEKEEPING_S and cpu - cpu_trimmed >= TRIM_AFTER_CPU_S:
                from ctxlake.tasks.heap import give_back_freed_memory

                before, started = rss_bytes(), time.perf_counter()
                # Garbage in reference cycles first: Python's full collection seldom runs in a
                # process with this many long-lived objects, and cyclic garbage keeps Arrow and
                # LanceDB buffers alive (on django after a batch, a search and five edits:
                # collect + trim 412 -> 377 MB, trim alone 415 -> 412).
                gc.collect()
                give_back_freed_memory()
                log(f"idle: gave freed memory back in {time.perf_counter() - started:.2f} s, "
                    f"RSS {before >> 20} -> {rss_bytes() >> 20} MB")
                cpu_trimmed = cpu = time.process_time()
            cpu_seen = cpu

    def shutdown(self) -> None:
        log("stopping")
        if self.ui is not None:
            with suppress(Exception):
                self.ui.stop()
        self.watchers.stop_all()
        if self.orchestrator is not None:
            try:
                self.orchestrator.stop()
            except Exception as exc:
                log(f"orchestrator stop failed: {exc!r}")
        if self._listener is not None:
            self._listener.close()
        for path in (self.paths.socket, self.paths.info):
            with suppress(FileNotFoundError):
                path.unlink()
        stop_children()
        log("stopped")
        if self._lock_fh is not None:
            self._lock_fh.close()  # releases the flock last: until here the service is "alive"


def stop_children(grace_s: float = 5.0) -> None:
    """Terminate what this process started (e.g. Prefect's temporary API server): no orphans."""
    import psutil

    children = psutil.Process().children(recursive=True)
    for child in children:
        with suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with suppress(psutil.NoSuchProcess):
            child.kill()
    if children:
        log(f"stopped {len(children)} child process(es)")


def _warm_imports() -> None:
    """Import the CLI, the read API, LanceDB and a watcher batch's pipeline now, so that neither
    the first forwarded command, the web UI's first page of data nor the first edit after `ctx up`
    pays for them (the pipeline's import, Prefect's included, made the first watcher batch on
    django take 2.4 s instead of 0.4; LanceDB's, imported only when a lake is first opened, was
    ~1 s of the UI Overview's first 1.3-1.6 s)."""
    import ctxlake.flows.watch_code
    import ctxlake.serve.api.code_search
    import ctxlake.serve.api.context_search
    import ctxlake.serve.api.index_status
    import ctxlake.serve.api.memory_sessions
    import ctxlake.serve.api.overview
    import ctxlake.serve.api.source_queries
    import ctxlake.serve.cli.app  # noqa: F401
    from ctxlake.tasks.lake import import_lancedb

    import_lancedb()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ctx-service")
    parser.add_argument("--watch", action="append", default=[], type=Path)
    args = parser.parse_args(argv)
    # Measured on django (one watcher batch, a hybrid search, five edits): 443-458 -> 396-410 MB.
    bound_heap()
    bound_index_builds()
    # Before Prefect is first imported (it reads these once): the flows that commands run here
    # keep Prefect's INFO lines out of the output they hand back, as they do in-process.
    # (`-v` commands run in their client: client.runs_locally.)
    from ctxlake.serve.cli.base import _prefect_quietly

    _prefect_quietly(verbose=False)
    paths = service_paths()
    service = Service(paths, list(args.watch))
    try:
        if not service.acquire():
            log("another service holds the lock; not starting a second one")
            return 0
        service.bind()
        service.write_info()
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            print(f"ctx: error: cannot write the service state under {paths.dir}: {exc.strerror}",
                  file=sys.stderr)
            return EXIT_DISK
        raise
    os.chdir(paths.home)
    signal.signal(signal.SIGTERM, lambda *_: service.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: service.stopping.set())
    service.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
