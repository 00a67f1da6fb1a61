"""Every page in a real browser (Debian's Chromium driven by Playwright): loads without console
errors, search finds the file as you type, knowledge written in the UI reaches `ctx knowledge`,
a session's messages show, and a local folder source is added with live progress."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from uisite import CHROMIUM, SESSION_TEXT, Site

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])")
if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"{CHROMIUM} is missing: `python3 dev.py test` installs Debian's chromium (apt-get install chromium)",
                allow_module_level=True)

expect = playwright_api.expect
DEADLINE_MS = 60_000  # functional deadlines only: a loaded CI machine is slow, never wrong




@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Any]:
    # Never Playwright's own browser download: the system Chromium, by path.
    with playwright_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    p = context.new_page()
    p.set_default_timeout(DEADLINE_MS)
    problems: list[str] = []
    p.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    p.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    p.problems = problems
    yield p
    context.close()


@pytest.mark.parametrize("path", ["/", "/search", "/sessions", "/knowledge", "/sources", "/analytics", "/settings"])
def test_page_loads_without_console_errors(site: Site, page: Any, path: str) -> None:
    response = page.goto(site.url.rstrip("/") + path)
    assert response.status == 200
    expect(page.locator("nav a[aria-current=page]")).to_have_count(1)
    if path == "/":
        expect(page.locator("body")).to_have_attribute("data-ready", "1")  # the panels' data arrived
        expect(page.locator("#projects")).to_contain_text("shop")
        expect(page.locator("#ingestion")).to_contain_text("claude")
    if path == "/analytics":  # the headline figures and the charts drawn from the fixture's lake
        expect(page.locator("#headline")).to_contain_text("Sessions")
        expect(page.locator("section.chart svg")).to_have_count(6)
        expect(page.locator("section.chart", has_text="Chunks per language")).to_contain_text("python")
        expect(page.locator("section.chart", has_text="Sessions per tool per day")).to_contain_text("claude")
    page.wait_for_load_state("networkidle")
    assert page.problems == []


def test_search_as_you_type_finds_the_file_and_opens_it_at_the_hit(site: Site, page: Any) -> None:
    page.goto(site.url + "search")
    with page.expect_response(lambda r: "/api/search" in r.url and "voucher" in r.url) as answer:
        page.locator("#q").press_sequentially("refund voucher", delay=30)
    assert answer.value.status == 200
    results = page.locator("#results")
    expect(results).to_have_attribute("data-q", "refund voucher")  # the answer to the whole query, not a prefix
    expect(results).to_have_attribute("data-state", "done")
    first = results.locator("article.hit").first
    expect(first).to_have_attribute("data-path", "billing/refunds.py")
    expect(first.locator("mark").first).to_be_visible()  # the query words are highlighted
    first.locator(".hit-open").click()
    viewer = page.locator("#viewer")
    expect(viewer).to_be_visible()
    expect(viewer).to_have_attribute("data-path", "billing/refunds.py")
    expect(viewer.locator(".hit-line").first).to_contain_text("def issue_refund_voucher")
    expect(viewer.locator(".hit-line .ln").first).to_have_text("1")
    # Files to open first: the ranking `ctx files` uses.
    page.locator("#issue").fill("Printing a shipping label for a parcel fails")
    page.get_by_role("button", name="Rank files").click()
    expect(page.locator("#files-list li").first).to_contain_text("shipping/labels.py")
    assert page.problems == []


def test_knowledge_created_in_the_ui_reaches_the_cli_and_a_duplicate_is_refused(
        site: Site, page: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from ctxlake.serve.cli.app import run

    title = "Refunds are vouchers, never card payments"
    page.goto(site.url + "knowledge")
    form = page.locator("#knowledge-form")
    if not form.is_visible():
        page.locator("#create summary").click()
    form.get_by_label("Type").select_option("decision")
    form.get_by_label("Title").fill(title)
    form.get_by_label("Body").fill("Finance asked for it: vouchers keep the money in the shop.")
    form.get_by_role("button", name="Save").click()
    expect(page.locator("#knowledge-msg")).to_contain_text("Saved decision-")
    for key, value in site.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(site.repo)
    capsys.readouterr()
    assert run(["knowledge", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert title in [r["title"] for r in listed["records"]]
    page.goto(site.url + "knowledge")
    expect(page.locator("#knowledge-list")).to_contain_text(title)
    if not form.is_visible():
        page.locator("#create summary").click()
    form.get_by_label("Type").select_option("decision")
    form.get_by_label("Title").fill(title)
    form.get_by_label("Body").fill("Finance asked for it: vouchers keep the money in the shop.")
    form.get_by_role("button", name="Save").click()
    expect(page.locator("#knowledge-msg")).to_contain_text("Refused: duplicate of decision-")
    assert page.problems == []


def test_a_session_from_the_logs_shows_its_messages_and_brief(site: Site, page: Any) -> None:
    page.goto(site.url + "sessions")
    link = page.get_by_role("link", name=SESSION_TEXT[:30], exact=False).first
    expect(link).to_be_visible()
    link.click()
    expect(page.locator("h1")).to_contain_text("Make refunds go out as vouchers")
    messages = page.locator("ol.messages li")
    expect(messages.first).to_contain_text(SESSION_TEXT)
    expect(page.locator("ol.messages")).to_contain_text("We decided to issue vouchers")
    expect(page.locator("#brief")).to_contain_text("add a test for partial refunds")
    assert page.problems == []


def test_adding_a_local_folder_shows_progress_then_the_source(site: Site, page: Any, tmp_path: Path) -> None:
    folder = tmp_path / "vendored"
    folder.mkdir()
    (folder / "tax.py").write_text("def vat_rate(country):\n    return 0.2\n")
    page.goto(site.url + "sources")
    # No name: the source is named after its folder, as `ctx add ORIGIN` names it.
    page.get_by_label("Origin").fill(str(folder))
    page.get_by_label("Type").select_option("local")
    page.get_by_role("button", name="Add").click()
    job = page.locator("#job")
    expect(job).to_be_visible()
    expect(page.locator("#job-lines")).to_contain_text(f"-- {folder}")
    expect(job).to_have_attribute("data-state", "done", timeout=180_000)
    row = page.locator("tr[data-source=vendored]")
    expect(row).to_be_visible(timeout=DEADLINE_MS)  # the page reloads with the new source
    expect(row).to_contain_text("local")
    expect(row.locator("td").nth(2)).to_have_text("1")  # one file indexed
    assert page.problems == []


def test_keyboard_and_a_narrow_window(site: Site, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 420, "height": 800})
    page = context.new_page()
    page.set_default_timeout(DEADLINE_MS)
    page.goto(site.url + "sessions")
    page.keyboard.press("Tab")
    expect(page.locator(".skip")).to_be_focused()  # the first stop skips the navigation
    page.keyboard.press("Enter")
    expect(page.locator("#main")).to_be_focused()
    page.goto(site.url + "search")
    expect(page.locator("#q")).to_be_focused()  # the search page starts in its box
    page.keyboard.type("label printer")
    expect(page.locator("#results")).to_have_attribute("data-q", "label printer")
    expect(page.locator("#results")).to_have_attribute("data-state", "done")
    hit = page.locator("#results .hit-open").first
    hit.focus()
    page.keyboard.press("Enter")  # a result opens in the viewer without a mouse
    expect(page.locator("#viewer .hit-line").first).to_be_visible()
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 420, f"the page scrolls sideways at 420 px ({width} px wide)"
    for field in page.locator("input:not([type=hidden]), select, textarea").all():
        label = field.get_attribute("id")
        assert label and page.locator(f"label[for='{label}']").count() == 1, f"unlabelled field {label}"
    context.close()
