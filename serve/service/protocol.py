"""Frames on the service socket: a 4-byte big-endian length, then one UTF-8 JSON object.

Standard library only. A connection carries one request and its answer; an `mcp` request turns
the rest of the connection into the MCP stdio byte stream (newline-delimited JSON-RPC).
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MAX_FRAME = 64 * 1024 * 1024  # an answer carries a command's whole output; 64 MiB bounds garbage
# A `cli` request is answered by an `accepted` frame at once, then a `working` frame every
# HEARTBEAT_S while the command runs, then its result. A client that hears nothing for
# FIRST_REPLY_S, then SILENCE_S between frames, takes the service for stopped or hung (SIGSTOP,
# a deadlock) and runs the command itself instead of waiting for ever.
HEARTBEAT_S = 5.0
FIRST_REPLY_S = 10.0
SILENCE_S = 30.0
_HEADER = struct.Struct(">I")
PROTOCOL_VERSION = 1
# Set by the client for a command it runs itself after the service did not answer: `ctx status`
# then says so at once instead of asking the service again.
SILENT_SERVICE_ENV = "CTX_SERVICE_SILENT"


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol."""


# op -> field -> the type its value must have when present (required: REQUIRED_FIELDS).
FIELD_TYPES: dict[str, dict[str, type | tuple[type, ...]]] = {
    "cli": {"argv": list, "cwd": str, "env": dict, "columns": int, "stdout_tty": bool, "stderr_tty": bool},
    "mcp": {"argv": list, "cwd": str, "env": dict, "columns": int},
    "watch": {"paths": list},
}
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {"cli": ("argv", "cwd"), "mcp": ("argv", "cwd"), "watch": ("paths",)}


def check_fields(message: dict[str, Any]) -> None:
    """ProtocolError naming the first field of a request that is missing or of the wrong type
    (a string where a list of paths belongs was read as one path per character)."""
    op = str(message.get("op"))
    for name in REQUIRED_FIELDS.get(op, ()):
        if name not in message:
            raise ProtocolError(f"{op}: missing field {name!r}")
    for name, kind in FIELD_TYPES.get(op, {}).items():
        value = message.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ProtocolError(f"{op}: field {name!r} must be {getattr(kind, '__name__', kind)}")
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise ProtocolError(f"{op}: field {name!r} must be a list of strings")
        if isinstance(value, dict) and not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ProtocolError(f"{op}: field {name!r} must map strings to strings")
        if isinstance(value, dict) and any(not k or "=" in k or "\0" in k + v for k, v in value.items()):
            # os.environ refuses these: found here, not half-way through setting the request's variables
            raise ProtocolError(f"{op}: field {name!r} holds a name or value no environment variable can have")


class PeerClosed(ProtocolError):
    """The connection ended before a whole frame arrived (e.g. the service died)."""


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message, ensure_ascii=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise ProtocolError(f"message of {len(body):,} bytes is over the {MAX_FRAME:,}-byte limit")
    sock.sendall(_HEADER.pack(len(body)) + body)


def _read_exact(sock: socket.socket, n: int) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise PeerClosed(f"connection closed with {left} of {n} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(sock: socket.socket) -> dict[str, Any]:
    (length,) = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length:,} bytes is over the {MAX_FRAME:,}-byte limit")
    try:
        message = json.loads(_read_exact(sock, length).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not UTF-8 JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


@contextmanager
def heartbeat(sock: socket.socket, every: float = HEARTBEAT_S, gone: threading.Event | None = None,
              progress: Callable[[], Any] | None = None, progress_every: float = 0.5) -> Iterator[None]:
    """A `working` frame on `sock` every `every` seconds while the block runs (from a thread, which
    has stopped when the block ends: the frame that follows is the last one), and, with `progress`,
    one carrying what it returns when that is not None, at most every `progress_every` seconds.
    With `gone`: the client sends nothing after its request, so the socket turning readable means
    it closed (quit, Ctrl-C), and `gone` is set at once, as it is when a frame cannot be sent."""
    done = threading.Event()
    wake_r, wake_w = os.pipe()  # ends the thread's wait as soon as the block ends

    def beat() -> None:
        # poll, not select: a service holding LanceDB's files has descriptors past select's 1,024.
        watch = select.poll()
        watch.register(wake_r, select.POLLIN)
        if gone is not None:
            watch.register(sock, select.POLLIN | select.POLLHUP)
        next_beat = time.monotonic() + every
        next_progress = time.monotonic() + progress_every if progress is not None else float("inf")
        while True:
            try:
                wait = max(0.0, min(next_beat, next_progress) - time.monotonic())
                events = watch.poll(wait * 1000)
                if done.is_set():
                    return
                if gone is not None and any(fd == sock.fileno() for fd, _ in events):
                    try:
                        left = not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    except BlockingIOError:  # woken with nothing to read after all
                        left = False
                    else:
                        if not left:  # bytes the protocol does not expect: stop looking, keep beating
                            watch.unregister(sock)
                    if left:
                        gone.set()
                        return
                now = time.monotonic()
                if progress is not None and now >= next_progress:
                    next_progress = now + progress_every
                    if (state := progress()) is not None:
                        send(sock, {"op": "working", "progress": state})
                        next_beat = now + every
                if now >= next_beat:
                    send(sock, {"op": "working"})
                    next_beat = now + every
            except OSError:  # the client went away; the command goes on
                if gone is not None:
                    gone.set()
                return

    thread = threading.Thread(target=beat, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        os.write(wake_w, b"\0")
        thread.join()
        os.close(wake_r)
        os.close(wake_w)


def connect(path: str, timeout: float | None = 2.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


class Busy(Exception):
    """The service's per-process request context (folder, environment) stayed taken too long."""


def forwarded_env() -> dict[str, str]:
    """The environment a client hands the service: ctxlake's own CTX_* settings, nothing else."""
    import os

    return {k: v for k, v in os.environ.items() if k.startswith("CTX_")}
