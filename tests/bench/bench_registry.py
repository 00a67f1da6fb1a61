#!/usr/bin/env python3
"""Config registry round trip: import -> sync -> import, the generated files' parse rate, and sync idempotence.

    python3 dev.py bench registry [--items 200] [--seed 5]

A temporary project gets N native items written by hand-made templates in each tool's own format (Claude
skills/commands/agents, Cursor rules, Gemini TOML commands, Copilot instruction and prompt files) with random
names, descriptions, globs, tools and multi-line bodies (quotes, colons, '#', unicode, TOML-hostile text).
Then: `import_native` into an empty registry, `sync` to every client, `import_native` again; and separately
every generated per-item file is read back with the importer's parser (header stripped) into a fresh registry.

Prints: items imported, round-trip equality (registry after import -> sync -> import equals the first import),
per-item fidelity of generated files read back (Claude, Cursor, Gemini, Copilot), files that parse in their
format (YAML front matter / TOML), files written by a second sync (must be 0), --check exit state, and timings.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import yaml

from ctxlake.tasks.registry import import_native, load_registry, sync

WORDS = ["alpha", "beta: gamma", "quote \"x\"", "tab\there", "hash # not a comment", "ünïcödé", "'single'",
         "{{args}}", "$ARGUMENTS", "back\\slash", "triple \"\"\" quotes", "- list item", "* star", "`code`"]


def _text(rng: random.Random, lines: int) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(lines)) + "\n"


def _desc(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5)))


def _q(s: str) -> str:
    return yaml.safe_dump(s, width=10_000).strip().removesuffix("\n...").strip()


def write_native(root: Path, n: int, rng: random.Random) -> None:
    for k in range(n):
        name = f"item-{k:04d}"
        desc, body = _desc(rng), _text(rng, rng.randint(1, 8))
        shape = k % 7
        if shape == 0:
            rel, text = f".claude/skills/{name}/SKILL.md", f"---\nname: {name}\ndescription: {_q(desc)}\n---\n{body}"
        elif shape == 1:
            rel = f".claude/commands/{name}.md"
            text = f"---\ndescription: {_q(desc)}\nargument-hint: {_q('[x] [y]')}\n---\n{body}"
        elif shape == 2:
            rel = f".claude/agents/{name}.md"
            text = f"---\nname: {name}\ndescription: {_q(desc)}\ntools: Read, Grep, Bash\nmodel: sonnet\n---\n{body}"
        elif shape == 3:
            rel = f".cursor/rules/{name}.mdc"
            text = (f"---\ndescription: {_q(desc)}\nglobs: {_q('src/**/*.py,tests/**')}\nalwaysApply: "
                    f"{str(rng.random() < 0.3).lower()}\n---\n{body}")
        elif shape == 4:
            rel = f".gemini/commands/{name}.toml"
            import json

            text = f"description = {json.dumps(desc)}\nprompt = {json.dumps(body)}\n"
        elif shape == 5:
            rel = f".github/instructions/{name}.instructions.md"
            text = f"---\ndescription: {_q(desc)}\napplyTo: {_q('docs/**')}\n---\n{body}"
        else:
            rel, text = f".github/prompts/{name}.prompt.md", f"---\ndescription: {_q(desc)}\n---\n{body}"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def parses(path: Path) -> bool:
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".toml":
            tomllib.loads(text)
            return True
        if path.name in ("CLAUDE.md", "AGENTS.md", "GEMINI.md"):
            return "ctx:registry:start" in text and "ctx:registry:end" in text
        if not text.startswith("---\n"):
            return False
        return isinstance(yaml.safe_load(text.split("---\n", 2)[1]), dict)
    except (tomllib.TOMLDecodeError, yaml.YAMLError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    try:
        root = tmp / "p"
        (root / ".ctx").mkdir(parents=True)
        write_native(root, args.items, rng)
        t0 = time.perf_counter()
        first = import_native(root)
        t_import = time.perf_counter() - t0
        registry = load_registry(root)
        t0 = time.perf_counter()
        res = sync(root)
        t_sync = time.perf_counter() - t0
        written = [c.path for c in res.changes if c.action in ("create", "update")]
        t0 = time.perf_counter()
        again = sync(root)
        t_resync = time.perf_counter() - t0
        check = sync(root, check=True)
        second = import_native(root)
        same = load_registry(root) == registry and not second.imported
        ok = sum(parses(root / rel) for rel in written)
        # Generated per-item files read back into a fresh registry (header line removed): fidelity per client.
        fresh = tmp / "fresh"
        (fresh / ".ctx").mkdir(parents=True)
        for rel in written:
            if rel in ("CLAUDE.md", "AGENTS.md", "GEMINI.md"):
                continue
            text = (root / rel).read_text(encoding="utf-8")
            text = "\n".join(line for line in text.split("\n") if "generated by `ctx sync`" not in line)
            (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
            (fresh / rel).write_text(text, encoding="utf-8")
        by_key = {(i.kind, i.name): i for i in registry}
        print(f"items written natively: {args.items}; imported: {len(first.imported)}; skipped: {len(first.skipped)}")
        print(f"import -> sync -> import gives the same registry: {same} (second import added {len(second.imported)})")
        print(f"files written by sync: {len(written)}; parse in their format: {ok}/{len(written)}; "
              f"conflicts: {len(res.conflicts)}")
        print(f"second sync: files written {sum(c.action != 'unchanged' for c in again.changes)}; "
              f"--check pending: {len(check.pending)}")
        for client in ("claude", "cursor", "gemini", "copilot"):
            probe = tmp / f"probe-{client}"
            shutil.copytree(fresh, probe)
            import_native(probe, [client])
            got = load_registry(probe)
            exact = sum(by_key.get((i.kind, i.name)) == i for i in got)
            print(f"  read back from {client} files: {len(got)} items, identical to the registry: {exact}/{len(got)}")
        print(f"timings: import {t_import * 1000:.0f} ms, sync {t_sync * 1000:.0f} ms, "
              f"no-op sync {t_resync * 1000:.0f} ms ({args.items} items)")
        return 0 if same and ok == len(written) and not again.written else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
