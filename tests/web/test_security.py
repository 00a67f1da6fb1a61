"""The UI's guard over plain HTTP: a rebinding Host gets 421, a foreign Origin 403, a state change
without the session's CSRF token 403; nothing outside the indexed files is read; strict CSP."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from uisite import Site


def call(url: str, method: str = "GET", headers: dict[str, str] | None = None,
         body: dict[str, Any] | None = None) -> tuple[int, dict[str, str], str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return res.status, dict(res.headers), res.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def session(site: Site) -> tuple[str, str]:
    """The cookie and CSRF token a browser gets with a page."""
    status, headers, html = call(site.url + "knowledge")
    assert status == 200
    cookie = headers["set-cookie"].split(";")[0]
    token = re.search(r'name="csrf-token" content="([0-9a-f]+)"', html)
    assert token
    return cookie, token.group(1)


def test_a_rebound_host_name_is_refused(site: Site) -> None:
    status, _, text = call(site.url, headers={"Host": "attacker.example:80"})
    assert status == 421 and "127.0.0.1" in text
    port = site.url.rsplit(":", 1)[1].strip("/")
    assert call(site.url, headers={"Host": f"attacker.example:{port}"})[0] == 421
    assert call(site.url, headers={"Host": f"localhost:{port}"})[0] == 200


def test_a_foreign_origin_is_refused_even_with_the_token(site: Site) -> None:
    cookie, token = session(site)
    status, _, text = call(site.url + "api/knowledge", "POST", {"Origin": "http://attacker.example", "Cookie": cookie,
                                                                "X-CSRF-Token": token}, {"type": "decision", "title": "x"})
    assert status == 403 and "Origin" in text
    assert call(site.url + "api/search?q=refund", headers={"Origin": "http://evil.test"})[0] == 403


def test_state_changes_need_the_sessions_csrf_token(site: Site) -> None:
    body = {"type": "insight", "title": "Labels print in batches of fifty"}
    assert call(site.url + "api/knowledge", "POST", body=body)[0] == 403  # no cookie, no token
    cookie, token = session(site)
    assert call(site.url + "api/knowledge", "POST", {"Cookie": cookie}, body)[0] == 403
    assert call(site.url + "api/knowledge", "POST", {"Cookie": cookie, "X-CSRF-Token": "0" * 64}, body)[0] == 403
    other_cookie, _ = session(site)  # another browser session's cookie with this token
    assert call(site.url + "api/knowledge", "POST", {"Cookie": other_cookie, "X-CSRF-Token": token}, body)[0] == 403
    status, _, text = call(site.url + "api/knowledge", "POST", {"Cookie": cookie, "X-CSRF-Token": token}, body)
    assert status == 200, text
    assert json.loads(text)["status"] == "created"
    assert list((site.repo / ".ctx" / "knowledge").rglob("*.md"))


def test_nothing_outside_the_indexed_files_is_read(site: Site, tmp_path: Any) -> None:
    secret = tmp_path / "outside.txt"
    secret.write_text("not for the browser\n")
    for path in ["../outside.txt", str(secret), "/etc/passwd", ".git/config", "billing/../../outside.txt"]:
        status, _, text = call(site.url + "api/file?" + urllib.parse.urlencode({"path": path}))
        assert status == 400, (path, text)
        assert "not for the browser" not in text and "root:" not in text
    status, _, _ = call(site.url + "api/search?" + urllib.parse.urlencode({"q": "refund", "project": str(tmp_path)}))
    assert status == 400  # only registered projects are served
    # An absolute path with a NUL byte was a 500 (a bare ValueError from resolving it).
    status, _, text = call(site.url + "api/file?" + urllib.parse.urlencode({"path": f"{site.repo}/README.md\0"}))
    assert status == 400 and "NUL byte" in json.loads(text)["error"], text
    assert call(site.url + "api/file?path=billing/refunds.py")[0] == 200


def test_pages_carry_a_strict_content_security_policy(site: Site) -> None:
    status, headers, html = call(site.url)
    assert status == 200
    csp = headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"
    assert "<script>" not in html and " on" + "click=" not in html  # no inline script for the CSP to allow
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
