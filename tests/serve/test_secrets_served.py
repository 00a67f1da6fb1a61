"""Secrets through the whole pipeline with real lakes: planted in a project and in agent logs, then
indexed and ingested; no planted value is in any Lance table, the embedding cache, state files,
`ctx search --json` or the MCP tools' answers, while the names around them stay searchable."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_helpers import call_ok
from memlogs import CANARY, claude, tool_result, tool_use, write_jsonl

from ctxlake.schemas.config import load_settings
from ctxlake.serve.mcp.server import build_server

pytestmark = pytest.mark.usefixtures("prefect_server", "fake_embedder")

# Fake values built from parts at run time: the repository holds nothing a secret scanner flags.
DB_PW = "Pg-" + "h7Kd92LmQx"
DJANGO_KEY = "django-insecure-" + "4kq$9x!m2zv7@w1p"
GITHUB = "ghp_" + "Zq8Xw7Vc6Bn5Mm4Ll3Kk2Jj1Hh0Gg9Ff8Dd"
STRIPE = "sk_" + "live_" + "51HqLyjWDarjtT1zdp7dc9Xa"
ENV_ONLY = "env-" + "only-Q7m3Zt9Kp2"
PEM_BODY = "MIIEpAIBAAKCAQEAx4" + "ZqW9sd0PmQvXn2Lk7R1tY3uB5wE8rT6yU0iO2pA4sD6fG8hJ0kL"
PEM = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{PEM_BODY}\n-----END OPENSSH PRIVATE KEY-----\n"
CHAT_PW = "chat-" + "Pw0rd-9vX2mQ"
TOOL_TOKEN = "xoxb-" + "2048-1024-AbCdEfGhIjKlMn"
SECRETS = [DB_PW, DJANGO_KEY, GITHUB, STRIPE, ENV_ONLY, PEM_BODY[:24], PEM_BODY[-24:], CHAT_PW, TOOL_TOKEN]

PROJECT = {
    ".env": f"DATABASE_PASSWORD={DB_PW}\nENV_ONLY_TOKEN={ENV_ONLY}\nDEBUG=true\n",
    "deploy/id_ed25519": PEM,
    "mysite/settings.py": f"DEBUG = False\nSECRET_KEY = '{DJANGO_KEY}'\nDATABASES = {{'default': {{'PASSWORD': '{DB_PW}'}}}}\n",
    "web/client.js": f"// {CANARY}\nexport const octokit = new Octokit({{ auth: '{GITHUB}' }});\n",
    "billing/charge.py": f"import stripe\n\nstripe.api_key = \"{STRIPE}\"\n\n\ndef charge(amount):\n    return stripe.Charge.create(amount=amount)\n",
    "docs/debugging.md": f"# Debugging\n\nWhere is the password set?\n\n```\n$ grep -rn PASSWORD config/\nconfig/.env:1:DATABASE_PASSWORD={DB_PW}\n```\n",
    "docker-compose.yml": f"services:\n  db:\n    environment:\n      - POSTGRES_PASSWORD={DB_PW}\n",
}

# Hidden files the scan indexes (not secrets by name): `ctx show` serves them like any indexed file.
HIDDEN_CONFIG = {
    ".readthedocs.yaml": "version: 2\nbuild:\n  os: ubuntu-22.04\n",
    "tests/.flaskenv": f"FLASK_APP=app\nSECRET_KEY={DJANGO_KEY}\n",
}


def claude_logs(root: Path, project: Path) -> Path:
    cwd = str(project)
    write_jsonl(root / "projects" / "-srv-app" / "sess-s.jsonl", [
        claude("user", "s1", 0, f"The staging login fails. Note: password={CHAT_PW}", cwd=cwd),
        claude("assistant", "s2", 1, [tool_use("Bash", command=f"curl -H 'Authorization: Bearer {TOOL_TOKEN}' https://api")], cwd=cwd),
        claude("user", "s3", 2, tool_result(f"config/.env:1:DATABASE_PASSWORD={DB_PW}"), cwd=cwd),
        claude("assistant", "s4", 3, [{"type": "text", "text": f"The key {GITHUB} in client.js is live; rotate it. {CANARY}"}], cwd=cwd),
    ])
    return root / "projects"


def opt_in(config: str) -> str:
    """The generated config with its [index] section line in force and secret_files = "mask"."""
    return re.sub(r"(?m)^#?\s*\[index\]\s*$", '[index]\nsecret_files = "mask"', config, count=1)


def every_file(*places: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for place in places if place.exists() for p in place.rglob("*") if p.is_file()}


def leaks_in(blobs: dict[Path, bytes]) -> list[str]:
    return [f"{secret[:8]}… in {p}" for p, b in blobs.items() for secret in SECRETS if secret.encode() in b]


def test_planted_secrets_are_masked_everywhere_and_names_stay_searchable(
        cli: Callable[..., Any], make_repo: Callable[..., Path], tmp_path: Path, ctx_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    repo = make_repo(PROJECT, name="app")
    logs = claude_logs(tmp_path / "claude", repo)

    index = cli("run", "index", "--json", cwd=repo)
    assert index.exit_code == 0, index.stderr
    report = json.loads(index.stdout)
    assert report["skipped"].get("secret") == 2  # .env and the key file, by name, never read
    assert report["secrets_masked"] >= 6
    ingest = cli("run", "ingest", f"--from=claude={logs}", "--json", cwd=repo)
    assert ingest.exit_code == 0, ingest.stderr
    assert json.loads(ingest.stdout)["redacted"] >= 4

    status = json.loads(cli("status", "--json", cwd=repo).stdout)
    assert status["secret_files_skipped"] == 2 and status["masked_chunks"] >= 4

    # The lake (project and user-wide memory), the embedding cache, the state and report files.
    blobs = every_file(repo / ".ctx", ctx_home)
    assert any(CANARY.encode() in b for p, b in blobs.items() if p.suffix == ".lance"), "the byte scan sees text"
    assert leaks_in(blobs) == []

    out = cli("search", "SECRET_KEY DATABASE_PASSWORD api_key octokit auth", "--json", cwd=repo)
    assert out.exit_code == 0, out.stderr
    hits = json.loads(out.stdout)["hits"]
    paths = {h["path"] for h in hits}
    assert {"mysite/settings.py", "billing/charge.py", "docs/debugging.md"} <= paths
    assert ".env" not in paths and "deploy/id_ed25519" not in paths
    assert "[REDACTED:" in out.stdout and [s for s in SECRETS if s in out.stdout] == []
    memory = cli("context", "search", "staging login password", "--json", cwd=repo)
    assert memory.exit_code == 0 and "[REDACTED:" in memory.stdout
    assert [s for s in SECRETS if s in memory.stdout] == []

    settings = load_settings(repo, {"mcp": {"stale_check_s": 0}}, env=dict(os.environ))
    answers: list[str] = []

    async def body(client: Client) -> None:
        for query in ("SECRET_KEY settings", "stripe api_key", "DATABASE_PASSWORD grep", "octokit auth"):
            answers.append(json.dumps(await call_ok(client, "search_code", {"query": query})))
        for path in ("mysite/settings.py", "web/client.js", "billing/charge.py", "docker-compose.yml"):
            context = await call_ok(client, "get_file_context", {"filepath": path})
            # Read from disk and masked there: the lines are the file's lines.
            assert context["total_lines"] == PROJECT[path].count("\n")
            answers.append(json.dumps(context))
        doc = await call_ok(client, "docs_content", {"path": "docs/debugging.md"})
        assert "DATABASE_PASSWORD=[REDACTED:" in doc["content"]
        answers.append(json.dumps(doc))
        answers.append(json.dumps(await call_ok(client, "search_context", {"query": "staging login password"})))
        sessions = await client.call_tool("recent_sessions", {})
        assert not sessions.is_error and sessions.content
        answers.append(sessions.content[0].text + json.dumps(sessions.structured_content))

    async def main() -> None:
        async with Client(build_server(settings)) as client:
            await body(client)

    anyio.run(main)
    everything = "\n".join(answers)
    assert "SECRET_KEY = '[REDACTED:" in everything and "auth: '[REDACTED:github_token]'" in everything
    assert [s for s in SECRETS if s in everything] == []


def test_opting_in_indexes_secret_files_with_their_values_masked(
        cli: Callable[..., Any], make_repo: Callable[..., Path], ctx_home: Path) -> None:
    repo = make_repo({**PROJECT, **HIDDEN_CONFIG}, name="app")
    assert cli("run", "index", cwd=repo).exit_code == 0
    # What the scan indexed can be shown, hidden or not, masked as indexed; what it skipped cannot.
    assert "version: 2" in cli("show", ".readthedocs.yaml", cwd=repo).stdout
    flaskenv = cli("show", "tests/.flaskenv", cwd=repo)
    assert flaskenv.exit_code == 0 and "FLASK_APP=app" in flaskenv.stdout, flaskenv.stderr
    assert not leaks_in({Path("show"): flaskenv.stdout.encode()}) and "SECRET_KEY=[REDACTED:" in flaskenv.stdout
    skipped = cli("show", ".env", cwd=repo)
    assert skipped.exit_code == 2 and ENV_ONLY not in skipped.stdout
    config = repo / ".ctx" / "config.toml"  # written by the first run, every line commented out
    config.write_text(opt_in(config.read_text(encoding="utf-8")), encoding="utf-8")
    again = cli("run", "index", "--json", cwd=repo)
    assert again.exit_code == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["added"] == 2 and "secret" not in report["skipped"]

    found = cli("search", "ENV_ONLY_TOKEN DATABASE_PASSWORD", "--json", cwd=repo)
    hits = json.loads(found.stdout)["hits"]
    assert ".env" in {h["path"] for h in hits}
    assert "ENV_ONLY_TOKEN=[REDACTED:" in found.stdout and "DEBUG=true" in found.stdout
    assert leaks_in(every_file(repo / ".ctx", ctx_home)) == []
    shown = cli("show", ".env", cwd=repo)
    assert shown.exit_code == 0 and "ENV_ONLY_TOKEN=[REDACTED:" in shown.stdout and not leaks_in({Path("show"): shown.stdout.encode()})

    # Back to the default: the secret files' chunks leave the index.
    config.write_text(config.read_text(encoding="utf-8").replace('secret_files = "mask"', ""), encoding="utf-8")
    back = json.loads(cli("run", "index", "--json", cwd=repo).stdout)
    assert back["removed"] == 2 and back["skipped"]["secret"] == 2
    after = cli("search", "ENV_ONLY_TOKEN DATABASE_PASSWORD", "--json", cwd=repo)
    assert ".env" not in {h["path"] for h in json.loads(after.stdout)["hits"]}


def test_a_utf16_file_is_masked_when_read_from_disk_as_in_the_index(
        cli: Callable[..., Any], make_repo: Callable[..., Path]) -> None:
    """Windows tools write UTF-16 with a BOM. The index decodes it and masks its values, and the
    readers that serve the file from disk (`ctx show`, MCP get_file_context, hit texts) read it as
    UTF-8, where no secret rule matched: they served the password as it is."""
    repo = make_repo({"app/settings.py": "DEBUG = False\n"})
    (repo / "app" / "App.config").write_bytes(f'db_password = "{DB_PW}"\nretries = 3\n'.encode("utf-16"))
    assert cli("run", "index", cwd=repo).exit_code == 0
    assert DB_PW not in cli("sql", "SELECT text FROM chunks WHERE path = 'app/App.config'", cwd=repo).stdout
    shown = cli("show", "app/App.config", cwd=repo)
    assert shown.exit_code == 0, shown.stderr
    assert "db_password = \"[REDACTED:" in shown.stdout and "retries = 3" in shown.stdout and DB_PW not in shown.stdout
    settings = load_settings(repo, {"mcp": {"stale_check_s": 0}}, env=dict(os.environ))

    async def main() -> dict[str, Any]:
        async with Client(build_server(settings)) as client:
            return await call_ok(client, "get_file_context", {"filepath": "app/App.config"})

    context = anyio.run(main)
    assert context["total_lines"] == 2 and "[REDACTED:" in context["content"] and DB_PW not in json.dumps(context)
