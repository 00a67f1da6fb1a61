"""What the `ctx` entry module (`app.py`) and its command modules share; it imports neither."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from typer.core import TyperGroup

from ctxlake.errors import CtxError, InputError, UnknownFileError
from ctxlake.schemas.config import default_config_toml
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import CTX_DIR, check_ctx_links

T = TypeVar("T")


def group_with_default(command: str) -> type[TyperGroup]:
    """A command group that hands arguments naming none of its commands to `command`: `ctx context
    "why redis"` is `ctx context search "why redis"`, and `ctx session REF` is `ctx session show REF`."""

    class WithDefault(TyperGroup):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # ctx: the click.Context typer vendors
            if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
                args = [command, *args]
            return super().parse_args(ctx, args)

    return WithDefault


def ensure_project(root: Path) -> bool:
    """Create .ctx/ with a commented config and a .gitignore for the lake; True when created now."""
    check_ctx_links(root)  # before anything is made through a link a clone brought
    ctx_dir = root / CTX_DIR
    created = not ctx_dir.exists()
    (ctx_dir / "knowledge").mkdir(parents=True, exist_ok=True)
    config = ctx_dir / "config.toml"
    if not config.exists():
        config.write_text(default_config_toml(), encoding="utf-8")
    ignore = ctx_dir / ".gitignore"
    if not ignore.exists():
        # The lake is a build artefact; config.toml and knowledge/ are meant to be committed.
        ignore.write_text("lake/\n", encoding="utf-8")
    return created


def _prefect_quietly(verbose: bool) -> None:
    """Prefect reads these at import: keep its INFO chatter and analytics off unless asked."""
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO" if verbose else "WARNING")
    # Only the terminal handler: a failed stage is one `ctx: error:` line here (a bug still
    # prints its traceback), while a Prefect server a user runs still receives the logs.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "INFO" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING" if verbose else "CRITICAL")
    os.environ.setdefault("PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT", "false")
    # The first run in a new PREFECT_HOME migrates its database; on a busy 2-core machine the
    # temporary server's start then overruns Prefect's 20 s default and the run fails.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


# The most rows a `-n/--limit` may ask for: past it a number only reached LanceDB, which failed on
# one over 2**31 with a traceback.
MAX_LIMIT = 1000
SERVER_START_ATTEMPTS = 3  # ports tried for Prefect's temporary server
OWN_SERVER_WAIT_S = 120.0  # for the server Prefect started to listen (or exit) after a health answer


class PrefectStartError(CtxError):
    """Prefect's temporary API server did not come up as this process's own."""


def start_prefect_shielded() -> None:
    """Start Prefect's temporary API server now (when no server is configured), with SIGINT
    blocked in it. Prefect starts it in the terminal's process group, so a Ctrl-C reached it too:
    the flow's last state updates then retried against a dead server, and `ctx run index --watch`
    hung after Ctrl-C (or ended in an httpx traceback). The server stops with this process:
    Prefect stops it at exit, and on Linux the kernel sends it SIGTERM when this process (a command
    or the service) dies any other way (`kill -9`, SIGTERM), which used to leave a ~220 MB server
    behind per killed run."""
    from prefect.settings import PREFECT_API_URL

    from ctxlake.serve.service.children import on_lifetime_thread

    if PREFECT_API_URL.value():
        return
    # The kernel's parent-death signal follows the thread that spawned the child: started from one
    # of the service's request threads, the server was killed as that request ended (and the next
    # `ctx run ingest` sent to a dead port); started there without it, a `kill -9` of the service
    # left it running. So it starts on a thread that lives as long as the process.
    on_lifetime_thread(_start_temporary_server)


def _start_temporary_server() -> None:
    import signal

    import prefect.server.api.server as prefect_server


    server = prefect_server.SubprocessASGIServer()  # the one instance Prefect's clients use
    if server.running:
        process = server.server_process
        if process is None or process.poll() is None:
            return
        # It died since it started (killed, crashed): Prefect would go on sending to its port.
        server.server_process, server.running, server.port = None, False, None
    # A blocked signal stays blocked across fork and exec; a Ctrl-C meanwhile waits for this process.
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    real = prefect_server.subprocess
    # Only Prefect's server module sees the shim, and only while it starts the server.
    prefect_server.subprocess = _SpawnDying(real)  # type: ignore[assignment]
    try:
        for _ in range(SERVER_START_ATTEMPTS):
            server.start()
            if _own_server_answers(server):
                return
            # Another process took the port between Prefect's choice and the bind: the health check
            # was answered by that process's server (see orchestrator.listens). Another port, on the
            # same instance (Prefect's stop() would also drop it from the instances its clients use).
            process = server.server_process
            if process is not None:
                if process.poll() is None:
                    process.kill()
                process.wait()
            server.server_process, server.running, server.port = None, False, None
        raise PrefectStartError("Prefect's temporary server could not bind a free port "
                                f"({SERVER_START_ATTEMPTS} tries; other processes took each one first)",
                                hint="try again, or run a Prefect server and set PREFECT_API_URL")
    finally:
        prefect_server.subprocess = real
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _own_server_answers(server: Any) -> bool:
    """Wait until the server Prefect started is the one listening on its port (True), or has
    exited (False): Prefect's start() returns at the first healthy answer on the port, whoever gave
    it."""
    import time

    from ctxlake.serve.service.orchestrator import listens

    process = server.server_process
    deadline = time.monotonic() + OWN_SERVER_WAIT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if listens(process.pid, server.port) is not False:  # None: the system will not say
            return True
        time.sleep(0.05)
    return False


class _SpawnDying:
    """`subprocess` as Prefect's server module uses it: its Popen starts the guarded server of
    prefect_guard.py (CSRF, CORS for its own origin, Host and Origin checks) instead of Prefect's
    open one, through `dying_with_this_process`."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def Popen(self, args: Any, *rest: Any, **kwargs: Any) -> Any:
        from ctxlake.serve.service.children import dying_with_this_process
        from ctxlake.serve.service.prefect_guard import guard_temporary_command

        args, kwargs["env"] = guard_temporary_command(list(args), kwargs.get("env"))
        return self._real.Popen(dying_with_this_process(args), *rest, **kwargs)


def bound_writer_heap() -> None:
    """At most two malloc arenas for a run that writes the lake in this process (`ctx run index`,
    `ctx run ingest`; the resident service sets the same at its start). Call it before Prefect
    starts its threads. With glibc's default, freed memory piled up per thread: a 20,000-session
    cold ingest grew to ~2.4 GB while scraping, ~1.1 GB with two arenas and the flow's trims
    (docs/measurements/memory.md, "A long history"); the index run's vector writer frees its
    buffers on its own thread.
    The service's fixed 1 MiB mmap threshold was measured on these runs and left off: -0.2 GB of
    peak for a 20,000-session cold ingest but its end phase 47 -> 80 s; no change on the big tree.
    Vector index builds get smaller buffers too (`bound_index_builds`)."""
    from ctxlake.tasks.heap import bound_heap, bound_index_builds

    bound_heap(mmap_bytes=None)
    bound_index_builds()


@contextmanager
def without_heartbeats() -> Iterator[None]:
    """For a flow run a command waits on: no Prefect heartbeat thread.

    That thread sleeps in whole seconds and the run's end joins it, which added 0-1 s (0.54 s in a
    py-spy sample) to every `ctx run ingest` and `ctx run index` at the end of the work. Its
    heartbeats let a Prefect server notice that a long run died; a command's run is watched by
    the command that waits on it. Scheduled deployments and `--watch` keep them.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


def typed_path_read(typed: str, root: Path, read: Callable[[str], T], source: str = PROJECT_SOURCE) -> T:
    """`read` a project file named as a shell user types it: relative to the current folder (an
    absolute path inside the root too), the way `ctx show`, `ctx related` and `ctx outline` all
    take one. In a subfolder, a path the index does not hold from there is tried from the root, so
    `ctx show src/app.py` works anywhere in the project; when neither is indexed, the error says
    how the path was read. Another source's path is read as given, relative to its root: nothing
    ties the current folder to it."""
    from ctxlake.tasks.safe_io import project_path

    if source != PROJECT_SOURCE:
        return read(typed)

    here = project_path(typed, root, Path.cwd())
    try:
        return read(here)
    except UnknownFileError as exc:
        if Path(typed.strip()).is_absolute() or Path.cwd().resolve() == root.resolve():
            raise
        first = exc
    try:
        from_root = project_path(typed, root)
        return read(from_root)
    except InputError as exc:
        # The reader's own suggestion (a close name, another source) unless it is how paths are written.
        useful = isinstance(exc, UnknownFileError) and exc.hint and "relative to" not in exc.hint
        suggestion = f"; {exc.hint}" if useful else ""
        raise UnknownFileError(
            first.message,
            hint=f"{typed} was read from the current folder (as {here}) and from the project root{suggestion}",
        ) from exc
