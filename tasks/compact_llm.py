"""Optional LLM compaction: a session's rule-based summary and conversation -> a short prose summary (CLI command, Ollama or OpenAI-compatible)."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

from ctxlake.errors import ConfigError
from ctxlake.schemas.config import MemorySettings

# What the model reads: enough of the conversation to see where it stopped, bounded for cost.
PROMPT_CHARS = 12_000
INSTRUCTIONS = (
    "Summarize this coding-agent session for another agent that will continue the work. "
    "In at most 8 short lines: the goal, what was done, decisions taken, what failed, and what is left to do. "
    "Plain text, no preamble.\n\n"
)


def build_prompt(rule_summary: str, talk: Sequence[dict[str, Any]]) -> str:
    lines = [f"{r['role']}: {r['text'].strip()}" for r in talk]
    body = "\n".join(lines)
    if len(body) > PROMPT_CHARS:
        # Keep the start (the goal) and, mostly, the end (where it stopped).
        head = PROMPT_CHARS // 4
        body = body[:head] + "\n…\n" + body[-(PROMPT_CHARS - head):]
    return f"{INSTRUCTIONS}Facts:\n{rule_summary}\n\nConversation (redacted):\n{body}\n"


def summarize(memory: MemorySettings, rule_summary: str, talk: Sequence[dict[str, Any]]) -> str:
    """The configured backend's summary; raises on failure (the caller keeps the rule-based one)."""
    prompt = build_prompt(rule_summary, talk)
    if memory.llm == "command":
        return _command(memory, prompt)
    if memory.llm == "ollama":
        return _ollama(memory, prompt)
    if memory.llm == "openai":
        return _openai(memory, prompt)
    raise ConfigError(f"unknown memory.llm {memory.llm!r}", hint="off, command, ollama or openai")


def _command(memory: MemorySettings, prompt: str) -> str:
    if not memory.llm_command.strip():
        raise ConfigError("memory.llm = command needs memory.llm_command, e.g. \"claude -p\"")
    proc = subprocess.run(shlex.split(memory.llm_command), input=prompt, capture_output=True, text=True,
                          timeout=memory.llm_timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`{memory.llm_command}` exited {proc.returncode}: {proc.stderr.strip()[:200]}")
    return _clean(proc.stdout)


def _post(memory: MemorySettings, url: str, payload: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    import httpx

    if not memory.llm_url:
        raise ConfigError(f"memory.llm = {memory.llm} needs memory.llm_url")
    response = httpx.post(url, json=payload, headers=headers or {}, timeout=memory.llm_timeout_s)
    if response.status_code >= 400:
        raise RuntimeError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
    return response.json()


def _ollama(memory: MemorySettings, prompt: str) -> str:
    data = _post(memory, memory.llm_url.rstrip("/") + "/api/generate",
                 {"model": memory.llm_model or "llama3.2", "prompt": prompt, "stream": False})
    if not isinstance(data, dict) or not isinstance(data.get("response"), str):
        raise RuntimeError("the Ollama answer has no `response` text")
    return _clean(data["response"])


def _openai(memory: MemorySettings, prompt: str) -> str:
    # Local OpenAI-compatible servers need no key; the header is only sent when one is set.
    key = memory.llm_api_key.get_secret_value() if memory.llm_api_key else ""
    data = _post(memory, memory.llm_url.rstrip("/") + "/chat/completions",
                 {"model": memory.llm_model or "gpt-4o-mini", "messages": [{"role": "user", "content": prompt}]},
                 {"Authorization": f"Bearer {key}"} if key else None)
    try:
        return _clean(data["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError) as exc:
        raise RuntimeError("the answer has no choices[0].message.content") from exc


def _clean(text: str) -> str:
    from ctxlake.tasks.redact import redact_text

    text = text.strip()
    if not text:
        raise RuntimeError("the model returned an empty summary")
    # The model only saw redacted text, but what it writes is stored too: scan it like the rest.
    return redact_text(text[:4000])
