"""The `ctx` console script: forwards a command to the running service, else runs it in-process.

Standard library only (plus platformdirs when CTX_HOME is unset): when the service is up a
command costs a socket round trip, not the imports of lancedb, pyarrow, torch, prefect, pydantic,
typer or rich. Commands that need this process (its terminal, its stdin, its lifetime) run here.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

from ctxlake.errors import asks_json, error_document
from ctxlake.serve.service import protocol
from ctxlake.serve.service.paths import ServicePaths, ctx_home, service_paths
from ctxlake.serve.service.protocol import forwarded_env

# Run in this process whatever the service state: they manage the service, hold the user's
# terminal, or are the long-lived process themselves.
# ui: opens this user's browser, may serve in the foreground. eval: indexes whole trees for minutes
# to hours and prints each task as it goes; in the service it held the one CLI request slot (every
# other command ran in its own client meanwhile) and the interpreter the agents' queries need.
LOCAL_COMMANDS = frozenset({"up", "down", "chat", "ask", "ui", "eval"})
# Interactive unless told not to ask.
ASKS_UNLESS = {"clean": ("-y", "--yes"), "init": ("-y", "--yes")}


def runs_locally(argv: list[str]) -> bool:
    """True when the command needs this process (terminal, stdin, signals), not the service's."""
    if not argv:
        return False
    command = argv[0]
    if command in LOCAL_COMMANDS or "--watch" in argv:
        return True
    if "-v" in argv or "--verbose" in argv:  # Prefect's logs: the service's Prefect keeps them quiet
        return True
    if command in ASKS_UNLESS and not any(flag in argv for flag in ASKS_UNLESS[command]):
        return True
    return "-" in argv[1:]  # reads stdin, e.g. `ctx remember -`


def autostart_enabled(cwd: Path) -> bool:
    """`[service] autostart` from CTX_SERVICE_AUTOSTART or the nearest .ctx/config.toml (off by
    default). The file's setting counts only once its content is trusted (`ctx trust`): a cloned
    repository's config must not start a long-lived service on the machine of whoever runs ctx in it."""
    value = os.environ.get("CTX_SERVICE_AUTOSTART")
    if value is not None:
        return value.strip().lower() in ("1", "true", "yes", "on")
    for folder in (cwd, *cwd.parents):
        config = folder / ".ctx" / "config.toml"
        if config.is_file():
            import tomllib  # here: only a command with the service down reads it (~13 ms to import)

            from ctxlake.schemas import trust  # standard library only

            try:
                content = config.read_bytes()
                data = tomllib.loads(content.decode("utf-8"))
            except (tomllib.TOMLDecodeError, OSError, UnicodeDecodeError):
                return False
            section = data.get("service")
            wanted = isinstance(section, dict) and bool(section.get("autostart", False))
            return wanted and trust.is_trusted(config, content, ctx_home())
    return False


def in_process(argv: list[str]) -> int:
    """Today's path: import the full CLI and run the command here."""
    from ctxlake.serve.cli.app import run

    return run(argv)


def connect(paths: ServicePaths, timeout: float = 2.0) -> socket.socket | None:
    try:
        return protocol.connect(str(paths.socket), timeout=timeout)
    except OSError:
        return None


def terminal_columns() -> int:
    """The terminal's width as `shutil.get_terminal_size` tells it (COLUMNS first, then stdout's
    terminal, else 80), without importing shutil (~8 ms of the client's start-up)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns if sys.__stdout__ else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def request(argv: list[str], cwd: str) -> dict[str, Any]:
    width = terminal_columns()
    return {
        "op": "cli", "v": protocol.PROTOCOL_VERSION, "argv": argv, "cwd": cwd,
        "env": forwarded_env(), "stdout_tty": sys.stdout.isatty(), "stderr_tty": sys.stderr.isatty(),
        "columns": width,
    }


def forward(sock: socket.socket, message: dict[str, Any]) -> dict[str, Any]:
    """The service's answer to `message`. A command may run for minutes (`ctx run index`): the
    service says it is at work every few seconds, and silence (a stopped or hung service) ends
    the wait with TimeoutError instead of holding the user, or an agent's hook, for ever. On a
    terminal, the command's progress is drawn on one stderr line meanwhile."""
    # Not on a terminal that cannot move its cursor (as Rich's live display, in-process, is not).
    line = StatusLine() if message.get("stderr_tty") and os.environ.get("TERM") != "dumb" else None
    with sock:
        sock.settimeout(protocol.FIRST_REPLY_S)
        protocol.send(sock, message)
        try:
            while True:
                reply = protocol.recv(sock)
                if reply.get("op") not in ("accepted", "working"):
                    return reply
                if line is not None and isinstance(reply.get("progress"), list):
                    line.show(reply["progress"])
                sock.settimeout(protocol.SILENCE_S)
        finally:
            if line is not None:
                line.clear()


class StatusLine:
    """One line on stderr (a terminal) showing the stage a served command is in: what, how far,
    for how long. The in-process path draws Rich's bars; the thin client does not import Rich."""

    def __init__(self) -> None:
        self.drawn = False
        self.began: dict[str, float] = {}

    def show(self, stages: list[Any]) -> None:
        import time

        now = time.monotonic()
        current = [s for s in stages if isinstance(s, dict) and not s.get("finished")] or [
            s for s in stages if isinstance(s, dict)]
        if not current:
            return
        stage = current[-1]
        name = str(stage.get("stage", ""))
        self.began.setdefault(name, now)
        done, total = stage.get("done"), stage.get("total")
        done = done if isinstance(done, int) else 0
        count = f"{done:,}/{total:,}" if isinstance(total, int) and total > 0 else (f"{done:,}" if done else "")
        seconds = int(now - self.began[name])
        text = f"{stage.get('description') or name}  {count}  {seconds // 60}:{seconds % 60:02d}"
        width = terminal_columns()
        self._write(f"\r\x1b[2K{text[:max(10, width - 1)]}")
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self._write("\r\x1b[2K")
            self.drawn = False

    @staticmethod
    def _write(text: str) -> None:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def run(argv: list[str]) -> int:
    if argv[:1] in (["--version"], ["-V"]):  # no service and no imports needed to say it
        from ctxlake import __version__

        print(f"ctxlake {__version__}")
        return 0
    if argv and argv[0] == "serve" and not runs_locally(argv):
        from ctxlake.serve.service.mcp_proxy import proxy_or_none

        code = proxy_or_none(argv)
        return in_process(argv) if code is None else code
    if runs_locally(argv):
        return in_process(argv)
    paths = service_paths()
    cwd = os.getcwd()
    sock = connect(paths)
    if sock is None and autostart_enabled(Path(cwd)):
        from ctxlake.serve.service.lifecycle import start_detached

        if start_detached(paths, quiet=True) is not None:
            sock = connect(paths)
    if sock is None:
        return in_process(argv)
    try:
        reply = forward(sock, request(argv, cwd))
    except KeyboardInterrupt:
        # Closing the socket tells the service: a `ctx sql` there stops at once; other commands
        # run to their end (an index run is not cut half-way).
        print("ctx: interrupted.", file=sys.stderr)
        return 130
    except TimeoutError:
        print(f"ctx: the service (socket {paths.socket}) did not answer in time: stopped or overloaded "
              f"(see {paths.log}); running here instead.", file=sys.stderr)
        os.environ[protocol.SILENT_SERVICE_ENV] = "1"  # `ctx status` then reports it without asking again
        return in_process(argv)
    except (OSError, protocol.ProtocolError) as exc:
        print(f"ctx: the service stopped answering ({exc.__class__.__name__}); running here instead.",
              file=sys.stderr)
        return in_process(argv)
    if reply.get("op") == "local":  # the service cannot run it faithfully (e.g. different env), or stopped
        if reply.get("reason"):
            print(f"ctx: {reply['reason']}; running here instead.", file=sys.stderr)
        return in_process(argv)
    if reply.get("op") == "error":
        message, code = str(reply.get("message", "the service refused the request")), int(reply.get("code", 1))
        print(f"ctx: error: {message}", file=sys.stderr)
        if asks_json(argv):
            import json

            print(json.dumps(error_document(message, None, code), indent=2, ensure_ascii=False))
        return code
    out, err = str(reply.get("stdout", "")), str(reply.get("stderr", ""))
    if out:
        try:
            sys.stdout.write(out)
            sys.stdout.flush()
        except BrokenPipeError:
            # The reader went away (`| head`, `| grep -q`): end quietly with 1, as the in-process
            # path does (click's rule), and never with a traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush stays quiet
            return 1
    if err:
        sys.stderr.write(err)
        sys.stderr.flush()
    return int(reply.get("code", 0))


def main() -> None:
    """Console entry point (`ctx`)."""
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
