"""The service's Prefect side: a persistent `prefect server start`, and the deployments served from it.

The server is a child in its own process group (so stop() can end it and its workers together),
bound to 127.0.0.1 on a free port, its SQLite and PREFECT_HOME under the service's home. A Runner
in a background thread (its own event loop) polls the server and starts each scheduled flow run;
the runs are recorded in Prefect, visible in its UI at `api_url` without `/api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlake.errors import CtxError
from ctxlake.schemas.config import Settings
from ctxlake.serve.service.children import dying_with_this_process, on_lifetime_thread
from ctxlake.serve.service.lifecycle import reap_prefect_server, record_prefect_server
from ctxlake.serve.service.paths import ServicePaths
from ctxlake.serve.service.prefect_guard import PREFECT_SERVER_MAIN, guard_settings

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment
    from prefect.runner import Runner

START_TIMEOUT_S = 120.0  # a busy 2-core machine needs ~10-20 s for the first start (migrations)
# The server keeps the books of flow runs (a whole-tree index child reports every task to it: 7-10%
# of a core during django's forced re-index under query load here); queries never wait on it.
# Raised like that child's (CHILD_NICE), it yields the CPU to the service's queries when both want
# it (no change to the load p99 that two rounds of A/B could show: docs/measurements/service.md,
# run 16).
SERVER_NICE = 10
SERVER_PORT_ATTEMPTS = 3  # ports tried when another process takes one before the server binds it
# How often the failure monitor asks the server for each deployment's last runs. Each check costs
# a Prefect client and settings context in the service and a query per deployment in the server:
# at 2 s that was ~8% of a core under query load, for runs whose schedules are minutes apart.
MONITOR_S = 10.0
LOG_FOLDER_POLL_S = 5.0  # how often a log folder that does not exist yet is looked for


class ServiceError(CtxError):
    """The Prefect server could not be started or reached."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def listens(pid: int, port: int) -> bool | None:
    """True when process `pid` (or a process it started) listens on 127.0.0.1:`port`; None when
    the system will not say (no rights to read its sockets), so the caller trusts its health check.

    A health check alone cannot tell whose server answered: between the choice of a free port and
    the server's bind, another process may take the port (two `ctx` commands starting Prefect's
    temporary server at once pick from the same 1,000 ports). The check then succeeds against that
    other server, ours exits with "address already in use", and the runs go to a server that stops
    when its own command ends ("Connection refused" minutes into a run)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    unknown = False
    for proc in procs:
        try:
            connections = proc.net_connections(kind="tcp")
        except psutil.AccessDenied:
            unknown = True
            continue
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections):
            return True
    return None if unknown else False


class Orchestrator:
    """Owns the Prefect server (unless the user runs one: PREFECT_API_URL), the Runner and the log watcher."""

    def __init__(self, home: Path, settings: Settings) -> None:
        self.home = home
        self.paths = ServicePaths(home)  # where it records the Prefect server it starts
        self.settings = settings
        self._api_url: str | None = None
        self._server: subprocess.Popen[bytes] | None = None
        self._runner: Runner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._monitor: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._stopping = threading.Event()
        self._debounce: threading.Timer | None = None
        self._batch_open = False  # a timer is waiting to start an ingest run
        self._lock = threading.Lock()
        self._deployments: dict[str, Any] = {}  # name -> deployment id
        self._register_lock = threading.Lock()  # service start and client threads both register projects
        self._backed_off: set[str] = set()
        self.ingest_triggers = 0  # runs started by log events (after debouncing)
        self.trigger_errors: list[str] = []  # failed attempts to start such a run
        self.server_start_s: float | None = None
        self.missed_runs_dropped = 0  # planned while the service was down, dropped at start

    @property
    def api_url(self) -> str | None:
        return self._api_url

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._api_url is not None:
            return
        user_url = os.environ.get("PREFECT_API_URL")
        if user_url:
            if not healthy(user_url, timeout=10):
                raise ServiceError(f"PREFECT_API_URL={user_url} does not answer", hint="start that server or unset it")
            self._api_url = user_url
        else:
            self._start_server()
            self._drop_missed_runs()
        os.environ["PREFECT_API_URL"] = self._api_url or ""
        self._start_runner()
        from ctxlake.flows.deployments import service_deployments

        for deployment in service_deployments(self.settings):
            self.add_deployment(deployment)
        self._monitor = threading.Thread(target=self._watch_failures, name="ctx-prefect-monitor", daemon=True)
        self._monitor.start()
        self._start_log_watcher()
        # One ingest now, as a log write would start it: the watcher sees only later writes, and
        # what the tools wrote while the service was down or starting (its missed runs were just
        # dropped) would otherwise wait for the next write or the next scheduled run.
        self.notify_logs_changed()

    def _start_server(self) -> None:
        prefect_home = self.home / "prefect"
        prefect_home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update({
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{prefect_home / 'prefect.db'}",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_SERVER_API_HOST": "127.0.0.1",
            # Its own log file keeps its warnings (the service's quiet default is for command output).
            "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
        })
        env.pop("PREFECT_API_URL", None)
        # The scheduler plans runs every 60 s by default: a new or changed schedule would wait that long.
        env.setdefault("PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS", "5")
        if stale := reap_prefect_server(self.paths):  # the service holds its lock: that one's owner died
            self.trigger_errors.append(f"stopped the Prefect server (pid {stale}) a dead service had left")
        started = time.perf_counter()
        for _ in range(SERVER_PORT_ATTEMPTS):
            # A port another process takes before the server binds it: the server exits, try another.
            if self._spawn_server(free_port(), env, prefect_home):
                self.server_start_s = time.perf_counter() - started
                return
        assert self._server is not None
        raise ServiceError(f"prefect server exited with {self._server.returncode}",
                           hint=f"see {prefect_home / 'server.log'}")

    def _spawn_server(self, port: int, env: dict[str, str], prefect_home: Path) -> bool:
        """Start `prefect server start` on `port` and wait for it: True once it answers as itself,
        False when it exited first."""
        log = open(prefect_home / "server.log", "ab")  # noqa: SIM115 - the child keeps it open
        # Signalled by the kernel when the service dies (a `kill -9` too: Linux); the record below
        # is for the rest, which the next `ctx up` or `ctx down` reaps.
        self._server = on_lifetime_thread(lambda: subprocess.Popen(
            # `prefect server start` behind the guard of prefect_guard.py (CSRF, CORS, Host, Origin).
            dying_with_this_process([sys.executable, "-c", PREFECT_SERVER_MAIN, "server", "start",
                                     "--host", "127.0.0.1", "--port", str(port)]),
            env={**env, **guard_settings(port)},
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))
        log.close()
        with contextlib.suppress(OSError, ProcessLookupError):
            record_prefect_server(self.paths, self._server.pid)
        lower_priority(self._server.pid, SERVER_NICE)
        url = f"http://127.0.0.1:{port}/api"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                return False
            # `listens`: the answer must come from this server, not from whoever else holds the port.
            if healthy(url, timeout=1) and listens(self._server.pid, port) is not False:
                self._api_url = url
                return True
            time.sleep(0.2)
        self._kill_server()
        raise ServiceError(f"prefect server did not answer within {START_TIMEOUT_S:.0f} s",
                           hint=f"see {prefect_home / 'server.log'}")

    def _drop_missed_runs(self) -> None:
        """Runs planned while the service was down are not owed: each deployment's next run comes
        at its normal time (the watchers and log events catch up meanwhile). Only on the service's
        own server, before the runner starts to pick runs up."""
        from ctxlake.serve.service.schedules import drop_missed_runs

        assert self._api_url is not None
        try:
            self.missed_runs_dropped = drop_missed_runs(self._api_url, datetime.now(UTC))
        except Exception as exc:  # the schedules still work; the backlog then runs once
            self.trigger_errors.append(f"dropping missed runs: {type(exc).__name__}: {exc}"[:300])

    def _start_runner(self) -> None:
        from prefect.runner import Runner

        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._runner = Runner(name="ctxlake-service", query_seconds=1, prefetch_seconds=2, pause_on_shutdown=False,
                                  limit=self.settings.schedule.max_parallel_runs)
            ready.set()
            try:
                loop.run_until_complete(self._in_settings(self._runner.start()))
            except Exception:
                if not self._stopping.is_set():
                    raise
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name="ctx-prefect-runner", daemon=True)
        self._thread.start()
        ready.wait(30)

    def _call(self, coro: Any, timeout: float = 60) -> Any:
        if self._loop is None:
            raise ServiceError("the orchestrator is not started")
        return asyncio.run_coroutine_threadsafe(self._in_settings(coro), self._loop).result(timeout)

    async def _in_settings(self, coro: Any) -> Any:
        # Prefect reads PREFECT_API_URL into a settings context once per process; a process that
        # touched Prefect before start() would otherwise keep talking to a temporary server (and
        # hand that to the flow-run processes the runner starts).
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self._api_url}):
            return await coro

    def add_deployment(self, deployment: RunnerDeployment) -> None:
        """Register a deployment with the server and have the runner execute its runs."""
        assert self._runner is not None
        self._deployments[deployment.name] = self._call(self._runner.aadd_deployment(deployment))

    def register_project(self, root: Path) -> None:
        from ctxlake.flows.deployments import index_name, project_deployment

        with self._register_lock:
            if index_name(root) not in self._deployments:
                self.add_deployment(project_deployment(root, self.settings))

    def stop(self) -> None:
        self._stopping.set()
        if self._debounce is not None:
            self._debounce.cancel()
        if self._runner is not None and self._loop is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                self._call(self._runner.astop(), timeout=20)
        if self._thread is not None:
            self._thread.join(20)
        self._kill_children()
        self._kill_server()
        if os.environ.get("PREFECT_API_URL") == self._api_url and self._server is not None:
            os.environ.pop("PREFECT_API_URL", None)
        self._api_url = None

    def _kill_server(self) -> None:
        if self._server is None or self._server.poll() is not None:
            return
        pgid = self._server.pid  # its own session: the group id is its pid
        os.killpg(pgid, signal.SIGTERM)
        try:
            self._server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self._server.wait(5)
        with contextlib.suppress(ProcessLookupError):  # uvicorn workers left in the group
            os.killpg(pgid, signal.SIGKILL)
        self.paths.prefect_server.unlink(missing_ok=True)

    def _kill_children(self) -> None:
        """Flow-run processes the runner started and did not reap (a run killed mid-way).

        Only those: the process may have other children (a test's Prefect server, a watcher's
        indexer) that are not ours to end."""
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                if not _is_flow_run(child):
                    continue
                child.terminate()
                child.wait(5)
            except psutil.Error:
                pass

    # -- failures ------------------------------------------------------------------------------
    def _watch_failures(self) -> None:
        """Pause a deployment whose last `max_failures` runs all failed: no crash loop."""
        while not self._stopping.wait(MONITOR_S):
            try:
                self._call(self._check_failures(), timeout=30)
            except Exception:
                continue

    async def _check_failures(self) -> None:
        from prefect.client.orchestration import get_client

        n = self.settings.schedule.max_failures
        async with get_client() as client:
            for name, dep_id in list(self._deployments.items()):
                runs = await _recent_runs(client, dep_id, n)
                if len(runs) == n and all(r.state is not None and (r.state.is_failed() or r.state.is_crashed()) for r in runs):
                    deployment = await client.read_deployment(dep_id)
                    if not deployment.paused and name not in self._backed_off:
                        await client.pause_deployment(dep_id)
                        from ctxlake.serve.service.schedules import _drop_planned

                        await _drop_planned(client, dep_id)
                        self._backed_off.add(name)
                elif runs and runs[0].state is not None and runs[0].state.is_completed():
                    self._backed_off.discard(name)

    # -- log events ----------------------------------------------------------------------------
    def notify_logs_changed(self) -> None:
        """Batched: the log writes of `logs_debounce_s` after the first one start one ingest run.

        The timer is not pushed back by later writes: an agent that writes all the time (a long
        streamed answer) would otherwise never be ingested until it paused."""
        with self._lock:
            if self._batch_open:
                return
            self._batch_open = True
            self._debounce = threading.Timer(self.settings.schedule.logs_debounce_s, self._trigger_ingest)
            self._debounce.daemon = True
            self._debounce.start()

    def _trigger_ingest(self) -> None:
        from prefect.client.orchestration import get_client

        from ctxlake.flows.deployments import INGEST

        async def create() -> None:
            async with get_client() as client:
                await client.create_flow_run_from_deployment(self._deployments[INGEST], tags=["log-event"])

        with self._lock:
            self._batch_open = False  # writes from now on belong to the next run
        if self._stopping.is_set() or INGEST not in self._deployments:
            return
        # A busy server (a flow run starting, a loaded machine) can time the request out; this
        # runs on a timer thread, where an exception would vanish with the trigger. Record it and
        # try again a few times, so a burst of log writes is never dropped silently.
        for attempt in range(3):
            try:
                self._call(create())
            except Exception as exc:  # any failure is recorded, then retried
                self.trigger_errors.append(f"{type(exc).__name__}: {exc}"[:300])
                if self._stopping.wait(2.0 * (attempt + 1)):
                    return
                continue
            self.ingest_triggers += 1
            return

    def _start_log_watcher(self) -> None:
        from ctxlake.tasks.scrape import resolve_roots

        roots = [p for paths in resolve_roots(self.settings.memory, Path.home()).values() for p in paths]
        self._watcher = threading.Thread(target=watch_log_folders, args=(roots, self._stopping, self.notify_logs_changed),
                                         name="ctx-log-watcher", daemon=True)
        self._watcher.start()

    # -- read side -----------------------------------------------------------------------------
    def schedules(self) -> list[dict[str, Any]]:
        from ctxlake.serve.service.schedules import read_schedules

        if self._api_url is None:
            return []
        return read_schedules(self._api_url)


async def _recent_runs(client: Any, deployment_id: Any, n: int) -> list[Any]:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    finished = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED]))
    runs = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=finished), sort=FlowRunSort.END_TIME_DESC, limit=n)
    return list(runs)


def utc_iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


def _is_flow_run(process: Any) -> bool:
    """A process Prefect's runner started for a flow run (it carries the run id in its env)."""
    import psutil

    try:
        if "PREFECT__FLOW_RUN_ID" in process.environ():
            return True
        return any("prefect.engine" in part for part in process.cmdline())
    except psutil.Error:
        return False



def watch_log_folders(roots: list[Path], stop: threading.Event, on_change: Callable[[], None],
                      appear_s: float = LOG_FOLDER_POLL_S) -> None:
    """Call `on_change` after writes under any of the agent tools' log folders, until `stop`.

    A folder that does not exist yet (a tool installed after `ctx up`, or never used) is looked
    for every `appear_s` seconds and watched from when it appears; its appearance counts as a
    change, since it may hold logs already. (Watching only the folders present at start left a
    first Claude Code session after `ctx up` unindexed until the next scheduled run.)
    """
    from watchfiles import watch

    known: set[Path] | None = None
    while not stop.is_set():
        present = [p for p in roots if p.is_dir()]
        if known is not None and set(present) - known:
            on_change()
        known = set(present)
        if not present:
            if stop.wait(appear_s):
                return
            continue
        waiting = [p for p in roots if p not in known]
        looked = time.monotonic()
        for changes in watch(*present, stop_event=stop, debounce=500, rust_timeout=1000, yield_on_timeout=True):
            if changes:
                on_change()
            if waiting and time.monotonic() - looked >= appear_s:
                looked = time.monotonic()
                if any(p.is_dir() for p in waiting):
                    break  # watch again, the new folder with the others


def lower_priority(pid: int, increment: int) -> None:
    """Raise a process's nice value by `increment` (best effort: not on Windows, never fatal).

    Set right after the spawn, while the server is still importing, so the workers it starts
    inherit it."""
    if not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        current = os.getpriority(os.PRIO_PROCESS, pid)
        os.setpriority(os.PRIO_PROCESS, pid, min(19, current + increment))
