"""Helpers for the MCP tests: a small project with code and docs, snapshot scrubbing, a tool-call wrapper."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SNAPSHOTS = Path(__file__).parent / "snapshots"
# Fields whose values change from run to run (timings, clocks, BM25 scores, process ids).
VOLATILE = {"took_ms", "checked_in_ms", "score", "modifiedAt", "indexed_at", "last_indexed", "last_run",
            "finished_at", "seconds", "keyword_ready_s", "encode_seconds", "pid", "lake_bytes"}

PROJECT = {
    "src/users/service.py": '''"""User lookups."""


class UserRepository:
    """Stores users in a dict."""

    def __init__(self):
        self.rows = {}

    def getUserById(self, user_id):
        """Return the user with this id, or None."""
        return self.rows.get(user_id)

    def save_user(self, user):
        self.rows[user["id"]] = user
        return user
''',
    "src/billing/invoice.py": '''def compute_invoice_total(lines, tax_rate):
    """Sum the invoice lines and add tax."""
    subtotal = sum(line["amount"] for line in lines)
    return round(subtotal * (1 + tax_rate), 2)


def format_currency(value):
    return f"${value:,.2f}"


class InvoicePrinter:
    """Renders invoices as text."""

    def render(self, invoice):
        total = compute_invoice_total(invoice["lines"], invoice["tax_rate"])
        return f"Total: {format_currency(total)}"
''',
    "web/app.js": '''export function renderInvoice(invoice) {
  const rows = invoice.lines.map((line) => `<tr><td>${line.amount}</td></tr>`);
  return `<table>${rows.join("")}</table>`;
}

export class CartView {
  constructor(cart) {
    this.cart = cart;
  }

  totalItems() {
    return this.cart.items.length;
  }
}
''',
    "docs/billing.md": "# Billing\n\nInvoices are totalled with tax.\n\n## Currency\n\nAmounts print with two decimals.\n",
    "docs/guide/install.rst": "Install\n=======\n\nRun ``pip install shop``.\n",
    "docs/notes.txt": "Plain notes.\n",
    "docs/conf.py": "project = 'shop'\n",
    "README.md": "# Shop\n\nA tiny shop used by the MCP tests.\n",
}


def scrub(data: Any, root: Path | None = None) -> Any:
    """A tool answer with volatile values replaced by "<ANY>" and the temp root by "<ROOT>"."""
    if isinstance(data, dict):
        return {k: ("<ANY>" if k in VOLATILE and v is not None else scrub(v, root)) for k, v in data.items()}
    if isinstance(data, list):
        return [scrub(v, root) for v in data]
    if isinstance(data, str) and root is not None:
        return data.replace(str(root), "<ROOT>")
    return data


def check_snapshot(name: str, data: Any) -> None:
    """Compare with tests/serve/snapshots/<name>.json; UPDATE_SNAPSHOTS=1 rewrites it."""
    path = SNAPSHOTS / f"{name}.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert path.exists(), f"snapshot {path.name} is missing (UPDATE_SNAPSHOTS=1 writes it)"
    assert data == json.loads(path.read_text(encoding="utf-8")), f"{name} differs from its snapshot"


async def call_ok(client: Any, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    """Call a tool that must succeed; its structured content, checked against the text mirror."""
    result = await client.call_tool(name, args or {})
    text = result.content[0].text if result.content else ""
    assert not result.is_error, f"{name} failed: {text}"
    assert result.structured_content is not None
    # The text mirror and the structured content carry the same answer.
    assert json.loads(text) == result.structured_content
    data: dict[str, Any] = result.structured_content
    return data


async def call_error(client: Any, name: str, args: dict[str, Any] | None = None) -> str:
    """Call a tool that must fail; the error text the client sees."""
    result = await client.call_tool(name, args or {})
    text = result.content[0].text if result.content else ""
    assert result.is_error, f"{name} unexpectedly succeeded: {text[:300]}"
    return str(text)


def call_memory_tool(settings: Any, tool: str, args: dict[str, Any], allow_writes: bool = False) -> Any:
    """One call of a conversation-memory tool on a server of its own, in memory: its raw result."""
    import asyncio

    from mcp import Client
    from mcp.server import MCPServer

    from ctxlake.serve.mcp.memory import register_memory_tools

    server = MCPServer("memory-test")
    register_memory_tools(server, settings, allow_writes=allow_writes)

    async def go() -> Any:
        async with Client(server) as client:
            return await client.call_tool(tool, args)

    return asyncio.run(go())
