"""The web UI's guard (an ASGI middleware): Host and Origin checks against DNS rebinding, a CSRF token
per browser session on every state-changing request, and strict security headers (CSP without inline
script)."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SESSION_COOKIE = "ctx_ui_session"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The UI's own links stay far below these; browsers send URLs of up to about 2 MB. A longer request gets a
# 414 or 431 that says so (server.py lets uvicorn read a request head of up to MAX_HEAD_BYTES to get here).
MAX_URL_BYTES = 64 << 10
MAX_HEADER_BYTES = 64 << 10
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class Guard:
    """Host must name this server (127.0.0.1 / localhost with its port): a rebound DNS name gets 421.
    A cross-site Origin gets 403. POST/PUT/PATCH/DELETE need the X-CSRF-Token of the session cookie.
    A path and query string over MAX_URL_BYTES gets 414, headers over MAX_HEADER_BYTES 431."""

    def __init__(self, app: ASGIApp, port_of: Callable[[], int], secret: bytes | None = None) -> None:
        self.app = app
        self.port_of = port_of  # the bound port is known only once the server listens
        self.secret = secret or secrets.token_bytes(32)

    def allowed_hosts(self) -> set[str]:
        port = self.port_of()
        return {f"127.0.0.1:{port}", f"localhost:{port}"}

    def token_for(self, session: str) -> str:
        return hmac.new(self.secret, session.encode(), hashlib.sha256).hexdigest()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        query = scope.get("query_string", b"")
        if len(scope.get("raw_path") or scope["path"].encode()) + (len(query) + 1 if query else 0) > MAX_URL_BYTES:
            await _plain(send, 414, f"URI too long: this server takes a path and query string of up to "
                                    f"{MAX_URL_BYTES:,} bytes.")
            return
        if sum(len(k) + len(v) for k, v in scope.get("headers", [])) > MAX_HEADER_BYTES:
            await _plain(send, 431, f"Request header fields too large: this server takes up to {MAX_HEADER_BYTES:,} "
                                    "bytes of headers.")
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host", "")
        if host.lower() not in self.allowed_hosts():
            await _plain(send, 421, "Misdirected request: this server answers only to 127.0.0.1 and localhost.")
            return
        origin = headers.get("origin")
        if origin is not None and origin.lower() not in {f"http://{h}" for h in self.allowed_hosts()}:
            await _plain(send, 403, "Forbidden: a request from another site (Origin) is refused.")
            return
        if headers.get("sec-fetch-site") == "cross-site":
            await _plain(send, 403, "Forbidden: a cross-site request is refused.")
            return
        cookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except Exception:  # an unparsable cookie header is treated as none
            cookie = SimpleCookie()
        session = cookie[SESSION_COOKIE].value if SESSION_COOKIE in cookie else ""
        new_session = ""
        if not session or len(session) != 43:
            session = new_session = secrets.token_urlsafe(32)
        token = self.token_for(session)
        if scope["method"] not in SAFE_METHODS:
            sent = headers.get(CSRF_HEADER, "")
            if new_session or not hmac.compare_digest(sent, token):
                await _plain(send, 403, "Forbidden: missing or wrong CSRF token (reload the page).")
                return
        scope.setdefault("state", {})["csrf_token"] = token

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(HEADERS)
                if new_session:
                    extra.append((b"set-cookie", (f"{SESSION_COOKIE}={new_session}; Path=/; HttpOnly; "
                                                  "SameSite=Strict").encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _plain(send: Send, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), *HEADERS]})
    await send({"type": "http.response.body", "body": body})
