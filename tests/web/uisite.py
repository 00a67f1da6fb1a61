"""A small indexed project with one ingested Claude Code session, served by the web UI in this process."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import git, write_files
from memlogs import claude, slug, tool_result, tool_use, write_jsonl

CHROMIUM = "/usr/bin/chromium"
FILES = {
    "billing/refunds.py": ("def issue_refund_voucher(order, amount):\n    \"\"\"Refund part of an order as a voucher.\"\"\"\n"
                           "    return {'order': order, 'amount': amount}\n\n\n"
                           "def refund_total(orders):\n    return sum(o['amount'] for o in orders)\n"),
    "shipping/labels.py": "class LabelPrinter:\n    def print_label(self, parcel):\n        return f'label for {parcel}'\n",
    "README.md": "# Shop\n\nBilling and shipping helpers.\n",
}
SESSION_TEXT = "Make refunds go out as vouchers instead of card payments"


@dataclass
class Site:
    repo: Path
    env: dict[str, str]
    url: str
    server: object


@contextmanager
def ui_site(base: Path) -> Iterator[Site]:
    """Index the repo and ingest a session (real flows, fake embedder), then serve the UI on a free port."""
    from prefect.settings import PREFECT_API_URL

    from ctxlake.serve.cli.app import run
    from ctxlake.serve.web.base import UiContext
    from ctxlake.serve.web.server import UiServer

    repo = base / "shop"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, FILES)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "initial")
    cwd = str(repo)
    write_jsonl(base / "claude" / "projects" / slug(cwd) / "s1.jsonl", [
        claude("user", "u1", 0, SESSION_TEXT, session="s1", cwd=cwd),
        claude("assistant", "a1", 1, [{"type": "text", "text": "We decided to issue vouchers through issue_refund_voucher."},
                                      tool_use("Edit", file_path=f"{cwd}/billing/refunds.py")], session="s1", cwd=cwd),
        claude("user", "u2", 2, tool_result("ok"), session="s1", cwd=cwd),
        claude("assistant", "a2", 3, [{"type": "text", "text": "Done; TODO: add a test for partial refunds"}],
               session="s1", cwd=cwd),
    ])
    env = {"CTX_HOME": str(base / "ctx-home"), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
           "HOME": str(base / "home")}
    (base / "home").mkdir(exist_ok=True)
    api = PREFECT_API_URL.value()
    if api:  # background jobs (ctx add) use this session's Prefect server instead of starting one
        env["PREFECT_API_URL"] = str(api)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.chdir(repo)
        assert run(["run", "index"]) == 0
        assert run(["run", "ingest", f"--from=claude={base / 'claude'}"]) == 0
    server = UiServer(UiContext(projects=lambda: [str(repo)], env={**os.environ, **env}, mode="standalone"), 0)
    url = server.start()
    try:
        yield Site(repo=repo, env=env, url=url, server=server)
    finally:
        server.stop()


def read_answer(sock: socket.socket) -> tuple[int, str]:
    """(status, body) of the HTTP answer a raw socket receives until the server closes it."""
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    head_text, _, text = answer.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head_text.split()[1]), text
