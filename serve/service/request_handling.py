"""The service's requests: each connection's op answered on its own thread, a `ctx` command run here or in a child.

The ops are ping, stop, cli, watch and mcp. RequestHandling is the request side of daemon.Service,
which sets the attributes it names and owns the process (socket, lock, threads, shutdown).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ctxlake import __version__
from ctxlake.serve.api.cancel import abandoned, on_behalf
from ctxlake.serve.service import capture, protocol
from ctxlake.serve.service.capture import log
from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread
from ctxlake.serve.service.paths import ServicePaths, ctx_home, write_private_json
from ctxlake.serve.service.progress import PROGRESS_S, ProgressFeed
from ctxlake.serve.service.protocol import Busy
from ctxlake.serve.service.watchers import CHILD_NICE, WATCHER_PURPOSE
from ctxlake.tasks.progress import PROGRESS_FD_ENV, fd_of, fd_token

if TYPE_CHECKING:
    from ctxlake.serve.service.engine import EngineCache
    from ctxlake.serve.service.watchers import Watchers

INDEX_WAIT_S = 60
BUSY_WAIT_S = 1.0  # a CLI request waits this long for the one before it, then runs in its client
CHILD_POLL_S = 0.25  # how often a waiting child run checks that its client is still there
CHILD_INTERRUPT_GRACE_S = 20.0  # after SIGINT, before SIGTERM
SETTLE_S = 0.08  # > the watcher's 50 ms quiet step; a miss only costs a full (correct) run
SETTLE_MAX_S = 10.0  # how long a `ctx run index` waits for a watcher batch under way
SCHEDULES_WAIT_S = 3.0  # `ctx status` shows the last schedules read when Prefect takes longer
T = TypeVar("T")
VALUE_OPTIONS = frozenset({"--wait", "--model", "--provider"})  # `ctx run index` options taking a value


def peer_uid(conn: socket.socket) -> int | None:
    """The connecting process's uid (Linux SO_PEERCRED); None where the platform cannot say."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = conn.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


class RequestHandling:
    """What a connection asks of the service, answered with the state Service (daemon.py) keeps."""

    paths: ServicePaths
    started: float
    stopping: threading.Event
    engine: EngineCache
    watchers: Watchers
    orchestrator: Any
    orchestrator_note: str
    ui: Any
    ui_note: str
    watch_state_shared: threading.Event
    _cli_lock: threading.Lock
    _last_schedules: list[dict[str, Any]]

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
