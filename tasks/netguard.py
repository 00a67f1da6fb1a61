"""Fetch stage of web sources, which hosts a crawl may reach: the source's own origin, else public addresses only.

An llms.txt or page set is text someone else wrote: its links and its servers' redirects could point
the crawl at the user's own machine or network (127.0.0.1:6379, 169.254.169.254, a router), and what
came back would be indexed and served to agents. The user who adds a source consents to that one
origin (scheme, host, port), on localhost too; anything else must resolve only to globally routable
addresses. Every request is checked, each redirect hop included (an httpx request hook runs before
each hop is sent).

The one limit is DNS: a name can resolve to a public address when checked and to a private one when
connected (DNS rebinding). Without a proxy, `pinned_transport` closes that gap by connecting to the
very addresses it checked. With a proxy configured (HTTP(S)_PROXY / ALL_PROXY) the proxy resolves
names itself, so the check is made against our resolver's answer and cannot be pinned.

Names are looked up with a deadline (`resolve`): the system resolver takes none of its own, and with
an unreachable DNS server each lookup waited out the resolver's retries (10-30 s by resolv.conf's
defaults) before the page's own deadline could start counting.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


DNS_TIMEOUT_S = 10.0  # a lookup's deadline when the source's own (web_timeout_s) is not given


class Refused(Exception):
    """A request the policy does not allow; its text is the reason shown beside the page."""


def resolve(host: str, port: int, timeout_s: float) -> list[tuple[object, ...]]:
    """`socket.getaddrinfo(host, port)` for TCP, or OSError once `timeout_s` has passed without an
    answer. The lookup runs on a daemon thread of its own, which a lookup given up on leaves to end
    when the resolver does."""
    answer: Future[list[tuple[object, ...]]] = Future()

    def lookup() -> None:
        try:
            answer.set_result(list(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)))
        except BaseException as exc:  # handed to the waiting caller as it is
            answer.set_exception(exc)

    threading.Thread(target=lookup, name="ctx-dns-lookup", daemon=True).start()
    try:
        return answer.result(timeout=timeout_s)
    except FutureTimeout:
        raise OSError(f"no DNS answer within {timeout_s:g} s") from None


def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, the port filled in for http/https; -1 for a malformed port."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port out of range or not a number
        port = -1
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme)


def _is_public(ip: Address) -> bool:
    # is_global alone lets multicast through (224.0.0.1 is "global"), and an IPv6 address can carry
    # an IPv4 one (mapped, 6to4, Teredo, NAT64) that a gateway turns back into 10.x or 127.x.
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None and not _is_public(embedded):
            return False
    return ip.is_global and not (ip.is_multicast or ip.is_private or ip.is_loopback or ip.is_link_local
                                 or ip.is_reserved or ip.is_unspecified)


class Guard:
    """The reach policy of one source: `refusal(url)` says why a URL may not be requested."""

    def __init__(self, source_url: str, dns_timeout_s: float = DNS_TIMEOUT_S) -> None:
        self.origin = origin(source_url)
        self.dns_timeout_s = dns_timeout_s

    def addresses(self, host: str, port: int) -> list[str]:
        """host's addresses (no scope ids), looked up within dns_timeout_s; OSError otherwise."""
        infos = resolve(host, port, self.dns_timeout_s)
        # A scope id (fe80::1%eth0) is not part of the address.
        return list(dict.fromkeys(str(info[4][0]).split("%")[0] for info in infos))  # type: ignore[index]

    def own(self, host: str, port: int) -> bool:
        """Whether host:port is the source's own, which the user consented to whatever it resolves to."""
        return (host.lower(), port) == self.origin[1:]

    def public_addresses(self, host: str, port: int) -> list[str]:
        """host's addresses, when every one of them is public; else Refused naming host:port."""
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            addresses = self.addresses(host, port)
        except (OSError, UnicodeError) as exc:
            raise Refused(f"refused: cannot resolve {host}: {exc}") from None
        # All, not any: a name answering one public and one private address could be connected
        # to the private one.
        if not addresses or not all(_is_public(ipaddress.ip_address(a)) for a in addresses):
            raise Refused(f"refused: {shown} is not the source's site and not a public address")
        return addresses

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be requested, or None when it may."""
        scheme, host, port = origin(url)
        if scheme not in DEFAULT_PORTS:
            return f"refused: {scheme or 'no'} scheme, only http and https are fetched"
        if not host or port is None or port < 0:
            return f"refused: {url} has no valid host and port"
        if (scheme, host, port) == self.origin:
            return None
        try:
            self.public_addresses(host, port)
        except Refused as exc:
            return str(exc)
        return None

    def hook(self, request: httpx.Request) -> None:
        """httpx request hook: runs before every request, each redirect hop included."""
        if reason := self.refusal(str(request.url)):
            raise Refused(reason)


def pinned_transport(guard: Guard) -> httpx.HTTPTransport | None:
    """A transport that connects only to addresses `guard` passed, or None behind a proxy (see above)."""
    import urllib.request

    import httpcore
    import httpx

    if urllib.request.getproxies():
        return None  # httpx would bypass the proxy for a transport passed in; keep its own

    class PinnedBackend(httpcore.SyncBackend):
        """Connects a host that is not the source's own to the public addresses it checks just now."""

        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None) -> httpcore.NetworkStream:
            if guard.own(host, port):
                # Whatever the source's own name resolves to (the user chose it), looked up with a deadline.
                try:
                    addresses = guard.addresses(host, port)
                except (OSError, UnicodeError) as exc:
                    raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from None
            else:
                addresses = guard.public_addresses(host, port)
            error: Exception | None = None
            for address in addresses:
                try:
                    return super().connect_tcp(address, port, timeout, local_address, socket_options)
                except httpcore.ConnectError as exc:  # the next address, as create_connection would
                    error = exc
            raise error or httpcore.ConnectError(f"no address for {host}")

    # httpx takes no network backend; its pool does. Same TLS settings as its default transport.
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(),
                                              network_backend=PinnedBackend())
    return transport
