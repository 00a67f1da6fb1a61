"""Web sources against hostile servers on 127.0.0.1: links and redirects to other hosts (SSRF), pages that drip."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from docsite import DocSite, Page, serve

from ctxlake.errors import SourceError
from ctxlake.schemas.config import SourcesSettings
from ctxlake.schemas.sources import SourceSpec
from ctxlake.tasks.netguard import Guard, Refused, pinned_transport
from ctxlake.tasks.sources import Fetched, storage_dir

SECRET = "# Internal\n\nroot password: hunter2\n"


@contextmanager
def hostile(routes: dict[str, str], drip_s: float = 0.3, drip_bytes: int = 30,
            drip_paths: frozenset[str] | set[str] = frozenset({"/drip.md"})) -> Iterator[str]:
    """A server on 127.0.0.1: '/redirect...' paths answer 302 to routes[path]; drip_paths send a
    byte every drip_s (chunked), drip_bytes in all, so old code ends too, only late; the rest 200."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", routes[self.path])
                self.send_header("Content-Length", "0")
                self.end_headers()
            elif self.path in drip_paths:
                self.send_response(200)
                self.send_header("Content-Type", "text/markdown")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for _ in range(drip_bytes):
                        self.wfile.write(b"1\r\nx\r\n")
                        self.wfile.flush()
                        time.sleep(drip_s)
                    self.wfile.write(b"0\r\n\r\n")
                except OSError:  # the client gave up, as it should
                    self.close_connection = True
            else:
                body = routes.get(self.path, "").encode()
                self.send_response(200 if self.path in routes else 404)
                self.send_header("Content-Type", "text/markdown")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def sync(origin: str, home: Path, **limits: object) -> Fetched:
    from ctxlake.tasks.webdocs import fetch_web

    spec = SourceSpec(name="evilweb", type="web", origin=origin)
    return fetch_web.fn(spec, storage_dir(home, spec), SourcesSettings(**limits), home / "project")  # type: ignore[arg-type]


def indexed_text(root: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(root.rglob("*.md")))


@pytest.fixture
def internal() -> Iterator[DocSite]:
    """Another port on the same machine: a service the user never asked to index."""
    with serve(DocSite(pages={"/internal-secret.md": Page(SECRET)})) as running:
        yield running


def test_llms_txt_links_and_redirects_to_another_local_port_are_refused_and_never_requested(
        internal: DocSite, tmp_path: Path) -> None:
    secret = internal.url("/internal-secret.md")
    llms = ("# Evil\n\n## Docs\n\n- [Own](/a/own.md)\n- [Moved](/redirect-same)\n"
            f"- [x]({secret})\n- [r](/redirect-other)\n")
    routes = {"/a/llms.txt": llms, "/a/own.md": "# Own\n", "/a/moved.md": "# Moved here\n",
              "/redirect-same": "/a/moved.md", "/redirect-other": secret}
    with hostile(routes) as base:
        got = sync(f"{base}/a/llms.txt", tmp_path / "home")
    port = internal.base.rsplit(":", 1)[1]
    # Not fetched, not even asked for its robots.txt, not indexed.
    assert internal.log == []
    assert "hunter2" not in indexed_text(got.root)
    # The source's own pages, a redirect within its site included, are kept.
    assert "# Own" in indexed_text(got.root) and "# Moved here" in indexed_text(got.root)
    # Reported like any page not fetched, with the reason, for the link and for the redirect.
    assert got.status == "partial" and got.message is not None
    refused = f"(refused: 127.0.0.1:{port} is not the source's site and not a public address)"
    assert f"{secret} {refused}" in got.message and f"/redirect-other {refused}" in got.message


def test_a_page_refused_now_loses_the_copy_an_earlier_sync_stored(internal: DocSite, tmp_path: Path) -> None:
    # As if an older version had fetched it: the page is in meta.json and on disk.
    routes = {"/llms.txt": f"# Evil\n\n## Docs\n\n- [x]({internal.url('/internal-secret.md')})\n"}
    with hostile(routes) as base:
        home = tmp_path / "home"
        first = sync(f"{base}/llms.txt", home)
        meta = first.root.parent / "meta.json"
        data = json.loads(meta.read_text())
        data["pages"][internal.url("/internal-secret.md")] = {"file": "internal-secret.md", "etag": None,
                                                              "last_modified": None}
        meta.write_text(json.dumps(data))
        (first.root / "internal-secret.md").write_text(SECRET)
        again = sync(f"{base}/llms.txt", home)
    assert not (again.root / "internal-secret.md").exists() and "hunter2" not in indexed_text(again.root)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8080/x", "http://localhost:8000/x", "http://169.254.169.254/latest/meta-data/",
    "http://10.0.0.1/x", "http://192.168.1.1/x", "http://172.16.0.1/x", "http://100.64.0.1/x",
    "http://[::1]/x", "http://[fd00::1]/x", "http://[fe80::1]/x", "http://224.0.0.1/x", "http://0.0.0.0/x",
    "http://[::ffff:127.0.0.1]/x", "http://[64:ff9b::a00:1]/x", "http://240.0.0.1/x", "ftp://8.8.8.8/x",
    "http://127.0.0.1:9/x",  # the source's own host on another port is another site
])
def test_a_source_on_one_local_port_may_not_reach_any_other_private_address(url: str) -> None:
    reason = Guard("http://127.0.0.1:9000/llms.txt").refusal(url)
    assert reason is not None and reason.startswith("refused: ")


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000/docs/a.md",  # its own origin, although local: the user chose it
    "http://8.8.8.8/x", "https://[2606:4700:4700::1111]/x", "https://1.1.1.1:8443/x",
])
def test_a_source_may_reach_its_own_origin_and_public_addresses(url: str) -> None:
    assert Guard("http://127.0.0.1:9000/llms.txt").refusal(url) is None


def test_the_pinned_connection_checks_the_address_it_connects_to(internal: DocSite) -> None:
    # The request hook checks names; the connection itself is checked again at connect time, so a
    # name that resolved to a public address for the hook cannot connect to a private one.
    import httpx

    transport = pinned_transport(Guard("http://127.0.0.1:9/llms.txt"))
    if transport is None:
        pytest.skip("a proxy is configured: names are resolved by the proxy")
    with httpx.Client(transport=transport) as client, pytest.raises(Refused, match="not a public address"):
        client.get(internal.url("/internal-secret.md"))
    assert internal.log == []
    own = pinned_transport(Guard(internal.url("/llms.txt")))
    with httpx.Client(transport=own) as client:
        assert client.get(internal.url("/internal-secret.md")).text == SECRET


def test_a_page_that_drips_is_dropped_at_the_deadline_and_the_crawl_goes_on(tmp_path: Path) -> None:
    routes = {"/llms.txt": "# Slow\n\n## Docs\n\n- [Drip](/drip.md)\n- [Fine](/fine.md)\n", "/fine.md": "# Fine\n"}
    # 30 bytes at 0.3 s: 9 s in all, each read well under the 1 s timeout httpx applies per read.
    with hostile(routes, drip_s=0.3, drip_bytes=30) as base:
        started = time.monotonic()
        got = sync(f"{base}/llms.txt", tmp_path / "home", web_timeout_s=1.0)
        took = time.monotonic() - started
    assert took < 4, f"the crawl took {took:.1f} s for a 1 s deadline"
    assert got.status == "partial" and "drip.md (timed out after 1 s)" in (got.message or "")
    assert not (got.root / "drip.md").exists() and (got.root / "fine.md").is_file()


def test_a_robots_txt_that_drips_blocks_its_host_at_the_deadline(tmp_path: Path) -> None:
    with hostile({"/llms.txt": "# Slow\n"}, drip_paths={"/robots.txt"}) as base:
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"cannot fetch .*/llms.txt: robots.txt unreachable: timed out after 1 s"):
            sync(f"{base}/llms.txt", tmp_path / "home", web_timeout_s=1.0)
        took = time.monotonic() - started
    assert took < 4, f"robots.txt took {took:.1f} s for a 1 s deadline"


@contextmanager
def silent_dns(name: str, monkeypatch: pytest.MonkeyPatch, wait_s: float = 30.0) -> Iterator[None]:
    """`name` gets no DNS answer for wait_s (a resolver that is down); other names resolve as usual."""
    import socket

    real = socket.getaddrinfo
    release = threading.Event()

    def lookup(host: object, *args: object, **kwargs: object) -> object:
        if host == name:
            release.wait(wait_s)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    try:
        yield
    finally:
        release.set()


def test_a_source_whose_name_gets_no_dns_answer_fails_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The system resolver has no deadline: with the DNS server down, a sync waited out its retries
    (10-30 s by resolv.conf's defaults) per name before the page's own 1 s deadline began."""
    with silent_dns("docs.unanswered.example", monkeypatch):
        started = time.monotonic()
        with pytest.raises(SourceError, match=r"cannot resolve docs.unanswered.example: no DNS answer within 1 s"):
            sync("http://docs.unanswered.example/llms.txt", tmp_path / "home", web_timeout_s=1.0)
        took = time.monotonic() - started
    assert took < 5, f"the sync took {took:.1f} s for a 1 s deadline"


def test_a_link_whose_name_gets_no_dns_answer_is_given_up_and_the_crawl_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    routes = {"/llms.txt": "# Docs\n\n## Pages\n\n- [Far](http://far.unanswered.example/a.md)\n- [Fine](/fine.md)\n",
              "/fine.md": "# Fine\n"}
    with silent_dns("far.unanswered.example", monkeypatch), hostile(routes) as base:
        started = time.monotonic()
        got = sync(f"{base}/llms.txt", tmp_path / "home", web_timeout_s=1.0)
        took = time.monotonic() - started
    assert took < 5, f"the crawl took {took:.1f} s for a 1 s deadline"
    assert "cannot resolve far.unanswered.example: no DNS answer within 1 s" in (got.message or ""), got.message
    assert (got.root / "fine.md").is_file()
