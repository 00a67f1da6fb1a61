"""Redact stage: scraped Msg rows (texts, tool inputs, file lists, session titles) -> the same rows with
secrets masked by the secrets stage (tasks/secrets.py) and long texts cut, before anything is stored."""

from __future__ import annotations

from collections.abc import Iterable

from ctxlake.tasks.scrape.base import ScrapeOutput
from ctxlake.tasks.secrets import MaskReport, mask_strings, mask_text
from ctxlake.tasks.stage import stage

# Memory's name for the secrets stage's counts.
RedactionReport = MaskReport


def redact_text(text: str, report: MaskReport | None = None) -> str:
    """Every secret in a conversation text (read like config: a bare `KEY=value` counts) masked."""
    return mask_text(text, None, report)


def redact_strings(values: Iterable[str], report: MaskReport | None = None) -> list[str]:
    return mask_strings(values, report)


@stage("redact")
def redact_scraped(out: ScrapeOutput, max_chars: int) -> tuple[ScrapeOutput, MaskReport]:
    """Scraped Msg rows and session titles -> the same with secrets masked and texts cut to max_chars."""
    report = MaskReport()
    for msg in out.messages:
        # Masked before the cut, so a secret that straddles the cut is not left half visible.
        msg.text = redact_text(msg.text, report)
        if len(msg.text) > max_chars:
            msg.text = msg.text[:max_chars] + f"\n… [{len(msg.text) - max_chars} more characters]"
        for call in msg.tool_calls:
            if call.get("input"):
                call["input"] = redact_text(call["input"], report)
        if msg.files:
            msg.files = redact_strings(msg.files, report)
    for meta in out.meta.values():
        meta.title = redact_text(meta.title, report)
    # Where malformed records are, and why: printed and kept in the run report, so no record
    # text a scraper quotes there may carry a secret out either (not counted: not stored rows).
    out.problems = mask_strings(out.problems)
    out.warnings = mask_strings(out.warnings)
    return out, report
