"""Token estimates for the budgets of answers, hand-off briefs and agent prompts (no tables)."""

from __future__ import annotations

# A cheap, dependency-free estimate: about four characters of English or code per token
# (the cl100k/o200k average). Close enough for a budget; no tokenizer is loaded for it.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Tokens of text, rounded up: `CHARS_PER_TOKEN` characters a token."""
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
