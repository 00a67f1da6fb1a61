#!/usr/bin/env python3
"""Benchmark the secrets stage: planted secrets in code files and in all seven agent log formats,
indexed and ingested into a temp lake; detector recall per form, and every verbatim occurrence left in
the lake, the embedding cache, CLI output and MCP output (target 0). Optionally, the stage's cost on a
big tree.

    python3 dev.py bench secrets [--seed 7] [--keep DIR] [--tree DIR_OR_BARE_GIT_DIR] [--index-tree]

Every value is generated at run time from a seeded RNG, in the shape of its issuer's format, with
prefixes assembled from pieces: this file holds nothing a secret scanner would flag. Each planting
sits next to a unique marker word, so "stored" (the marker is in the lake) and "masked" (the value
is not) are told apart: a form whose text never reached the lake counts as a miss of the pipeline,
not as a success of the detector. Files that are secrets by name are first skipped (default), then
indexed with `[index] secret_files = "mask"` and scored again.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class Fake:
    """Deterministic fake secrets in the shapes of real ones."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chars(self, alphabet: str, n: int) -> str:
        return "".join(self.rng.choice(alphabet) for _ in range(n))

    def alnum(self, n: int) -> str:
        # At least one digit, upper and lower letter: a value that reads as random.
        core = self.chars(string.ascii_letters + string.digits, n - 3)
        return core + self.rng.choice(string.digits) + self.rng.choice(string.ascii_uppercase) + self.rng.choice(string.ascii_lowercase)

    def make(self, kind: str) -> str:
        a, d, up = string.ascii_letters + string.digits, string.digits, string.ascii_uppercase + string.digits
        b64 = a + "+/"
        url = a + "-_"
        return {
            "password": lambda: self.chars(string.ascii_lowercase, 5) + "-" + self.alnum(9) + "!",
            "random": lambda: self.alnum(28),
            "hex": lambda: self.chars("0123456789abcdef", 64),
            "github": lambda: "gh" + "p_" + self.alnum(36),
            "aws_id": lambda: "AK" + "IA" + self.chars(up, 16),
            "aws_secret": lambda: self.chars(b64, 37) + "K7q",
            "stripe": lambda: "sk" + "_live_" + self.alnum(24),
            "slack": lambda: "xo" + "xb-" + self.chars(d, 12) + "-" + self.chars(d, 13) + "-" + self.alnum(24),
            "openai": lambda: "sk" + "-proj-" + self.alnum(48),
            "anthropic": lambda: "sk" + "-ant-api03-" + self.chars(url, 80) + "Q2x",
            "google": lambda: "AI" + "za" + self.chars(url, 35),
            "npm": lambda: "np" + "m_" + self.alnum(36),
            "sendgrid": lambda: "S" + "G." + self.chars(url, 22) + "." + self.chars(url, 43),
            "hf": lambda: "h" + "f_" + self.alnum(34),
            "jwt": lambda: "ey" + "J" + self.chars(url, 30) + ".ey" + "J" + self.chars(url, 40) + "." + self.chars(url, 43),
            "pem": lambda: "\n".join(self.chars(b64, 64) for _ in range(8)),
            "b64": lambda: self.chars(a, 30) + "==",
        }[kind]()


@dataclass
class Form:
    """One way a secret is written: a file (path, text) or a conversation message (text)."""

    name: str
    kind: str  # Fake kind of the planted value
    template: str  # {s}: the secret, {m}: the marker word
    path: str = ""  # code forms: where it is written; log forms: ""
    secret_file: bool = False  # skipped by name unless [index] secret_files = "mask"


BEGIN, END = "-----BEGIN ", "-----END "
CODE_FORMS = [
    Form("py settings SECRET_KEY", "password", "# {m}\nDEBUG = False\nSECRET_KEY = 'django-insecure-{s}'\n", "mysite/settings.py"),
    Form("py settings DATABASES PASSWORD", "password", "# {m}\nDATABASES = {{\n    'default': {{'ENGINE': 'x', 'USER': 'app', 'PASSWORD': '{s}'}},\n}}\n", "shop/settings/prod.py"),
    Form("py connect(password=...)", "password", "# {m}\nconn = psycopg2.connect(host='db', user='app', password=\"{s}\")\n", "app/db.py"),
    Form("py stripe.api_key", "stripe", "# {m}\nimport stripe\nstripe.api_key = \"{s}\"\n", "billing/charge.py"),
    Form("py boto3 secret key", "aws_secret", "# {m}\ns3 = boto3.client('s3', aws_secret_access_key='{s}')\n", "storage/s3.py"),
    Form("py boto3 key id", "aws_id", "# {m}\ns3 = boto3.client('s3', aws_access_key_id='{s}')\n", "storage/s3_id.py"),
    Form("py OpenAI(api_key=)", "openai", "# {m}\nclient = OpenAI(api_key=\"{s}\")\n", "ai/client.py"),
    Form("py getenv default", "anthropic", "# {m}\nKEY = os.environ.get('ANTHROPIC_API_KEY', '{s}')\n", "ai/claude.py"),
    Form("py GITHUB_TOKEN const", "github", "# {m}\nGITHUB_TOKEN = \"{s}\"\n", "ci/github.py"),
    Form("py headers Bearer", "random", "# {m}\nheaders = {{'Authorization': 'Bearer {s}'}}\n", "api/session.py"),
    Form("py auth tuple", "password", "# {m}\nrequests.get(url, auth=('admin', '{s}'))\n", "api/basic.py"),
    Form("py signing key (entropy)", "random", "# {m}\nsigning_key = '{s}'\n", "crypto/sign.py"),
    Form("py SendGrid client", "sendgrid", "# {m}\nsg = SendGridAPIClient('{s}')\n", "mail/send.py"),
    Form("py test fixture JWT", "jwt", "# {m}\nTOKEN_FIXTURE = \"{s}\"\n", "tests/fixtures.py"),
    Form("js config object", "password", "// {m}\nmodule.exports = {{ db: {{ user: 'app', password: '{s}' }} }};\n", "config/db.js"),
    Form("js fetch X-Api-Key", "random", "// {m}\nfetch(url, {{ headers: {{ 'X-Api-Key': '{s}' }} }});\n", "web/api.js"),
    Form("ts const SLACK_TOKEN", "slack", "// {m}\nexport const SLACK_TOKEN = \"{s}\";\n", "web/slack.ts"),
    Form("js Octokit auth", "github", "// {m}\nconst octokit = new Octokit({{ auth: '{s}' }});\n", "web/gh.js"),
    Form("go const apiKey", "random", "// {m}\npackage main\n\nconst apiKey = \"{s}\"\n", "cmd/main.go"),
    Form("java static final", "password", "// {m}\nclass Config {{ private static final String DB_PASSWORD = \"{s}\"; }}\n", "src/Config.java"),
    Form("ruby secret_key_base", "hex", "# {m}\nconfig.secret_key_base = \"{s}\"\n", "config/initializers/secret.rb"),
    Form("php array password", "password", "<?php // {m}\nreturn ['password' => '{s}'];\n", "config/database.php"),
    Form("yaml password", "password", "# {m}\ndatabase:\n  host: db\n  password: {s}\n", "config/app.yaml"),
    Form("yaml client_secret quoted", "random", "# {m}\noauth:\n  client_secret: \"{s}\"\n", "config/oauth.yml"),
    Form("k8s Secret data (base64)", "b64", "# {m}\nkind: Secret\ndata:\n  password: {s}\n", "deploy/k8s/db-secret.yaml"),
    Form("actions Slack webhook", "random", "# {m}\nenv:\n  SLACK_WEBHOOK: https://hooks.slack.com/services/T0123ABCD/B0123ABCD/{s}\n", ".github/workflows/notify.yml"),
    Form("compose env list", "password", "# {m}\nservices:\n  db:\n    environment:\n      - POSTGRES_PASSWORD={s}\n", "docker-compose.yml"),
    Form("compose env map", "password", "# {m}\nservices:\n  mysql:\n    environment:\n      MYSQL_ROOT_PASSWORD: {s}\n", "deploy/compose.yaml"),
    Form("Dockerfile ENV", "random", "# {m}\nFROM python:3.12\nENV API_TOKEN={s}\n", "Dockerfile"),
    Form("Dockerfile ARG npm", "npm", "# {m}\nFROM node:22\nARG NPM_TOKEN={s}\n", "web/Dockerfile"),
    Form("json apiKey", "random", "{{\"note\": \"{m}\", \"api\": {{\"url\": \"https://x\", \"apiKey\": \"{s}\"}}}}\n", "config/services.json"),
    Form("json escaped private_key", "pem", "{{\"note\": \"{m}\", \"private_key\": \"" + BEGIN + "PRIVATE KEY-----\\n{s}\\n" + END + "PRIVATE KEY-----\\n\"}}\n", "deploy/sa.json"),
    Form("json connection string", "password", "{{\"note\": \"{m}\", \"ConnectionStrings\": {{\"Default\": \"Server=db;User Id=sa;Password={s};\"}}}}\n", "appsettings.json"),
    Form("ipynb hf login", "hf", "{{\"cells\": [{{\"source\": [\"# {m}\\n\", \"login(token=\\\"{s}\\\")\"]}}]}}\n", "notebooks/train.ipynb"),
    Form("toml password", "password", "# {m}\n[database]\nuser = \"app\"\npassword = \"{s}\"\n", "settings.toml"),
    Form("ini plain password", "password", "; {m}\n[smtp]\nhost = mail\npassword = {s}\n", "config/mail.ini"),
    Form("ini URL with password", "password", "; {m}\n[alembic]\nsqlalchemy.url = postgresql://app:{s}@db/app\n", "alembic.ini"),
    Form("properties dotted", "password", "# {m}\nspring.datasource.password={s}\n", "src/main/resources/application.properties"),
    Form("maven settings.xml", "password", "<!-- {m} -->\n<server><id>repo</id><password>{s}</password></server>\n", "settings.xml"),
    Form("terraform password", "password", "# {m}\nresource \"db\" \"x\" {{\n  password = \"{s}\"\n}}\n", "infra/main.tf"),
    Form("shell export", "aws_secret", "# {m}\nexport AWS_SECRET_ACCESS_KEY=\"{s}\"\n", "scripts/deploy.sh"),
    Form("shell curl Bearer", "random", "# {m}\ncurl -H \"Authorization: Bearer {s}\" https://api.example.com\n", "scripts/call.sh"),
    Form("shell curl -u", "password", "# {m}\ncurl -u admin:{s} https://ci.example.com/job\n", "scripts/backup.sh"),
    Form("shell --password=", "password", "# {m}\nmysqldump -u root --password={s} shop > dump.sql\n", "scripts/dump.sh"),
    Form("Makefile inline TOKEN", "random", "# {m}\ndeploy:\n\tTOKEN={s} ./deploy.sh\n", "Makefile"),
    Form("markdown grep output", "password", "{m}\n\n```\n$ grep -rn PASSWORD config/\nconfig/.env:3:DATABASE_PASSWORD={s}\n```\n", "docs/debugging.md"),
    Form("markdown Note: password=", "password", "# Notes {m}\n\nNote: password={s} for the staging box.\n", "NOTES.md"),
    Form("markdown label api_key:", "random", "# Setup {m}\n\nStaging\napi_key: {s}\n", "docs/setup.md"),
    Form("markdown URL credentials", "password", "# Db {m}\n\nConnect with `postgres://app:{s}@db.internal:5432/app`.\n", "docs/db.md"),
    Form("markdown PEM block", "pem", "# Keys {m}\n\n```\n" + BEGIN + "RSA PRIVATE KEY-----\n{s}\n" + END + "RSA PRIVATE KEY-----\n```\n", "docs/keys.md"),
    Form(".env.example with a real value", "random", "# {m}\nAPI_KEY={s}\n", ".env.example"),
    # Secret by name: skipped by default, then indexed masked.
    Form(".env", "password", "# {m}\nDEBUG=true\nDATABASE_PASSWORD={s}\n", ".env", True),
    Form(".env.production vendor key", "stripe", "# {m}\nSTRIPE={s}\n", "config/.env.production", True),
    Form("id_rsa", "pem", BEGIN + "OPENSSH PRIVATE KEY-----\n{s}\n" + END + "OPENSSH PRIVATE KEY-----\n# {m}\n", "deploy/id_rsa", True),
    Form("server.key", "pem", BEGIN + "PRIVATE KEY-----\n{s}\n" + END + "PRIVATE KEY-----\n# {m}\n", "certs/server.key", True),
    Form(".npmrc authToken", "npm", "# {m}\n//registry.npmjs.org/:_authToken={s}\n", ".npmrc", True),
    Form(".pypirc password", "random", "# {m}\n[pypi]\nusername = __token__\npassword = {s}\n", ".pypirc", True),
    Form(".netrc", "password", "# {m}\nmachine api.example.com login bot password {s}\n", ".netrc", True),
    Form("credentials.json", "random", "{{\"note\": \"{m}\", \"installed\": {{\"client_secret\": \"{s}\"}}}}\n", "credentials.json", True),
    Form("secrets.yaml", "random", "# {m}\napi_token: {s}\n", "deploy/secrets.yaml", True),
    Form("terraform.tfvars", "password", "# {m}\ndb_password = \"{s}\"\n", "infra/prod.tfvars", True),
]

LOG_FORMS = [
    Form("grep output line", "password", "{m} found it:\nconfig/.env:3:DATABASE_PASSWORD={s}"),
    Form("Note: password=", "password", "{m} Note: password={s}"),
    Form("settings quote in a snippet", "password", "{m} in settings.py:\nSECRET_KEY = '{s}'"),
    Form("api_key: after a label", "random", "{m} here are the staging creds\napi_key: {s}"),
    Form("export GITHUB_TOKEN", "github", "{m} export GITHUB_TOKEN={s} did not help"),
    Form("aws_secret_access_key =", "aws_secret", "{m} aws_secret_access_key = {s}"),
    Form("curl Bearer header", "random", "{m} curl -H 'Authorization: Bearer {s}' https://api.example.com/v1"),
    Form("URL with password", "password", "{m} DATABASE_URL=postgres://app:{s}@db:5432/app"),
    Form("pasted private key", "pem", "{m} the deploy key:\n" + BEGIN + "OPENSSH PRIVATE KEY-----\n{s}\n" + END + "OPENSSH PRIVATE KEY-----"),
    Form("JSON client_secret", "random", "{m} {{\"client_id\": \"abc\", \"client_secret\": \"{s}\"}}"),
    Form("bare OpenAI key", "openai", "{m} use this key {s} for the eval"),
    Form("bare Slack token", "slack", "{m} the bot token is {s}"),
    Form("STRIPE_KEY:", "stripe", "{m} STRIPE_KEY: {s}"),
    Form("yaml password snippet", "password", "{m}\ndb:\n  password: {s}"),
    Form("cookie JWT", "jwt", "{m} Cookie: session={s}"),
    Form("prose 'my password is'", "password", "{m} my password is {s} on staging"),
    Form("docker login -p", "password", "{m} docker login -u bot -p {s} registry.example.com"),
]
# Written after the rules were tuned on the forms above and scored once, with no tuning since:
# an estimate of recall on forms the rules were not shaped by (they are reported apart).
UNSEEN_CODE_FORMS = [
    Form("unseen: mongodb+srv URL", "password", "# {m}\nMONGO = f\"mongodb+srv://admin:{s}@cluster0.example.net/db\"\n", "unseen/mongo.py"),
    Form("unseen: redis kwarg", "password", "# {m}\nr = redis.Redis(host='cache', password='{s}')\n", "unseen/cache.py"),
    Form("unseen: yaml smtp_pass", "password", "# {m}\nmail:\n  smtp_pass: {s}\n", "unseen/mail.yml"),
    Form("unseen: Go struct field", "password", "// {m}\nvar cfg = Config{{User: \"app\", Password: \"{s}\"}}\n", "unseen/cfg.go"),
    Form("unseen: Rust let api_token", "random", "// {m}\nlet api_token = \"{s}\";\n", "unseen/main.rs"),
    Form("unseen: C# var key", "random", "// {m}\nvar key = \"{s}\";\n", "unseen/Program.cs"),
    Form("unseen: sshpass -p", "password", "# {m}\nsshpass -p '{s}' ssh deploy@host\n", "unseen/ssh.sh"),
    Form("unseen: PowerShell $env:", "random", "# {m}\n$env:API_KEY = \"{s}\"\n", "unseen/setup.ps1"),
    Form("unseen: JSON token header", "random", "{{\"note\": \"{m}\", \"headers\": {{\"Authorization\": \"token {s}\"}}}}\n", "unseen/gh.json"),
    Form("unseen: HCL provider token", "random", "# {m}\nprovider \"x\" {{\n  token = \"{s}\"\n}}\n", "unseen/provider.tf"),
]
UNSEEN_LOG_FORMS = [
    Form("unseen: key after colon", "random", "{m} here's my key: {s}"),
    Form("unseen: credentials admin / pw", "password", "{m} the credentials are admin / {s}"),
    Form("unseen: PGPASSWORD prefix", "password", "{m} PGPASSWORD={s} psql -h db -U app"),
    Form("unseen: git clone token URL", "github", "{m} git clone https://x-access-token:{s}@github.com/o/r.git"),
]
CODE_FORMS += UNSEEN_CODE_FORMS
LOG_FORMS += UNSEEN_LOG_FORMS
LOG_TOOLS = ["claude", "codex", "gemini", "cursor", "copilot", "opencode", "antigravity"]


@dataclass
class Planting:
    form: Form
    where: str  # a file path, or the log tool
    secret: str
    marker: str
    text: str = ""
    found: dict[str, int] = field(default_factory=dict)  # store -> verbatim occurrences

    @property
    def needles(self) -> list[str]:
        # The whole value and its distinctive middle: a half-masked value still counts as a leak.
        core = self.secret.replace("\n", "")[4:28] if self.form.kind == "pem" else self.secret[len(self.secret) // 4:][:16]
        return [self.secret, core] if self.form.kind != "pem" else [core, self.secret.splitlines()[-1]]


def plant(fake: Fake) -> tuple[list[Planting], list[Planting]]:
    files, logs = [], []
    n = 0
    for form in CODE_FORMS:
        n += 1
        secret, marker = fake.make(form.kind), f"plant{n:03d}mark"
        files.append(Planting(form, form.path, secret, marker, form.template.format(s=secret, m=marker)))
    for form in LOG_FORMS:
        for tool in LOG_TOOLS:
            n += 1
            secret, marker = fake.make(form.kind), f"plant{n:03d}mark"
            logs.append(Planting(form, tool, secret, marker, form.template.format(s=secret, m=marker)))
    return files, logs


# --- the seven log formats ------------------------------------------------------------------------


def at(minute: float) -> datetime:
    return T0 + timedelta(minutes=minute)


def iso(minute: float) -> str:
    return at(minute).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ms(minute: float) -> int:
    return int(at(minute).timestamp() * 1000)


def jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def write_logs(base: Path, project: Path, logs: list[Planting]) -> dict[str, Path]:
    """One session per tool holding that tool's plantings as user messages; returns --from roots."""
    cwd = str(project)
    by_tool: dict[str, list[str]] = {t: [p.text for p in logs if p.where == t] for t in LOG_TOOLS}
    slug = re.sub(r"[^A-Za-z0-9]", "-", cwd)
    from memlogs import claude, codex_meta, codex_msg

    jsonl(base / "claude/projects" / slug / "bench-claude.jsonl",
          [claude("user", f"u{i}", i, t, session="bench-claude", cwd=cwd) for i, t in enumerate(by_tool["claude"])])
    jsonl(base / "codex/sessions/2026/03/02/rollout-2026-03-02T09-00-00-bench.jsonl",
          [codex_meta("bench-codex", 0, cwd=cwd), *(codex_msg("user", i + 1, t, f"m{i}") for i, t in enumerate(by_tool["codex"]))])
    digest = hashlib.sha256(cwd.encode()).hexdigest()
    chat = base / "gemini/tmp" / digest / "chats" / "session-bench.json"
    chat.parent.mkdir(parents=True)
    chat.write_text(json.dumps({"sessionId": "bench-gemini", "projectHash": digest, "startTime": iso(0), "messages": [
        {"id": f"g{i}", "timestamp": iso(i), "type": "user", "content": t} for i, t in enumerate(by_tool["gemini"])]}))
    jsonl(base / "cursor/projects" / slug.strip("-") / "agent-transcripts" / "bench-cursor.jsonl",
          [{"role": "user", "message": {"content": [{"type": "text", "text": t}]}} for t in by_tool["cursor"]])
    jsonl(base / "copilot/session-state/bench-copilot/events.jsonl", [
        {"type": "session.start", "data": {"sessionId": "bench-copilot", "context": {"cwd": cwd}}, "id": "e0", "timestamp": iso(0)},
        *({"type": "user.message", "data": {"content": t, "attachments": []}, "id": f"e{i + 1}", "timestamp": iso(i + 1)}
          for i, t in enumerate(by_tool["copilot"]))])
    store = base / "opencode/storage"
    (store / "session/proj").mkdir(parents=True)
    (store / "session/proj/ses_bench.json").write_text(json.dumps(
        {"id": "ses_bench", "directory": cwd, "title": "bench", "time": {"created": ms(0), "updated": ms(30)}}))
    for i, t in enumerate(by_tool["opencode"]):
        (store / "message/ses_bench").mkdir(parents=True, exist_ok=True)
        (store / f"message/ses_bench/msg_{i:03d}.json").write_text(json.dumps(
            {"id": f"msg_{i:03d}", "sessionID": "ses_bench", "role": "user", "time": {"created": ms(i)}}))
        (store / f"part/msg_{i:03d}").mkdir(parents=True)
        (store / f"part/msg_{i:03d}/prt_001.json").write_text(json.dumps(
            {"id": f"prt_{i:03d}", "type": "text", "text": t, "time": {"start": ms(i)}}))
    jsonl(base / "antigravity/bench-antigravity.jsonl", [
        {"step_index": i, "source": "USER_EXPLICIT", "type": "USER_INPUT", "status": "DONE", "created_at": iso(i)[:-5] + "Z",
         "content": f"<USER_REQUEST>\n{t}\n</USER_REQUEST>"} for i, t in enumerate(by_tool["antigravity"])])
    return {"claude": base / "claude/projects", "codex": base / "codex/sessions", "gemini": base / "gemini/tmp",
            "cursor": base / "cursor/projects", "copilot": base / "copilot/session-state",
            "opencode": store, "antigravity": base / "antigravity"}


# --- running the product and collecting what it stores and says ----------------------------------


def ctx(*args: str, cwd: Path) -> str:
    """`ctx ARGS` in this process (one Prefect server for the whole run); its stdout."""
    from ctxlake.serve.cli.app import run

    old = Path.cwd()
    os.chdir(cwd)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = run(list(args))
    finally:
        os.chdir(old)
    if code != 0:
        raise SystemExit(f"ctx {' '.join(args)} failed ({code}): {err.getvalue()[-2000:]}")
    return out.getvalue()


def store_bytes(*places: Path) -> bytes:
    return b"\n".join(p.read_bytes() for place in places if place.exists() for p in sorted(place.rglob("*")) if p.is_file())


def mcp_outputs(project: Path, files: list[Planting], logs: list[Planting], sessions: list[str]) -> str:
    import anyio
    from mcp import Client

    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.mcp.server import build_server

    settings = load_settings(project, {"mcp": {"stale_check_s": 0}}, env=dict(os.environ))
    answers: list[str] = []

    async def call(client: Client, name: str, args: dict[str, Any]) -> None:
        result = await client.call_tool(name, args)
        answers.append("".join(getattr(c, "text", "") for c in result.content) + json.dumps(result.structured_content))

    async def main() -> None:
        async with Client(build_server(settings)) as client:
            for p in files:
                await call(client, "search_code", {"query": query_for(p)})
                await call(client, "get_file_context", {"filepath": p.where})
                if p.where.startswith("docs/"):
                    await call(client, "docs_content", {"path": p.where})
            for p in logs[:: len(LOG_TOOLS)]:
                await call(client, "search_context", {"query": query_for(p), "depth": "raw"})
            for ref in sessions:
                await call(client, "session_detail", {"session_ref": ref, "limit": 200})
            await call(client, "recent_sessions", {"limit": 20})

    anyio.run(main)
    return "\n".join(answers)


def query_for(p: Planting) -> str:
    """What a user would search to find this planting: its marker and the words around the secret."""
    words = re.findall(r"[A-Za-z_]{3,}", p.text.replace(p.secret, " "))
    return " ".join([p.marker, *words[:6]])


def count(p: Planting, store: str, data: str | bytes) -> None:
    needles = [n.encode() for n in p.needles] if isinstance(data, bytes) else p.needles
    p.found[store] = sum(data.count(n) for n in needles)  # type: ignore[arg-type]


def score(plantings: list[Planting], stores: dict[str, str | bytes], lake: bytes) -> None:
    for p in plantings:
        p.found = {}
        for name, data in stores.items():
            count(p, name, data)
        p.found["stored"] = int(p.marker.encode() in lake)


def run_bench(work: Path, seed: int) -> int:
    os.environ["CTX_HOME"] = str(work / "ctx-home")
    os.environ["HOME"] = str(work / "home")
    os.environ.setdefault("CTX_EMBED_PROVIDER", "fake")  # the store path without model cost
    os.environ.setdefault("CTX_EMBED_MODEL", "hash")
    fake = Fake(seed)
    files, logs = plant(fake)
    project = work / "project"
    for p in files:
        target = project / p.where
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(p.text, encoding="utf-8")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    roots = write_logs(work / "stores", project, logs)
    home = Path(os.environ["CTX_HOME"])

    started = time.perf_counter()
    index = json.loads(ctx("run", "index", "--json", cwd=project))
    index_s = time.perf_counter() - started
    started = time.perf_counter()
    ingest = json.loads(ctx("run", "ingest", "--json", *(f"--from={k}={v}" for k, v in roots.items()), cwd=project))
    ingest_s = time.perf_counter() - started
    stored_per_tool = {t: v.get("messages", 0) for t, v in ingest.get("tools", {}).items()}

    def collect(plantings_files: list[Planting]) -> tuple[dict[str, str | bytes], bytes]:
        lake = store_bytes(project / ".ctx", home / "memory")
        cache = store_bytes(home / "cache")
        cli_out = [ctx("search", query_for(p), "--json", cwd=project) for p in plantings_files]
        cli_out += [ctx("context", "search", query_for(p), "--all-projects", "--depth", "raw", "--json", cwd=project)
                    for p in logs[:: len(LOG_TOOLS)]]
        refs = [s["session_ref"] for s in json.loads(ctx("sessions", "--all-projects", "-n", "50", "--json", cwd=project))]
        cli_out += [ctx("session", "show", ref, "-n", "200", "--json", cwd=project) for ref in refs]
        cli_out.append(ctx("status", "--json", cwd=project))
        mcp = mcp_outputs(project, plantings_files, logs, refs)
        return {"lake": lake, "cache": cache, "cli": "\n".join(cli_out), "mcp": mcp}, lake

    ordinary = [p for p in files if not p.form.secret_file]
    stores, lake = collect(ordinary)
    score(files + logs, stores, lake)
    default_pass = {id(p): dict(p.found) for p in files}

    # Second pass: secret-named files opted in, indexed with every value masked.
    config = project / ".ctx" / "config.toml"
    text = config.read_text(encoding="utf-8")  # the generated one: every line commented out
    config.write_text(re.sub(r"(?m)^#?\s*\[index\]\s*$", '[index]\nsecret_files = "mask"', text, count=1),
                      encoding="utf-8")
    opt_in = json.loads(ctx("run", "index", "--json", cwd=project))
    stores_in, lake_in = collect(files)
    score(files, stores_in, lake_in)

    report(files, logs, default_pass, index, opt_in, stored_per_tool, index_s, ingest_s)
    leaks = sum(v for p in files + logs for k, v in p.found.items() if k != "stored")
    leaks += sum(v for found in default_pass.values() for k, v in found.items() if k != "stored")
    return 0 if leaks == 0 else 1


def report(files: list[Planting], logs: list[Planting], default_pass: dict[int, dict[str, int]],
           index: dict[str, Any], opt_in: dict[str, Any], per_tool: dict[str, int], index_s: float, ingest_s: float) -> None:
    stores = ["lake", "cache", "cli", "mcp"]
    forms = len(CODE_FORMS) + len(LOG_FORMS)
    kinds = {Path(p.where).suffix or Path(p.where).name for p in files}
    print(f"\nPlanted: {len(files)} code-file forms in {len(kinds)} kinds of file "
          f"({sum(p.form.secret_file for p in files)} secret by name) + "
          f"{len(LOG_FORMS)} message forms x {len(LOG_TOOLS)} log formats = {forms} forms, "
          f"{len(files) + len(logs)} plantings")
    print(f"index: {index_s:.1f} s, skipped {index['skipped']}, masked {index['secrets_masked']}; "
          f"opt-in re-index: +{opt_in['added']} files, masked {opt_in['secrets_masked']}; ingest: {ingest_s:.1f} s, "
          f"messages per tool {per_tool}")

    def verdict(p: Planting, found: dict[str, int]) -> str:
        if not found.get("stored"):
            return "not stored"
        return "masked" if not any(found.get(s) for s in stores) else "LEAKED " + ",".join(
            f"{s}:{found[s]}" for s in stores if found.get(s))

    print(f"\n{'code-file form':40} {'path':42} default      opt-in")
    hits = 0
    for p in files:
        first = default_pass[id(p)]
        d = ("skipped" if not first.get("stored") and not any(first.get(s) for s in stores) else verdict(p, first)) \
            if p.form.secret_file else verdict(p, first)
        o = verdict(p, p.found)
        hits += o == "masked"
        print(f"{p.form.name:40} {p.where:42} {d:12} {o}")
    unseen = [p for p in files if p.form in UNSEEN_CODE_FORMS]
    print(f"code-file recall (opt-in pass): {hits}/{len(files)}; of which forms written after tuning: "
          f"{sum(verdict(p, p.found) == 'masked' for p in unseen)}/{len(unseen)}")
    print(f"\n{'message form':32} " + " ".join(f"{t[:8]:>8}" for t in LOG_TOOLS) + "  recall")
    total = 0
    for form in LOG_FORMS:
        row = [p for p in logs if p.form is form]
        marks = [verdict(p, p.found) for p in row]
        ok = sum(m == "masked" for m in marks)
        total += ok
        cells = ["ok" if m == "masked" else ("-" if m == "not stored" else "LEAK") for m in marks]
        print(f"{form.name:32} " + " ".join(f"{c:>8}" for c in cells) + f"  {ok}/{len(row)}")
    unseen_logs = [p for p in logs if p.form in UNSEEN_LOG_FORMS]
    print(f"message recall: {total}/{len(logs)}; of which forms written after tuning: "
          f"{sum(verdict(p, p.found) == 'masked' for p in unseen_logs)}/{len(unseen_logs)}")
    everything = files + logs
    print("\nverbatim occurrences of planted values (whole value or its middle 16 characters):")
    for s in stores:
        n = sum(p.found.get(s, 0) for p in everything) + sum(f.get(s, 0) for f in default_pass.values())
        print(f"  {s:6} {n}")
    missing = [p for p in everything if not p.found.get("stored")]
    if missing:
        print(f"not stored at all (pipeline, not detector): {len(missing)}: "
              + ", ".join(sorted({f'{p.where}:{p.form.name}' for p in missing})[:10]))


# --- the stage's cost on a big tree --------------------------------------------------------------


def tree_cost(tree: Path, index_tree: bool) -> None:
    from ctxlake.schemas.config import IndexSettings
    from ctxlake.tasks.chunk_stage import decode_text
    from ctxlake.tasks.merkle import INDEXED
    from ctxlake.tasks.scan import hash_file
    from ctxlake.tasks.secrets import MaskReport, is_secret_file, mask_text
    from ctxlake.tasks.walk import ScanStats, walk_files

    with tempfile.TemporaryDirectory(prefix="ctx-bench-tree-") as tmp:
        if (tree / "HEAD").is_file() and (tree / "objects").is_dir():  # a bare git repository
            archive = subprocess.run(["git", "--git-dir", str(tree), "archive", "HEAD"], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            tree = Path(tmp)
        texts: list[tuple[str, str]] = []
        index = IndexSettings()
        secret_named = 0
        for rel, st in walk_files(tree, index, ScanStats()):
            if is_secret_file(rel):
                secret_named += 1
                continue
            _, status = hash_file(tree / rel, st.st_size, index.max_file_bytes)
            if status == INDEXED:
                text, _ = decode_text((tree / rel).read_bytes())
                if text is not None:
                    texts.append((rel, text))
        mask_text("warm up: password=abc12345", "a.py")  # the detectors' one-time import
        chars = sum(len(t) for _, t in texts)
        runs = []
        for _ in range(3):
            report = MaskReport()
            started = time.perf_counter()
            masked_files = sum(mask_text(text, rel, report) != text for rel, text in texts)
            runs.append(time.perf_counter() - started)
        best = min(runs)
        print(f"\nsecrets stage on {tree}: {len(texts):,} files, {chars / 1e6:.1f} M characters, "
              f"{secret_named} skipped by name; best of 3: {best:.2f} s ({chars / 1e6 / best:.0f} M chars/s); "
              f"{report.masked} values masked in {masked_files} files {report.by_kind}")
        if index_tree:
            work = Path(tmp) / "_index"
            shutil.copytree(tree, work, ignore=shutil.ignore_patterns(".git"))
            subprocess.run(["git", "init", "-q", str(work)], check=True)
            started = time.perf_counter()
            out = json.loads(ctx("run", "index", "--no-embed", "--json", cwd=work))
            print(f"index of the same tree (--no-embed, in-process): keyword-ready after {out['keyword_ready_s']:.1f} s, "
                  f"flow {out['seconds']:.1f} s, wall {time.perf_counter() - started:.1f} s; the stage's share: "
                  f"{best / out['keyword_ready_s'] * 100:.0f}% of keyword-ready time")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", type=Path, help="work here and keep the lake (default: a temp folder)")
    ap.add_argument("--tree", type=Path, help="also time the stage over this tree (a folder or a bare git repo)")
    ap.add_argument("--index-tree", action="store_true", help="with --tree: index it too, for the stage's share")
    args = ap.parse_args(argv)
    from prefect.testing.utilities import prefect_test_harness

    rc = 0
    with prefect_test_harness(server_startup_timeout=300):
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            rc = run_bench(args.keep, args.seed)
        else:
            with tempfile.TemporaryDirectory(prefix="ctx-bench-secrets-") as tmp:
                rc = run_bench(Path(tmp), args.seed)
        if args.tree:
            tree_cost(args.tree, args.index_tree)
    return rc


if __name__ == "__main__":
    sys.exit(main())


