"""Redact stage: secrets in scraped Msg rows (and knowledge text) -> `[REDACTED:kind]`, before anything is stored."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ctxlake.tasks.scrape.base import ScrapeOutput
from ctxlake.tasks.stage import stage

# (kind, pattern). A group named `keep` survives (a header name, an assignment's key), the rest of
# the match is replaced. Each kind is a token format its issuer documents, or a context that
# announces a secret (an assignment to *_TOKEN, a Bearer header); false positives in code
# (`token = next_token`) are the accepted price of never storing a live key.
RULES: list[tuple[str, str]] = [
    ("private_key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)"),
    ("aws_access_key", r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"),
    ("aws_secret_key", r"(?i:(?P<keep>aws_?secret_?access_?key[\"']?\s*[=:]\s*[\"']?))[A-Za-z0-9/+=]{40}"),
    ("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"),
    ("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("anthropic_key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}"),
    ("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("stripe_key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("npm_token", r"\bnpm_[A-Za-z0-9]{36}"),
    ("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("auth_header", r"(?i:(?P<keep>\b(?:authorization\s*[:=]\s*[\"']?)?(?:bearer|basic|token)\s+))[A-Za-z0-9._~+/-]{12,}=*"),
    ("url_password", r"(?P<keep>\b[a-z][a-z0-9+.-]*://[^/\s:@\"']+:)[^@\s/\"']{3,}(?=@)"),
    ("assignment",
     r"(?i:(?P<keep>\b[A-Z0-9_.-]*(?:SECRET|TOKEN|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|SECRET_?KEY|CREDENTIALS?|AUTH_?KEY)"
     r"[\"']?\s*[=:]\s*[\"']?))(?![\[\"']?REDACTED)[^\s\"',;(){}\[\]<>]{6,}"),
]
_COMBINED = re.compile("|".join(f"(?P<r{i}>{pat.replace('(?P<keep>', f'(?P<k{i}>')})" for i, (_, pat) in enumerate(RULES)))
_KINDS = [kind for kind, _ in RULES]
MARK = "[REDACTED:{}]"


@dataclass
class RedactionReport:
    redacted: int = 0  # secrets replaced
    by_kind: dict[str, int] = field(default_factory=dict)


def redact_text(text: str, report: RedactionReport | None = None) -> str:
    """Every secret in `text` replaced by `[REDACTED:kind]`."""
    if not text:
        return text

    def replace(m: re.Match[str]) -> str:
        group = m.lastgroup or ""
        i = int(group[1:])
        kind = _KINDS[i]
        if report is not None:
            report.redacted += 1
            report.by_kind[kind] = report.by_kind.get(kind, 0) + 1
        keep = m.group(f"k{i}") if f"k{i}" in _COMBINED.groupindex else None
        return (keep or "") + MARK.format(kind)

    return _COMBINED.sub(replace, text)


def redact_strings(values: Iterable[str], report: RedactionReport | None = None) -> list[str]:
    return [redact_text(v, report) for v in values]


@stage("redact")
def redact_scraped(out: ScrapeOutput, max_chars: int) -> tuple[ScrapeOutput, RedactionReport]:
    """Scraped Msg rows and session titles -> the same with secrets replaced and texts cut to max_chars."""
    report = RedactionReport()
    for msg in out.messages:
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
    return out, report
