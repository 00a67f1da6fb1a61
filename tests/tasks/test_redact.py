"""Redaction: each kind of secret is replaced, ordinary code and prose are left alone."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime

import pytest

from ctxlake.tasks.redact import RedactionReport, redact_scraped, redact_text
from ctxlake.tasks.scrape.base import Msg, ScrapeOutput, SessionMeta

# Test values are built from parts so the repository itself holds no string a scanner would flag.
AWS_ID = "AKIA" + "QWERTYUIOPASDFGH"
GITHUB = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
OPENAI = "sk-" + "proj-" + "Zx9Yw8Vu7Ts6Rq5Po4Nm3Lk2"
SLACK = "xoxb-" + "2048-1024-AbCdEfGhIjKl"
GOOGLE = "AIza" + "SyD-1234567890abcdefghijklmnopqrstu"
JWT = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiJ1c2VyLTQyIn0" + ".c2lnbmF0dXJlLXBhcnQtb25l"
PEM = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQUJDREVGR0g=\n-----END OPENSSH PRIVATE KEY-----"

SECRETS = [
    (f"export AWS_ACCESS_KEY_ID={AWS_ID}", AWS_ID, "export AWS_ACCESS_KEY_ID=[REDACTED:"),
    ("aws_secret_access_key = " + "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY", "wJalrXUtnFEMI", "aws_secret_access_key = [REDACTED:"),
    (f"git remote set-url origin https://{GITHUB}@github.com/o/r", GITHUB, None),
    (f'client = OpenAI(api_key="{OPENAI}")', OPENAI, None),
    (f"SLACK={SLACK}", SLACK, None),
    (f"key={GOOGLE}&q=1", GOOGLE, None),
    (f"Cookie: session={JWT}", JWT, None),
    (f"cat id_ed25519\n{PEM}\nthen ssh", "b3BlbnNzaC1rZXktdjEAAAAA", "then ssh"),
    ("curl -H 'Authorization: Bearer abcDEF123456ghiJKL789' https://api.example.com", "abcDEF123456ghiJKL789", "Authorization: Bearer [REDACTED:"),
    ("DATABASE_URL=postgres://app:S3cr3t-Pa55@db.internal:5432/app", "S3cr3t-Pa55", "postgres://app:[REDACTED:url_password]@db.internal"),
    ("DB_PASSWORD=correct-horse-battery", "correct-horse-battery", "DB_PASSWORD=[REDACTED:"),
    ('{"client_secret": "q9w8e7r6t5y4"}', "q9w8e7r6t5y4", '"client_secret": "[REDACTED:'),
    ("STRIPE_KEY: " + "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc", None),
]


@pytest.mark.parametrize(("text", "secret", "kept"), SECRETS, ids=[s[0][:30] for s in SECRETS])
def test_secrets_are_replaced(text: str, secret: str, kept: str | None) -> None:
    report = RedactionReport()
    out = redact_text(text, report)
    assert secret not in out
    assert "[REDACTED:" in out and report.masked >= 1
    if kept:
        assert kept in out


@pytest.mark.parametrize("text", [
    "def get_token(self):\n    return self.tokens[0]",
    "max_tokens: 256\ntoken_count = 12",
    "The password field is optional.",
    "see https://github.com/o/r/blob/main/README.md",
    "sha 3f2a1c9e8b7d6540a1b2c3d4e5f60718293a4b5c",
    "Authorization header missing",
])
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact_text(text) == text


def test_scraped_rows_titles_and_tool_inputs_are_redacted_and_cut() -> None:
    msg = Msg(tool="claude", session_id="s", timestamp=datetime(2026, 1, 1, tzinfo=UTC), seq=0, role="assistant",
              kind="text", text=f"Set GITHUB_TOKEN={GITHUB} then push. " + "x" * 500, key="k", source_file="f",
              tool_calls=[{"id": None, "name": "Bash", "input": f"export OPENAI_API_KEY={OPENAI}", "is_error": None}])
    out = ScrapeOutput(messages=[msg], meta={("claude", "s"): SessionMeta("claude", "s", title=f"use {SLACK}")})
    out, report = redact_scraped.fn(out, 200)
    assert GITHUB not in msg.text and OPENAI not in msg.tool_calls[0]["input"] and SLACK not in out.meta[("claude", "s")].title
    assert report.masked == 3
    assert msg.text.startswith("Set GITHUB_TOKEN=[REDACTED:") and "more characters]" in msg.text and len(msg.text) < 260


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_a_bare_jwt_is_masked_whole_signature_included() -> None:
    """detect-secrets' lazy JWT pattern stopped at the payload and left the signature in the text."""
    header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    payload = _b64url(json.dumps({"sub": "1234567890", "name": "John Doe", "iat": 1516239022}).encode())
    signature = _b64url(hashlib.sha256(b"not a real key").digest())
    assert len(signature) == 43
    token = f"{header}.{payload}.{signature}"
    for text in (f"jwt {token}", f"Authorization: {token}\n", f'{{"id_token": "{token}"}}', f"token={token}."):
        out = redact_text(text)
        assert signature[:10] not in out and payload[:10] not in out, out
        assert "[REDACTED:" in out
    assert redact_text(f"jwt {token} then more") == "jwt [REDACTED:json_web_token] then more"
