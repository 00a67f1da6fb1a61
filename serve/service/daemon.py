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
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import IO, Any, TypeVar

from ctxlake import __version__
from ctxlake.serve.api.cancel import abandoned, on_behalf
from ctxlake.serve.service import capture, protocol
from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread
from ctxlake.serve.service.paths import ServicePaths, ctx_home, service_paths, write_private_json
from ctxlake.serve.service.progress import PROGRESS_S, ProgressFeed
from ctxlake.serve.service.protocol import Busy
from ctxlake.serve.service.watchers import CHILD_NICE, WATCHER_PURPOSE, imports_ready
from ctxlake.tasks.heap import bound_heap, bound_index_builds
from ctxlake.tasks.progress import PROGRESS_FD_ENV, fd_of, fd_token

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
INDEX_WAIT_S = 60
BUSY_WAIT_S = 1.0  # a CLI request waits this long for the one before it, then runs in its client
# accept() errors that pass (descriptors or memory short for a moment), how long to wait after
# one, and how often to log them while they last.
ACCEPT_RETRY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED,
                                 errno.EPROTO, errno.EINTR})
ACCEPT_RETRY_S = 0.1
ACCEPT_LOG_EVERY_S = 10.0
CHILD_POLL_S = 0.25  # how often a waiting child run checks that its client is still there
CHILD_INTERRUPT_GRACE_S = 20.0  # after SIGINT, before SIGTERM
SETTLE_S = 0.08  # > the watcher's 50 ms quiet step; a miss only costs a full (correct) run
SETTLE_MAX_S = 10.0  # how long a `ctx run index` waits for a watcher batch under way
SCHEDULES_WAIT_S = 3.0  # `ctx status` shows the last schedules read when Prefect takes longer
T = TypeVar("T")
VALUE_OPTIONS = frozenset({"--wait", "--model", "--provider"})  # `ctx run index` options taking a value
MAX_SOCKET_PATH = 100  # sun_path holds 104-108 bytes depending on the OS  # LakeError's code: the state under $CTX_HOME cannot be written


def log(message: str) -> None:
    """One line in the service log (the real stderr; requests' streams are captured apart)."""
    stream = getattr(sys.stderr, "_fallback", sys.stderr)
    stream.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} ctx-service[{os.getpid()}] {message}\n")
    stream.flush()


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED); None where the platform cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


class Service:
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

    # -- requests --------------------------------------------------------------------------------

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                uid = peer_uid(conn)
                if uid is not None and uid != os.getuid():
                    log(f"refused a connection from uid {uid}")
                    protocol.send(conn, {"op": "error", "message": "refused: another user's service", "code": 2})
                    return
                conn.settimeout(30.0)
                try:
                    message = protocol.recv(conn)
                    protocol.check_fields(message)
                except protocol.ProtocolError as exc:
                    log(f"bad request: {exc}")
                    protocol.send(conn, {"op": "error", "message": f"bad request: {exc}", "code": 2})
                    return
                conn.settimeout(None)
                self._dispatch(conn, message)
        except (OSError, protocol.ProtocolError) as exc:
            log(f"connection ended: {exc!r}")
        except Exception as exc:  # a bug in one request must not take the service down
            log(f"request failed: {exc!r}")

    def _dispatch(self, conn: socket.socket, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "ping":
            protocol.send(conn, {"op": "pong", **self.info()})
        elif op == "stop":
            protocol.send(conn, {"op": "stopping", "pid": os.getpid()})
            self.stopping.set()
        elif op == "cli":
            protocol.send(conn, {"op": "accepted"})
            gone = threading.Event()
            with ExitStack() as stack:
                # A client on a terminal is shown its command's progress (it draws one status line).
                feed = stack.enter_context(ProgressFeed()) if message.get("stderr_tty") else None
                stack.enter_context(protocol.heartbeat(conn, gone=gone, progress=feed.changed if feed else None,
                                                       progress_every=PROGRESS_S))
                stack.enter_context(on_behalf(gone))
                if feed is not None:
                    message = {**message, "env": {**dict(message.get("env") or {}), PROGRESS_FD_ENV: fd_token(feed.fd)}}
                answer = self.run_cli(message)
            if gone.is_set():
                argv = " ".join(str(a) for a in message.get("argv", []))[:200]
                last = (str(answer.get("stderr") or "").strip().splitlines() or [""])[-1][:300]
                log(f"the client of `ctx {argv}` left before its answer (exit {answer.get('code')})"
                    + (f": {last}" if last else ""))
                return
            protocol.send(conn, answer)
        elif op == "watch":
            # Folders as the client resolved them: a relative one would be read from this process's folder.
            paths = [Path(p) for p in message["paths"]]
            if not all(p.is_absolute() for p in paths):
                protocol.send(conn, {"op": "error", "message": "watch: paths must be absolute", "code": 2})
                return
            added = [self.register(p) for p in paths]
            protocol.send(conn, {"op": "ok", "watching": added})
        elif op == "mcp":
            from ctxlake.serve.service.mcp_host import serve_connection

            serve_connection(self, conn, message)
        else:
            protocol.send(conn, {"op": "error", "message": f"unknown op {op!r}", "code": 2})

    def register(self, folder: Path) -> str | None:
        """Watch a project; its root when newly added, None when already watched (or not a folder)."""
        root = str(folder.resolve())
        if not self.watchers.add(Path(root)):
            return None
        self.remember()
        threading.Thread(target=self._first_check, args=(Path(root),), name="first check", daemon=True).start()
        if self.orchestrator is not None:
            try:
                self.orchestrator.register_project(Path(root))
            except Exception as exc:
                log(f"could not register {root} with the orchestrator: {exc!r}")
        return root

    def remember(self) -> None:
        """Write the watched roots down (0600, atomically) for the next start."""
        try:
            write_private_json(self.paths.watched, self.watchers.roots())
        except OSError as exc:  # a full disk: watching goes on, the next start just does not know
            log(f"could not record the watched projects: {exc}")

    def remembered(self) -> list[Path]:
        """The projects the last service watched whose folder and index still exist; the rest
        are left out (and out of the record, once the next registration rewrites it)."""
        try:
            roots = json.loads(self.paths.watched.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        from ctxlake.schemas.config import load_settings

        found = []
        for root in roots if isinstance(roots, list) else []:
            try:
                if isinstance(root, str) and (load_settings(Path(root)).lake_dir / "state.json").is_file():
                    found.append(Path(root))
                else:
                    log(f"not watching {root} again: no index there any more")
            except Exception as exc:  # an unreadable config: that project's own commands will say so
                log(f"not watching {root} again: {exc}")
        return found

    def _first_check(self, root: Path) -> None:
        """One walk of a newly watched project while it is quiet: from an up-to-date answer on,
        its freshness follows the watcher (serve/api/watched.py), so searches right after an edit
        do not each walk the tree."""
        from ctxlake.schemas.config import load_settings
        from ctxlake.serve.api.watched import project_freshness

        self.watch_state_shared.wait(60)
        try:
            project_freshness(load_settings(root))
        except Exception as exc:  # the first query makes the check instead
            log(f"first freshness check of {root} failed: {exc!r}")

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(), "uptime_s": round(time.time() - self.started, 1), "rss_bytes": rss_bytes(),
            "version": __version__, "socket": str(self.paths.socket), "watching": self.watchers.roots(),
            "loaded": self.engine.projects(), "orchestrator": self.orchestrator_note,
            "ui_url": self.ui.url if self.ui is not None else None, "ui": self.ui_note,
            "schedules": self._schedules(),
        }

    def _schedules(self) -> list[dict[str, Any]]:
        """The schedules as Prefect has them now, or (Prefect slow to answer: flow runs starting on
        a loaded machine) the last ones read, marked `stale`: `ctx status` must not wait on it."""
        orchestrator = self.orchestrator
        if orchestrator is None:
            return []

        def read() -> list[dict[str, Any]]:
            try:
                return list(orchestrator.schedules())
            except Exception as exc:
                return [{"name": "?", "error": str(exc)}]

        rows = call_within(read, SCHEDULES_WAIT_S)
        if rows is not None:
            self._last_schedules = rows
            return rows
        return [{**row, "stale": True} for row in self._last_schedules]

    def run_cli(self, message: dict[str, Any]) -> dict[str, Any]:
        argv = [str(a) for a in message.get("argv", [])]
        cwd = str(message.get("cwd", ""))
        if not os.path.isdir(cwd):
            return {"op": "error", "message": f"working folder does not exist: {cwd}", "code": 2}
        try:
            with self.request_env(message):
                argv = self._with_wait(argv)
                if not self._heavy(argv):
                    return self._run_here(argv, bool(message.get("stdout_tty")))
                # A whole-tree run goes to a child with the request's folder and environment as
                # they are now: the process's own are free again while it runs (minutes), so the
                # agents' commands and new MCP sessions are served here meanwhile.
                root, folder, env = self._index_root(argv), os.getcwd(), dict(os.environ)
        except Busy:
            # Another command holds the process's folder and environment for a moment: the client
            # runs this one itself rather than wait behind it.
            return {"op": "local"}
        code, stdout, stderr = self._run_in_child(argv, folder, env)
        if self.stopping.is_set():
            # `ctx down` came during the run, which the service's stop ends (its exit code then
            # says nothing: a child reaped elsewhere reads as 0): the client runs it, as it does
            # when the service is gone.
            return {"op": "local", "reason": "the service stopped during the run"}
        if code < 0:  # ended by a signal, not by itself
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return {"op": "result", "code": 1, "stdout": stdout,
                    "stderr": stderr + f"ctx: error: the run in the service's child process was killed ({name})\n"}
        if code == 0 and root is not None and (watched := self.register(root)):
            log(f"watching {watched}")
        return {"op": "result", "code": code, "stdout": stdout, "stderr": stderr}

    def _with_wait(self, argv: list[str]) -> list[str]:
        """`ctx run index` waits up to INDEX_WAIT_S for the writer lock while this service's watcher
        holds it (a batch takes a moment). Held by another run (a whole-tree run takes minutes), it
        fails at once, as it does without the service, rather than hold this process's one request
        slot meanwhile."""
        if argv[:2] != ["run", "index"] or "--wait" in argv:
            return argv
        from ctxlake.schemas.roots import CTX_DIR
        from ctxlake.tasks.lake import WriterLock

        root = self._index_root(argv)
        holder = WriterLock(root / CTX_DIR / "lake").held_by_other() if root is not None else None
        if holder is not None and not str(holder.get("purpose", "")).startswith(WATCHER_PURPOSE):
            return argv
        return [*argv, "--wait", str(INDEX_WAIT_S)]

    def _run_here(self, argv: list[str], stdout_tty: bool) -> dict[str, Any]:
        """`ctx ARGV` in this process (inside request_env), its output captured."""
        from ctxlake.serve.cli.app import run

        self._settle(argv)
        index_run = argv[:2] == ["run", "index"]
        if index_run or argv[:2] == ["run", "ingest"]:
            # A due compaction goes to a child (request_env restores the variable): the project's
            # watcher's for an index, this service's next ingest run (a flow-run process) for the
            # conversation lake.
            from ctxlake.tasks.upkeep import OPTIMIZE_ELSEWHERE_ENV

            os.environ[OPTIMIZE_ELSEWHERE_ENV] = "1"
        with capture.captured(stdout_tty, False) as (out, err):
            try:
                code = run(argv, reuse=True)
            except SystemExit as exc:
                code = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
            except Exception:
                import traceback

                traceback.print_exc()
                code = 1
        if watched := self._watch_after(argv, code):
            log(f"watching {watched}")
        root = self._index_root(argv) if index_run and code == 0 else None
        if root is not None and self.watchers.optimize_soon(root):
            log(f"an optimize of {root} is due: its watcher runs it in a child once the project is quiet")
        return {"op": "result", "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}

    @contextmanager
    def request_env(self, message: dict[str, Any]) -> Iterator[None]:
        """The client's folder and CTX_* environment, for one request at a time (both are per process)."""
        env = {str(k): str(v) for k, v in dict(message.get("env", {})).items() if str(k).startswith("CTX_")}
        if not self._cli_lock.acquire(timeout=BUSY_WAIT_S):
            raise Busy()
        try:
            saved = {k: v for k, v in os.environ.items() if k.startswith("CTX_") or k == "COLUMNS"}
            # Everything from here is undone in `finally`, whatever fails: the service's own CTX_*
            # variables are what its watchers index with between requests.
            try:
                for key in saved:
                    os.environ.pop(key, None)
                os.environ.update(env)
                os.environ["COLUMNS"] = str(int(message.get("columns", 80)))
                # The socket's home is the request's home. Set only when the client set it or the default
                # would differ: what a command reads as the user's CTX_HOME goes into files meant to be
                # committed (`ctx init`'s .mcp.json, the hooks), which must not name this machine's folders.
                if "CTX_HOME" not in env:
                    os.environ.pop("CTX_HOME", None)
                    if ctx_home() != self.paths.home:
                        os.environ["CTX_HOME"] = str(self.paths.home)
                os.chdir(str(message.get("cwd", "")))
                yield
            finally:
                for key in [k for k in os.environ if k.startswith("CTX_") or k == "COLUMNS"]:
                    os.environ.pop(key, None)
                os.environ.update(saved)
                os.chdir(self.paths.home)
        finally:
            self._cli_lock.release()

    def _index_root(self, argv: list[str]) -> Path | None:
        """The project a `ctx run index` argv names (resolved from the request's folder) as the run
        resolves it: a project's first run has no .ctx/ yet, and its root is still known."""
        if argv[:2] != ["run", "index"]:
            return None
        from ctxlake.schemas.roots import resolve_root

        positional: list[str] = []
        skip = False
        for arg in argv[2:]:
            if skip:
                skip = False
            elif arg in VALUE_OPTIONS:
                skip = True
            elif not arg.startswith("-"):
                positional.append(arg)
        try:
            return resolve_root(Path(positional[0]) if positional else None, for_write=True)
        except Exception:
            return None

    def _heavy(self, argv: list[str]) -> bool:
        """A whole-tree index run (--force, a project's first, or one of a project this service does
        not watch yet): it runs in a child process.

        In this process it would hold the interpreter for minutes (django: ~50 s of chunking and
        embedding) while every agent's MCP session queries here; a child leaves the queries their
        share of the GIL and returns its memory when it ends. A run of a project not watched yet
        scans and hashes the whole tree and runs the flow's every stage: in this process on django
        it left ~210 MB more resident for good. Once the project is watched, its runs find the
        watcher's batches applied and stay here (0.1-0.3 s).

        The same for a conversation ingest with `--force` (it compacts every table) or the first
        one (every log the agent tools hold: 20,000 sessions took 8 minutes and ~1.5 GB here);
        the scheduled and later ones read what is new and stay here. And `ctx add` / `add-docs`,
        which fetch a whole source (a clone, a crawl) and index all of it; `ctx update` stays."""
        if argv[:1] in (["add"], ["add-docs"]):
            return True
        if argv[:2] == ["run", "ingest"]:
            return "--force" in argv or self._first_ingest()
        if argv[:2] != ["run", "index"]:
            return False
        if "--force" in argv:
            return True
        from ctxlake.schemas.roots import CTX_DIR
        from ctxlake.tasks.lake import IndexState

        root = self._index_root(argv)
        if root is None or str(root) not in self.watchers.roots():
            return True
        try:
            return IndexState.read(root / CTX_DIR / "lake") is None
        except Exception:  # an unreadable state: let the in-process path report it
            return False

    @staticmethod
    def _first_ingest() -> bool:
        """No conversation ingest has finished for the request's user data dir yet."""
        from ctxlake.schemas.roots import default_home
        from ctxlake.tasks.lake import IndexState

        try:
            state = IndexState.read(default_home() / "memory")
        except Exception:  # an unreadable state: let the in-process path report it
            return False
        return state is None or not state.last_run

    def _run_in_child(self, argv: list[str], cwd: str, env: dict[str, str]) -> tuple[int, str, str]:
        """`ctx ARGV` in a child running the in-process path, in the request's folder and
        environment: (exit code, stdout, stderr)."""
        # At a lower CPU priority: on a small machine a whole-tree run and the agents' queries want
        # the same cores, and a query waits on the user while the run does not.
        # A SIGINT (its client quit) before the CLI catches it, during the imports, ends it with 130 too.
        code = (f"import os, sys\nos.nice({CHILD_NICE})\ntry:\n    from ctxlake.serve.service.client import in_process\n"
                "    sys.exit(in_process(sys.argv[1:]))\nexcept KeyboardInterrupt:\n    sys.exit(130)")
        progress = fd_of(env.get(PROGRESS_FD_ENV, ""))
        # Spawned so that it ends with the service, `kill -9` included: the client whose service
        # died falls back to running the command itself, which must not meet an orphan still
        # writing the same lake (it would wait on the writer lock, or ingest the same logs twice).
        try:
            proc = on_lifetime_thread(lambda: subprocess.Popen(
                dying_with_this_process([sys.executable, "-c", code, *argv]), cwd=cwd, env=env,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                pass_fds=() if progress is None else (progress,)))
        except OSError as exc:  # no process left to start, the folder gone meanwhile
            return 1, "", f"ctx: error: could not start the run: {exc}\n"
        interrupted_at: float | None = None
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=CHILD_POLL_S)
                return proc.returncode, stdout, stderr
            except subprocess.TimeoutExpired:
                pass
            # Its client quit (Ctrl-C, a closed terminal): stop the run as a Ctrl-C stops it
            # without the service (exit 130; the lake keeps what was committed and the next run
            # resumes), rather than go on for minutes for nobody. SIGTERM if it does not stop.
            if interrupted_at is None and abandoned():
                log(f"client gone: interrupting `ctx {' '.join(argv[:2])}` (pid {proc.pid})")
                proc.send_signal(signal.SIGINT)
                interrupted_at = time.monotonic()
            elif interrupted_at is not None and time.monotonic() - interrupted_at > CHILD_INTERRUPT_GRACE_S:
                proc.terminate()

    def _settle(self, argv: list[str]) -> None:
        """Before a `ctx run index` of a watched project: give the watcher time to take the batch.

        The watcher applies an edit in a fraction of a second once 50 ms pass without another
        event; a run that grabbed the writer lock first would instead run the whole flow (a scan
        of every file: ~4 s on django). After the batch the run's no-op check finds nothing to do.
        """
        if "--force" in argv:
            return
        root = self._index_root(argv)
        if root is None or str(root) not in self.watchers.roots():
            return
        time.sleep(SETTLE_S)
        # A batch under way: let it finish (the run then finds nothing to do) rather than queue
        # behind it for the writer lock and scan the whole tree after.
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline and (seen := self.watchers.state(root)) is not None and seen[1]:
            time.sleep(0.02)

    def _watch_after(self, argv: list[str], code: int) -> str | None:
        """A project registers for watching on its first successful `ctx run index` here."""
        root = self._index_root(argv) if code == 0 else None
        return self.register(root) if root is not None else None


def call_within(fn: Callable[[], T], seconds: float) -> T | None:
    """fn()'s answer, or None when it takes longer than `seconds` (it finishes on its thread)."""
    done = threading.Event()
    answer: list[T] = []

    def target() -> None:
        try:
            answer.append(fn())
        finally:
            done.set()

    threading.Thread(target=target, name="bounded call", daemon=True).start()
    return answer[0] if done.wait(seconds) and answer else None


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


def rss_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


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
