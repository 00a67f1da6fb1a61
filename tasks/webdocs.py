"""Fetch stage of web sources: an llms.txt (or a docs page set) -> markdown files in the source's folder, refreshed by ETag/Last-Modified."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urldefrag, urljoin, urlsplit
from urllib.robotparser import RobotFileParser

from ctxlake.errors import SourceError
from ctxlake.schemas.config import SourcesSettings
from ctxlake.schemas.sources import SourceSpec
from ctxlake.tasks.netguard import DEFAULT_PORTS, Guard, Refused, origin, pinned_transport
from ctxlake.tasks.sources import PAGES_DIR, Fetched, claim_storage, storage_lock
from ctxlake.tasks.stage import stage

if TYPE_CHECKING:
    import httpx

META_FILE = "meta.json"
INDEX_FILE = "llms.md"  # the llms.txt itself, kept as a page: it is a map of the docs
FULL_FILE = "llms-full.md"
TEXT_TYPES = ("text/markdown", "text/x-markdown", "text/plain")
HTML_TYPES = ("text/html", "application/xhtml+xml")
# A page set (a docs URL that is not an llms.txt) is followed this many links deep.
CRAWL_DEPTH = 3
_SKIP_EXT = re.compile(r"\.(png|jpe?g|gif|svg|ico|webp|pdf|zip|gz|tgz|css|js|mjs|json|xml|woff2?|ttf|mp4|webm)$", re.I)
_MD_LINK = re.compile(r"\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_LIST_LINK = re.compile(r"^\s*[-*+]\s*\[([^\]]+)\]\(\s*<?([^)\s>]+)>?\s*\)\s*(?::\s*(.*))?$")


# --- llms.txt ------------------------------------------------------------------------------------


@dataclass
class LlmsLink:
    title: str
    url: str
    notes: str
    section: str
    optional: bool


@dataclass
class LlmsTxt:
    """An llms.txt file (llmstxt.org): H1 title, > summary, free text, H2 sections of link lists."""

    title: str
    summary: str
    details: str
    links: list[LlmsLink] = field(default_factory=list)


def parse_llms_txt(text: str, base_url: str) -> LlmsTxt:
    """llms.txt text -> its parts; relative links are resolved against `base_url`."""
    title = summary = ""
    details: list[str] = []
    links: list[LlmsLink] = []
    section: str | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# ") and not title and section is None:
            title = stripped[2:].strip()
        elif stripped.startswith("## "):
            section = stripped[3:].strip()
        elif section is None and stripped.startswith(">") and not summary and not details:
            summary = stripped.lstrip("> ").strip()
        elif section is None:
            if stripped or details:
                details.append(line)
        else:
            match = _LIST_LINK.match(line)
            if match:
                url = urldefrag(urljoin(base_url, match.group(2)))[0]
                if urlsplit(url).scheme in ("http", "https"):
                    links.append(LlmsLink(match.group(1).strip(), url, (match.group(3) or "").strip(),
                                          section, section.lower() == "optional"))
    if not title and not links:
        raise SourceError(f"{base_url} is not an llms.txt: no '# Title' line and no link lists")
    return LlmsTxt(title, summary, "\n".join(details).strip(), links)


# --- pages ---------------------------------------------------------------------------------------


def page_file(url: str, source_url: str) -> str:
    """A safe relative file name for a page URL: sanitised path parts, never '..', always .md.

    Pages of the source URL's origin go at the top; other origins under '@host' ('@host_port' for a
    port that is not the scheme's own): '@' never survives sanitising, so no page of the source's
    own can land there, and the same host on another port is another site.
    """
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if not segments or parts.path.endswith("/"):
        segments.append("index")
    safe = [re.sub(r"[^A-Za-z0-9._-]+", "_", s).lstrip(".")[:100] or "_" for s in segments]
    stem = safe[-1]
    for ext in (".html", ".htm", ".md", ".mdx", ".markdown", ".txt"):
        if stem.lower().endswith(ext) and len(stem) > len(ext):
            stem = stem[: -len(ext)]
            break
    if parts.query:
        stem += "_" + hashlib.sha1(parts.query.encode()).hexdigest()[:8]
    safe[-1] = stem + ".md"
    scheme, host, port = origin(url)
    if (scheme, host, port) != origin(source_url):
        folder = re.sub(r"[^a-z0-9.-]+", "_", host).lstrip(".") or "host"
        if port != DEFAULT_PORTS.get(scheme):
            folder += f"_{port}"
        safe.insert(0, "@" + folder)
    return "/".join(safe)


def html_to_markdown(html: str) -> str:
    """HTML page -> markdown of its main content (navigation, scripts and styles dropped)."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(strip=True) if soup.title else ""
    for tag in soup(["script", "style", "noscript", "nav", "header", "footer", "aside", "form", "svg",
                     "iframe", "template"]):
        tag.decompose()
    main = soup.find("main") or soup.find("article") or soup.body or soup
    text = MarkdownConverter(heading_style="ATX", bullets="-", strip=["img"]).convert_soup(main)
    text = re.sub(r"\n{3,}", "\n\n", text).strip()
    if title and not text.startswith("# "):
        text = f"# {title}\n\n{text}"
    return text + "\n"


def _links_in(markdown: str, page_url: str) -> list[str]:
    return [urldefrag(urljoin(page_url, m.group(2)))[0] for m in _MD_LINK.finditer(markdown)]


class _Robots:
    """robots.txt per host, fetched once per sync. RFC 9309 2.3.1: a 4xx (or over five redirects)
    means no rules; a 5xx or no answer at all means "assume complete disallow", which is reported
    as what happened (robots.txt unreachable: ...), never as a rule the site does not have."""

    def __init__(self, client: httpx.Client, limits: SourcesSettings) -> None:
        self.client, self.agent, self.limits = client, limits.web_user_agent, limits
        self.rules: dict[str, RobotFileParser | str | None] = {}  # str: why the host is off limits
        self.lock = threading.Lock()

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be fetched, or None when it may."""
        parts = urlsplit(url)
        base = f"{parts.scheme}://{parts.netloc}"
        with self.lock:
            if base not in self.rules:
                self.rules[base] = self._load(base)
            rules = self.rules[base]
        if isinstance(rules, str):
            return rules
        if rules is None or rules.can_fetch(self.agent, url):
            return None
        return "disallowed by robots.txt"

    def _load(self, base: str) -> RobotFileParser | str | None:
        import httpx

        # Read like a page, under the same deadline and size limit: a robots.txt that drips or never
        # ends would otherwise hold the whole crawl.
        deadline = time.monotonic() + self.limits.web_timeout_s
        try:
            with self.client.stream("GET", f"{base}/robots.txt") as resp:
                status = resp.status_code
                body = _read_body(resp, self.limits.web_max_page_bytes, deadline,
                                  self.limits.web_timeout_s) if 200 <= status < 300 else b""
                text = body.decode(resp.encoding or "utf-8", errors="replace")
        except httpx.TooManyRedirects:
            return None
        except Refused as exc:  # robots.txt redirected off the allowed hosts
            return f"robots.txt {exc}"
        except _Dropped as exc:
            return f"robots.txt unreachable: {exc}"
        except httpx.HTTPError as exc:
            return f"robots.txt unreachable: {_http_error(exc)}"
        if 400 <= status < 500:
            return None
        if status >= 500:
            return f"robots.txt unreachable: HTTP {status}"
        parser = RobotFileParser()
        parser.parse(text.splitlines())
        return parser


def _http_error(exc: Exception) -> str:
    """`ConnectError: [Errno 111] Connection refused`; a bare timeout says only its kind."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class _Page:
    url: str
    status: str  # saved | unchanged | failed | gone | refused
    file: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    error: str | None = None
    markdown: str | None = None  # kept in memory for link discovery in page-set crawls


class _Crawl:
    """One sync of one web source: conditional GETs with size limits into `pages/`."""

    def __init__(self, spec: SourceSpec, folder: Path, limits: SourcesSettings) -> None:
        import httpx

        self.spec, self.limits = spec, limits
        self.pages_dir = folder / PAGES_DIR
        self.meta_path = folder / META_FILE
        self.meta: dict[str, Any] = _read_json(self.meta_path)
        self.old: dict[str, dict[str, Any]] = dict(self.meta.get("pages", {}))
        self.guard = Guard(spec.origin, dns_timeout_s=limits.web_timeout_s)
        # The hook checks every request, each redirect hop included, before it is sent (netguard.py).
        self.client = httpx.Client(
            headers={"User-Agent": limits.web_user_agent}, timeout=limits.web_timeout_s,
            follow_redirects=True, max_redirects=5, event_hooks={"request": [self.guard.hook]},
            transport=pinned_transport(self.guard),
        )
        self.robots = _Robots(self.client, limits)
        self.total_bytes = 0
        self.lock = threading.Lock()
        self.files: dict[str, str] = {}  # url -> file, unique within this sync

    def file_for(self, url: str, preferred: str | None = None) -> str:
        """The page's file: as named last time if it was, else from its URL; never shared by two URLs."""
        with self.lock:
            if url in self.files:
                return self.files[url]
            name = preferred or self.old.get(url, {}).get("file") or page_file(url, self.spec.origin)
            if name in self.files.values():
                name = f"{name.removesuffix('.md')}_{hashlib.sha1(url.encode()).hexdigest()[:8]}.md"
            self.files[url] = name
            return name

    def get(self, url: str, file: str | None = None) -> _Page:
        """One page: robots check, conditional GET, size limit, HTML -> markdown, saved to `file`."""
        import httpx

        file = self.file_for(url, file)
        # Before robots.txt: a host we may not reach is not asked for its robots.txt either.
        if refusal := self.guard.refusal(url):
            return _Page(url, "refused", file, error=refusal)
        if refusal := self.robots.refusal(url):
            return _Page(url, "failed", file, error=refusal)
        old = self.old.get(url, {})
        headers: dict[str, str] = {}
        if old.get("file") and (self.pages_dir / old["file"]).is_file():
            if old.get("etag"):
                headers["If-None-Match"] = old["etag"]
            if old.get("last_modified"):
                headers["If-Modified-Since"] = old["last_modified"]
        # httpx's timeout is per read: a page sending a byte a second would never time out. The
        # deadline starts before the request, so waiting for the headers counts, and is checked as
        # the body arrives. Headers sent a byte at a time are bounded only by httpx's per-read
        # timeout and h11's cap on header size: httpcore gives us no handle to cut them off.
        deadline = time.monotonic() + self.limits.web_timeout_s
        try:
            with self.client.stream("GET", url, headers=headers) as resp:
                if resp.status_code == 304:
                    return _Page(url, "unchanged", old["file"], old.get("etag"), old.get("last_modified"),
                                 markdown=self._read(old["file"]))
                if resp.status_code in (404, 410):
                    return _Page(url, "gone", file, error=f"HTTP {resp.status_code}")
                if resp.status_code != 200:
                    return _Page(url, "failed", file, error=f"HTTP {resp.status_code}")
                body = self._body(resp, deadline)
                ctype = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                text = body.decode(resp.encoding or "utf-8", errors="replace")
                etag, modified = resp.headers.get("etag"), resp.headers.get("last-modified")
        except _Dropped as exc:
            return _Page(url, "failed", file, error=str(exc))
        except Refused as exc:  # a redirect off the allowed hosts
            return _Page(url, "refused", file, error=str(exc))
        except httpx.HTTPError as exc:
            return _Page(url, "failed", file, error=_http_error(exc))
        if ctype in HTML_TYPES or (not ctype and text.lstrip().lower().startswith(("<!doctype html", "<html"))):
            markdown = html_to_markdown(text)
        elif ctype in TEXT_TYPES or not ctype:
            markdown = text
        else:
            return _Page(url, "failed", file, error=f"unsupported content type {ctype}")
        self._write(file, f"<!-- {url} -->\n{markdown}")
        return _Page(url, "saved", file, etag, modified, markdown=markdown)

    def _body(self, resp: httpx.Response, deadline: float) -> bytes:
        body = _read_body(resp, self.limits.web_max_page_bytes, deadline, self.limits.web_timeout_s)
        size = len(body)
        with self.lock:
            if self.total_bytes + size > self.limits.web_max_total_bytes:
                raise _TooBig(f"over the source's size limit of {self.limits.web_max_total_bytes:,} bytes")
            self.total_bytes += size
        return body

    def _target(self, file: str) -> Path:
        target = (self.pages_dir / file).resolve()
        if not target.is_relative_to(self.pages_dir.resolve()):
            raise SourceError(f"refusing to write outside {self.pages_dir}: {file}")
        return target

    def _write(self, file: str, text: str) -> None:
        target = self._target(file)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(target)

    def _read(self, file: str) -> str:
        try:
            return self._target(file).read_text(encoding="utf-8")
        except OSError:
            return ""

    def many(self, urls: list[str]) -> list[_Page]:
        with ThreadPoolExecutor(max_workers=self.limits.web_concurrency) as pool:
            return list(pool.map(self.get, urls))


class _Dropped(Exception):
    """A page given up on while reading it (too big, too slow); its text is the reason shown."""


class _TooBig(_Dropped):
    pass


def _read_body(resp: httpx.Response, limit: int, deadline: float, timeout_s: float) -> bytes:
    """A response's body, or _Dropped past `limit` bytes or past `deadline` (time.monotonic(),
    taken before the request was sent: timeout_s from then)."""
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _TooBig(f"larger than {limit:,} bytes ({int(declared):,})")
    chunks: list[bytes] = []
    size = 0
    timed_out = _Dropped(f"timed out after {timeout_s:g} s")
    if time.monotonic() > deadline:
        raise timed_out
    for chunk in resp.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise _TooBig(f"larger than {limit:,} bytes")
        # Checked between reads: one read that stalls still waits out httpx's read timeout, so a
        # page takes at most about twice web_timeout_s, never without end.
        if time.monotonic() > deadline:
            raise timed_out
        chunks.append(chunk)
    return b"".join(chunks)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _same_site(url: str, prefix: str) -> bool:
    return url.startswith(prefix) and not _SKIP_EXT.search(urlsplit(url).path)


@stage("fetch-web", retries=1)
def fetch_web(spec: SourceSpec, folder: Path, limits: SourcesSettings, user: Path) -> Fetched:
    """Web SourceSpec -> markdown pages under `folder`/pages; partial when any page failed."""
    with storage_lock(folder):
        crawl = _Crawl(spec, folder, limits)
        try:
            return _sync(crawl, spec, folder, limits, user)
        finally:
            crawl.client.close()


def _sync(crawl: _Crawl, spec: SourceSpec, folder: Path, limits: SourcesSettings, user: Path) -> Fetched:
    started = time.time()
    origin = spec.origin
    path = urlsplit(origin).path.lower().rstrip("/")
    is_llms = path.endswith("/llms.txt") or path.endswith("/llms-full.txt")
    first = crawl.get(origin, FULL_FILE if path.endswith("/llms-full.txt") else INDEX_FILE if is_llms else None)
    if first.status in ("failed", "gone", "refused"):
        raise SourceError(f"cannot fetch {origin}: {first.error}",
                          hint="check the URL; pages fetched before stay indexed" if crawl.old else None)
    pages: list[_Page] = [first]
    skipped: list[tuple[str, str]] = []
    if is_llms and not path.endswith("/llms-full.txt"):
        parsed = parse_llms_txt(first.markdown or "", origin)
        wanted = [ln.url for ln in parsed.links if limits.web_include_optional or not ln.optional]
        wanted = [u for u in dict.fromkeys(wanted) if u != origin]
        room = limits.web_max_pages - 1
        skipped += [(u, f"over the page limit of {limits.web_max_pages}") for u in wanted[room:]]
        pages += crawl.many(wanted[:room])
    elif not is_llms:
        prefix = origin.rsplit("/", 1)[0] + "/"
        seen = {origin}
        frontier = [first]
        for _ in range(CRAWL_DEPTH):
            found = [u for p in frontier for u in _links_in(p.markdown or "", p.url)
                     if _same_site(u, prefix) and u not in seen]
            found = list(dict.fromkeys(found))
            room = limits.web_max_pages - len(pages)
            skipped += [(u, f"over the page limit of {limits.web_max_pages}") for u in found[max(room, 0):]]
            found = found[: max(room, 0)]
            if not found:
                break
            seen.update(found)
            frontier = crawl.many(found)
            pages += frontier
    return _finish(crawl, spec, folder, pages, skipped, user, time.time() - started)


def _finish(crawl: _Crawl, spec: SourceSpec, folder: Path, pages: list[_Page],
            skipped: list[tuple[str, str]], user: Path, seconds: float) -> Fetched:
    kept: dict[str, dict[str, Any]] = {}
    changed = False
    for page in pages:
        if page.status in ("saved", "unchanged") and page.file:
            kept[page.url] = {"file": page.file, "etag": page.etag, "last_modified": page.last_modified}
            changed |= page.status == "saved"
        elif page.status == "failed" and page.url in crawl.old:
            kept[page.url] = crawl.old[page.url]  # a transient failure keeps the copy we have
    # Files of pages no longer listed, gone (404/410), or renamed are deleted.
    keep_files = {v["file"] for v in kept.values()}
    for old in crawl.old.values():
        if old.get("file") and old["file"] not in keep_files:
            target = crawl._target(old["file"])
            if target.is_file():
                target.unlink()
                changed = True
    # A refused page keeps no earlier copy (it is dropped above): what an older version fetched
    # from a host now refused must leave the index.
    failures = [(p.url, p.error or p.status) for p in pages if p.status in ("failed", "gone", "refused")] + skipped
    digest = hashlib.sha1(json.dumps(sorted((u, v["file"], v.get("etag")) for u, v in kept.items())).encode())
    crawl.meta = {
        "origin": spec.origin, "pages": kept, "synced_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(seconds, 2), "failures": [{"url": u, "error": e} for u, e in failures],
    }
    (folder / META_FILE).write_text(json.dumps(crawl.meta, indent=1), encoding="utf-8")
    claim_storage(folder, user)
    total = len(pages) + len(skipped)
    if failures:
        shown = "; ".join(f"{u} ({e})" for u, e in failures[:5]) + (" …" if len(failures) > 5 else "")
        message = f"{len(failures)} of {total} page(s) not fetched: {shown}"
        return Fetched(crawl.pages_dir, digest.hexdigest()[:16], None, "partial", message, changed)
    return Fetched(crawl.pages_dir, digest.hexdigest()[:16], None, "ok", None, changed)

