"""Web sources against a real HTTP server on 127.0.0.1: llms.txt parsing, robots, ETag refresh, 404s, limits, safe file names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from docsite import DocSite, Page, serve

from ctxlake.errors import SourceError
from ctxlake.schemas.config import SourcesSettings
from ctxlake.schemas.sources import SourceSpec
from ctxlake.tasks.sources import Fetched, storage_dir
from ctxlake.tasks.webdocs import html_to_markdown, page_file, parse_llms_txt

LLMS = """# DemoLib

> DemoLib builds agents from small tools.

Everything is a tool.

## Docs

- [Quickstart](/docs/quickstart.md): first steps
- [Tools](/docs/tools.html): how tools work
- [Missing](/docs/missing.md)
- [Secret](/private/secret.md)

## Optional

- [Changelog](/docs/changelog.md)
"""

TOOLS_HTML = """<!doctype html><html><head><title>Tools</title><script>var tracking = 1;</script>
<style>.x{color:red}</style></head><body><nav>Home | Blog | Pricing</nav>
<main><h2>Custom tools</h2><p>Call <code>make_tool(name)</code> to create a <b>custom tool</b>.</p>
<ul><li>one</li><li>two</li></ul><pre><code>tool = make_tool("search")</code></pre></main>
<footer>Copyright footer</footer></body></html>"""


def docs_site() -> DocSite:
    return DocSite(pages={
        "/robots.txt": Page("User-agent: *\nDisallow: /private/\n", "text/plain"),
        "/llms.txt": Page(LLMS, "text/plain; charset=utf-8"),
        "/docs/quickstart.md": Page("# Quickstart\n\nInstall DemoLib and run `demo init`.\n"),
        "/docs/tools.html": Page(TOOLS_HTML, "text/html; charset=utf-8"),
        "/docs/changelog.md": Page("# Changelog\n\n## 1.0\n\nFirst release.\n"),
        "/private/secret.md": Page("# Secret\n"),
    })


@pytest.fixture
def site() -> Iterator[DocSite]:
    with serve(docs_site()) as running:
        yield running


def sync(site: DocSite, home: Path, path: str = "/llms.txt", **limits: object) -> Fetched:
    from ctxlake.tasks.webdocs import fetch_web

    spec = SourceSpec(name="demo", type="web", origin=site.url(path))
    return fetch_web.fn(spec, storage_dir(home, spec), SourcesSettings(**limits), home / "project")  # type: ignore[arg-type]


def saved(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*.md"))}


def test_llms_txt_crawl_saves_markdown_and_reports_partial(site: DocSite, tmp_path: Path) -> None:
    got = sync(site, tmp_path / "home")
    files = saved(got.root)
    assert set(files) == {"llms.md", "docs/quickstart.md", "docs/tools.md", "docs/changelog.md"}
    assert files["docs/quickstart.md"].startswith(f"<!-- {site.url('/docs/quickstart.md')} -->\n# Quickstart")
    tools = files["docs/tools.md"]
    assert "# Tools" in tools and "make_tool(name)" in tools and "**custom tool**" in tools
    assert "tool = make_tool(\"search\")" in tools
    assert "Pricing" not in tools and "tracking" not in tools and "Copyright" not in tools
    # Robots: the disallowed page is never requested; the 404 is reported, not hidden.
    assert site.requests("/private/secret.md") == []
    assert got.status == "partial"
    assert got.message is not None and "2 of 6 page(s) not fetched" in got.message
    assert "missing.md (HTTP 404)" in got.message and "secret.md (disallowed by robots.txt)" in got.message


def test_refresh_uses_etags_and_refetches_only_what_changed(site: DocSite, tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = sync(site, home)
    site.log.clear()
    again = sync(site, home)
    assert not again.changed and again.resolved == first.resolved
    assert site.requests("/llms.txt") == [304] and site.requests("/docs/quickstart.md") == [304]
    site.pages["/docs/quickstart.md"] = Page("# Quickstart\n\nInstall DemoLib, then `demo run`.\n")
    site.log.clear()
    third = sync(site, home)
    assert third.changed and third.resolved != first.resolved
    assert site.requests("/docs/quickstart.md") == [200] and site.requests("/docs/tools.html") == [304]
    assert "demo run" in (third.root / "docs/quickstart.md").read_text()


def test_pages_dropped_from_llms_txt_or_gone_are_deleted(site: DocSite, tmp_path: Path) -> None:
    home = tmp_path / "home"
    root = sync(site, home).root
    assert (root / "docs/changelog.md").is_file()
    site.pages["/llms.txt"] = Page(LLMS.replace("- [Quickstart](/docs/quickstart.md): first steps\n", ""))
    del site.pages["/docs/changelog.md"]
    got = sync(site, home)
    assert got.changed
    assert not (root / "docs/quickstart.md").exists() and not (root / "docs/changelog.md").exists()
    assert (root / "docs/tools.md").is_file()
    # A server error is transient: the copy we have stays.
    site.pages["/docs/tools.html"] = Page("oops", "text/plain", status=503)
    got = sync(site, home)
    assert got.status == "partial" and "tools.html (HTTP 503)" in (got.message or "")
    assert "make_tool" in (root / "docs/tools.md").read_text()


def test_last_modified_refresh_and_bounded_concurrency(tmp_path: Path) -> None:
    stamp = "Wed, 21 Oct 2026 07:28:00 GMT"
    pages = {f"/p{i}.md": Page(f"# P{i}\n", etag=False, last_modified=stamp) for i in range(8)}
    llms = "# Many\n\n## Docs\n\n" + "".join(f"- [P{i}](/p{i}.md)\n" for i in range(8))
    with serve(DocSite(pages={"/llms.txt": Page(llms, etag=False, last_modified=stamp), **pages},
                       delay_s=0.2)) as site:
        first = sync(site, tmp_path / "home", web_concurrency=3)
        assert first.status == "ok" and len(saved(first.root)) == 9
        # 8 pages at 0.2 s each: several at once, never more than the limit.
        assert 2 <= site.max_in_flight <= 3
        site.log.clear()
        again = sync(site, tmp_path / "home", web_concurrency=3)
        assert not again.changed
        assert {status for _, path, status in site.log if path != "/robots.txt"} == {304}


def test_limits_and_optional_section(site: DocSite, tmp_path: Path) -> None:
    no_optional = sync(site, tmp_path / "a", web_include_optional=False)
    assert not (no_optional.root / "docs/changelog.md").exists()
    small = sync(site, tmp_path / "b", web_max_page_bytes=300)
    assert "tools.html (larger than 300 bytes" in (small.message or "")
    assert not (small.root / "docs/tools.md").exists()
    few = sync(site, tmp_path / "c", web_max_pages=2)
    assert set(saved(few.root)) == {"llms.md", "docs/quickstart.md"}
    assert "over the page limit of 2" in (few.message or "")


def test_unreachable_index_is_an_error(site: DocSite, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"cannot fetch .*/nope/llms.txt: HTTP 404"):
        sync(site, tmp_path / "home", "/nope/llms.txt")
    site.pages["/html/llms.txt"] = Page("<html><body>hello</body></html>", "text/html")
    with pytest.raises(SourceError, match=r"is not an llms\.txt"):
        sync(site, tmp_path / "home", "/html/llms.txt")


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_host_that_is_down_is_reported_as_down_not_as_a_robots_refusal(site: DocSite, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{closed_port()}"
    # The index itself on a dead host: the user reads the connection error.
    from ctxlake.tasks.webdocs import fetch_web

    spec = SourceSpec(name="nohost", type="web", origin=f"{down}/llms.txt")
    with pytest.raises(SourceError, match=r"cannot fetch .*/llms.txt: robots.txt unreachable: ConnectError: .*refused") as raised:
        fetch_web.fn(spec, storage_dir(tmp_path / "home", spec), SourcesSettings(), tmp_path / "project")
    assert "disallowed" not in str(raised.value)
    # A host whose robots.txt answers 503 says that, not "disallowed".
    busy = DocSite(pages={"/robots.txt": Page("busy", "text/plain", status=503), "/llms.txt": Page(LLMS)})
    with serve(busy), pytest.raises(SourceError, match=r"cannot fetch .*/llms.txt: robots.txt unreachable: HTTP 503"):
        sync(busy, tmp_path / "busy")
    assert busy.requests("/llms.txt") == []
    # Pages on other local ports are refused by the reach policy (test_webdocs_hardening.py) and
    # read as refused; the one rule this site does have is still named as a rule.
    site.pages["/llms.txt"] = Page(LLMS + f"- [Elsewhere]({down}/docs/elsewhere.md)\n")
    got = sync(site, tmp_path / "home")
    assert got.message is not None and "elsewhere.md (refused: " in got.message
    assert got.message.count("disallowed by robots.txt") == 1 and "secret.md (disallowed by robots.txt)" in got.message
    # RFC 9309: robots.txt that is missing (4xx) allows everything, the private page included.
    del site.pages["/robots.txt"]
    site.pages["/llms.txt"] = Page(LLMS)
    allowed = sync(site, tmp_path / "home")
    assert (allowed.root / "private/secret.md").is_file()


def test_llms_full_txt_is_saved_whole(site: DocSite, tmp_path: Path) -> None:
    site.pages["/llms-full.txt"] = Page("# DemoLib\n\n## Tools\n\nAll of it, inline. [link](/docs/x.md)\n", "text/plain")
    got = sync(site, tmp_path / "home", "/llms-full.txt")
    assert set(saved(got.root)) == {"llms-full.md"} and got.status == "ok"
    assert site.requests("/docs/x.md") == []


def test_page_set_crawl_stays_under_the_start_folder(site: DocSite, tmp_path: Path) -> None:
    site.pages.update({
        "/guide/index.html": Page('<html><body><main><h1>Guide</h1><a href="a.html">A</a> <a href="/guide/b.md">B</a> '
                                  '<a href="/other/x.html">X</a> <a href="logo.png">logo</a></main></body></html>',
                                  "text/html"),
        "/guide/a.html": Page('<html><body><main><h1>A</h1><a href="deep/c.html">C</a></main></body></html>', "text/html"),
        "/guide/b.md": Page("# B\n\nMarkdown page.\n"),
        "/guide/deep/c.html": Page("<html><body><main><h1>C</h1></main></body></html>", "text/html"),
        "/other/x.html": Page("<html><body>outside</body></html>", "text/html"),
    })
    got = sync(site, tmp_path / "home", "/guide/index.html")
    assert set(saved(got.root)) == {"guide/index.md", "guide/a.md", "guide/b.md", "guide/deep/c.md"}
    assert got.status == "ok"
    assert site.requests("/other/x.html") == [] and site.requests("/guide/logo.png") == []


def test_parse_llms_txt_parts() -> None:
    parsed = parse_llms_txt(LLMS, "https://docs.example.com/llms.txt")
    assert parsed.title == "DemoLib" and parsed.summary == "DemoLib builds agents from small tools."
    assert parsed.details == "Everything is a tool."
    assert [(ln.title, ln.url, ln.notes, ln.optional) for ln in parsed.links][:2] == [
        ("Quickstart", "https://docs.example.com/docs/quickstart.md", "first steps", False),
        ("Tools", "https://docs.example.com/docs/tools.html", "how tools work", False),
    ]
    assert [ln.title for ln in parsed.links if ln.optional] == ["Changelog"]
    with pytest.raises(SourceError):
        parse_llms_txt("just some text\nwithout structure\n", "https://x/llms.txt")


@pytest.mark.parametrize(("url", "expected"), [
    ("https://d.io/docs/intro.html", "docs/intro.md"),
    ("https://d.io/docs/", "docs/index.md"),
    ("https://d.io/", "index.md"),
    ("https://d.io/a/../../etc/passwd", "a/_/_/etc/passwd.md"),
    ("https://d.io/%2e%2e/x.md", "_2e_2e/x.md"),
    ("https://other.org/p/q.md", "@other.org/p/q.md"),
    ("https://d.io:8443/docs/intro.html", "@d.io_8443/docs/intro.md"),
    ("http://d.io/docs/intro.html", "@d.io/docs/intro.md"),
    ("https://d.io:443/docs/intro.html", "docs/intro.md"),
    ("https://d.io/search?q=1", "search_"),
    ("https://d.io/.hidden/.env", "hidden/env.md"),
])
def test_page_file_names_are_safe(url: str, expected: str) -> None:
    name = page_file(url, "https://d.io/llms.txt")
    assert name.startswith(expected)
    assert ".." not in name.split("/") and not name.startswith("/") and name.endswith(".md")
    assert all(part and not part.startswith(".") for part in name.split("/"))


def test_html_to_markdown_keeps_main_content() -> None:
    text = html_to_markdown(TOOLS_HTML)
    assert text.startswith("# Tools\n") and "## Custom tools" in text and "- one" in text
    assert "Home | Blog" not in text
