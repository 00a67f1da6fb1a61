"""Redact stage: secrets in scraped Msg rows (and knowledge text) -> `[REDACTED:kind]`, before anything is stored."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ctxlake.tasks.scrape.base import ScrapeOutput
from ctxlake.tasks.stage import stage

# (kind, triggers, pattern). A rule runs only on texts holding one of its trigger strings (checked
# on the lowercased text): a plain substring test is what keeps redaction fast on hundreds of MB.
# A group named `keep` survives (a header name, an assignment's key); the rest of the match is
# replaced. Each kind is a token format its issuer documents, or a context that announces a
# secret (an assignment to *_TOKEN, a Bearer header); false positives in code (`token =
# next_token`) are the accepted price of never storing a live key.
RULES: list[tuple[str, tuple[str, ...], str]] = [
    ("private_key", ("private key",),
     r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----[\s\S]*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|\Z)"),
    ("aws_access_key", ("akia", "asia", "agpa", "aida", "aroa", "anpa", "anva", "aipa"),
     r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"),
    ("aws_secret_key", ("secret",), r"(?i:(?P<keep>aws_?secret_?access_?key[\"']?\s*[=:]\s*[\"']?))[A-Za-z0-9/+=]{40}"),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
     r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"),
    ("gitlab_token", ("glpat-",), r"\bglpat-[A-Za-z0-9_-]{20,}"),
    ("anthropic_key", ("sk-ant-",), r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    ("openai_key", ("sk-",), r"\bsk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("google_api_key", ("aiza",), r"\bAIza[0-9A-Za-z_-]{35}"),
    ("slack_token", ("xox",), r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    ("stripe_key", ("_live_", "_test_"), r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("npm_token", ("npm_",), r"\bnpm_[A-Za-z0-9]{36}"),
    ("jwt", ("eyj",), r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    ("auth_header", ("bearer", "authorization"),
     r"(?i:(?P<keep>\bauthorization\s*[:=]\s*[\"']?(?:bearer|basic|token)\s+|\bbearer\s+))[A-Za-z0-9._~+/-]{12,}=*"),
    ("url_password", ("://",), r"(?P<keep>\b[a-z][a-z0-9+.-]*://[^/\s:@\"']+:)[^@\s/\"']{3,}(?=@)"),
    # Anchored at a word start so the engine does not re-scan every word from each of its letters;
    # the name is checked in the replacement (see _ASSIGNED).
    ("assignment", ("secret", "token", "passw", "api_key", "apikey", "access_key", "accesskey", "private_key",
                    "credential", "auth_key", "authkey"),
     r"(?P<keep>\b(?P<name>[A-Za-z0-9_.-]+)[\"']?[ \t]*[=:][ \t]*[\"']?)(?P<value>[^\s\"',;(){}\[\]<>]{6,})"),
]
_ASSIGNED = re.compile(r"(?i)(?:secret|token|passw(?:or)?d|api_?key|access_?key|private_?key|secret_?key|credentials?|auth_?key)$")
# Without a secret-announcing name right before an `=` or `:` the assignment rule cannot match.
# Looking back from each `=`/`:` is ten times faster than searching for the names.
_ASSIGN_SIGN = re.compile(r"[=:]")
_NAME_BEFORE = re.compile(r"(?:secret|token|passw(?:or)?d|api_?key|access_?key|private_?key|credentials?|auth_?key)[\"']?[ \t]*$")


def _may_assign(lowered: str) -> bool:
    return any(_NAME_BEFORE.search(lowered, max(0, m.start() - 40), m.start()) for m in _ASSIGN_SIGN.finditer(lowered))


_COMPILED = [(kind, triggers, re.compile(pattern)) for kind, triggers, pattern in RULES]
MARK = "[REDACTED:{}]"


@dataclass
class RedactionReport:
    redacted: int = 0  # secrets replaced
    by_kind: dict[str, int] = field(default_factory=dict)


def redact_text(text: str, report: RedactionReport | None = None) -> str:
    """Every secret in `text` replaced by `[REDACTED:kind]`."""
    if not text:
        return text
    lowered = text.lower()
    for kind, triggers, pattern in _COMPILED:
        if not any(t in lowered for t in triggers):
            continue
        if kind == "assignment" and not _may_assign(lowered):
            continue

        def replace(m: re.Match[str], kind: str = kind) -> str:
            if kind == "assignment" and (not _ASSIGNED.search(m.group("name")) or m.group("value").startswith("[REDACTED")):
                return m.group(0)  # `name = value` where the name does not announce a secret
            if report is not None:
                report.redacted += 1
                report.by_kind[kind] = report.by_kind.get(kind, 0) + 1
            keep = m.groupdict().get("keep")
            return (keep or "") + MARK.format(kind)

        text = pattern.sub(replace, text)
    return text


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
