#!/usr/bin/env python3
"""Fuzz the seven agent-log scrapers with mutated records; every record must be parsed or counted.

    python3 dev.py bench fuzz_logs [--records 56000] [--seed 11] [--drift DIR ...]

Seed records are the fixtures of ../shared/fixtures/agent-logs (each tool's real record shapes);
each mutated record is one of: a type swap somewhere in it (a list where a string is, an int
where a list is, null, an object, a bool, a float), a missing key, an extra key, a value nested
one level deeper, a huge value, a truncated line, the line in Latin-1 or UTF-16, or random bytes.
The mutated records are written into a temporary store per tool and read by the real scraper
(`scrape_group`, as `ctx run ingest` does), then turned into MESSAGES rows (`messages_table`).

Per tool it prints records written, records the scraper counted, records parsed (counted minus
malformed: they became messages, or were ignored as content-free or counted as an unknown type),
malformed records by reason, and crashes: exceptions that escaped the scrape or the
row conversion (must be 0). "parser error (...)" reasons are records that broke a parser and were
caught by the per-record guard: counted, not lost, but each one is a crash site to fix.

`--drift-git GITDIR:FOLDER` (repeatable) also scrapes another project's agent-log fixtures, read
from a git mirror of it (e.g. ../.mirror/lanegrid+agtrace/repo:crates/agtrace-providers/tests/samples)
into a temporary folder, never into this repository. Files are routed to a scraper by name
(claude*, codex* / rollout-*, gemini*, cursor*, copilot*, opencode*, antigravity*) and each
scraper's counts are printed: records counted, messages, ignored, unknown and malformed by reason.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "agent-logs"
sys.path.insert(0, str(ROOT / "tests"))

from ctxlake.tasks.memory_store import messages_table  # noqa: E402
from ctxlake.tasks.scrape import SCRAPERS, ScrapeState, WorkItem, scrape_group  # noqa: E402
from ctxlake.tasks.scrape.base import ScrapeOutput  # noqa: E402

TOOLS = ("claude", "codex", "gemini", "cursor", "copilot", "opencode", "antigravity")
SCALARS: list[Any] = [None, 0, -1, 2**70, 1.5e308, True, "", "x", [], {}, [1, "a"], {"k": [1]}]
MUTATIONS = ("type_swap", "type_swap", "type_swap", "drop_key", "extra_key", "nest", "huge", "truncate",
             "latin1", "utf16", "random_bytes")


# -- seeds ---------------------------------------------------------------------------------------


def jsonl_seeds(*names: str) -> list[dict[str, Any]]:
    out = []
    for name in names:
        path = FIXTURES / name
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
    return out


def opencode_seeds() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    base = FIXTURES / "opencode" / "storage_v2"
    pairs = []
    for msg in sorted((base / "message").rglob("*.json")):
        m = json.loads(msg.read_text())
        parts = [json.loads(p.read_text()) for p in sorted((base / "part" / m["id"]).glob("*.json"))]
        pairs.append((m, parts))
    return pairs


# -- mutation ------------------------------------------------------------------------------------


def paths_of(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths_of(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:6]):
            found += paths_of(v, (*prefix, i))
    return found


def set_at(value: Any, path: tuple[Any, ...], new: Callable[[Any], Any]) -> Any:
    if not path:
        return new(value)
    head, rest = path[0], path[1:]
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = set_at(copy[head], rest, new)
    return copy


def swap(rng: random.Random) -> Callable[[Any], Any]:
    choice = rng.choice([*SCALARS, "wrap_list", "deep"])
    if choice == "wrap_list":
        return lambda v: [v]
    if choice == "deep":
        return lambda v: json.loads("[" * 40 + "1" + "]" * 40)
    return lambda v: choice


def mutate_value(rec: dict[str, Any], rng: random.Random, how: str) -> Any:
    paths = paths_of(rec)
    path = rng.choice(paths[1:] or paths)
    if how == "type_swap":
        return set_at(rec, path, swap(rng))
    if how == "drop_key":
        key_path = [p for p in paths if p and isinstance(p[-1], str)]
        if not key_path:
            return rec
        target = rng.choice(key_path)
        return set_at(rec, target[:-1], lambda d: {k: v for k, v in d.items() if k != target[-1]})
    if how == "extra_key":
        return {**rec, rng.choice(["type", "x", "content", "message", "id", "role"]) + "_": rng.choice(SCALARS)}
    if how == "nest":
        return set_at(rec, path, lambda v: {"value": v})
    if how == "huge":
        return set_at(rec, path, lambda v: "é" * rng.choice([10, 5000, 100_000]))
    return rec


def mutate_line(rec: dict[str, Any], rng: random.Random) -> tuple[bytes, str]:
    how = rng.choice(MUTATIONS)
    if how == "random_bytes":
        return bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))).replace(b"\n", b" ") + b"\n", how
    value = mutate_value(rec, rng, how)
    text = json.dumps(value, ensure_ascii=False)
    if how == "truncate":
        return text[: rng.randint(1, max(1, len(text) - 1))].encode() + b"\n", how
    if how == "latin1":
        return (text.replace("a", "ä", 1) + "\n").encode("latin-1", errors="replace"), how
    if how == "utf16":
        return text.encode("utf-16-le") + b"\n", how
    return (text + "\n").encode(), how


# -- stores --------------------------------------------------------------------------------------


def write_jsonl_store(folder: Path, rel: str, seeds: list[dict[str, Any]], n: int, rng: random.Random,
                      header: list[dict[str, Any]] | None = None, per_file: int = 400) -> None:
    """n mutated records in files of `per_file` lines; each file opens with its unmutated header lines."""
    written = 0
    index = 0
    while written < n:
        path = folder / rel.format(i=index)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            for rec in header or []:
                fh.write(json.dumps(rec).encode() + b"\n")
            for _ in range(min(per_file, n - written)):
                line, _ = mutate_line(rng.choice(seeds), rng)
                fh.write(line)
                written += 1
        index += 1


def write_opencode(folder: Path, n: int, rng: random.Random) -> None:
    seeds = opencode_seeds()
    session = json.loads(next((FIXTURES / "opencode/storage_v2/session").rglob("*.json")).read_text())
    (folder / "session" / "p").mkdir(parents=True)
    (folder / "session" / "p" / "s.json").write_text(json.dumps(session))
    written = 0
    i = 0
    while written < n:
        m, parts = rng.choice(seeds)
        mid = f"msg_{i:06d}"
        line, _ = mutate_line({**m, "id": mid, "sessionID": session["id"]}, rng)
        target = folder / "message" / session["id"] / f"{mid}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(line)
        written += 1
        for j, part in enumerate(parts[:3]):
            pline, _ = mutate_line({**part, "messageID": mid}, rng)
            pdir = folder / "part" / mid
            pdir.mkdir(parents=True, exist_ok=True)
            (pdir / f"{j:03d}.json").write_bytes(pline)
            written += 1
        i += 1


def build(tool: str, folder: Path, n: int, rng: random.Random) -> None:
    if tool == "claude":
        write_jsonl_store(folder, "proj/s{i}.jsonl", jsonl_seeds("claude/small.jsonl", "claude/large.jsonl"), n, rng)
    elif tool == "codex":
        seeds = jsonl_seeds("codex/small.jsonl", "codex/large.jsonl")
        write_jsonl_store(folder, "2026/01/01/rollout-{i}.jsonl", seeds, n, rng, header=seeds[:1])
    elif tool == "gemini":
        seeds = jsonl_seeds("gemini/jsonl_v040.jsonl")
        doc = json.loads((FIXTURES / "gemini/large.json").read_text())
        seeds += [m for m in doc.get("messages", []) if isinstance(m, dict)]
        write_jsonl_store(folder, "h/chats/session-{i}.jsonl", seeds[1:], n, rng, header=seeds[:1])
    elif tool == "cursor":
        seeds = jsonl_seeds("cursor/small.jsonl", "cursor/large.jsonl")
        write_jsonl_store(folder, "proj/agent-transcripts/c{i}/c{i}.jsonl", seeds, n, rng)
    elif tool == "copilot":
        seeds = jsonl_seeds("copilot/small.jsonl", "copilot/large.jsonl")
        write_jsonl_store(folder, "s{i}/events.jsonl", seeds[1:], n, rng, header=seeds[:1])
    elif tool == "antigravity":
        write_jsonl_store(folder, "brain/c{i}.jsonl", jsonl_seeds("antigravity/cli_small.jsonl"), n, rng)
    elif tool == "opencode":
        write_opencode(folder, n, rng)


# -- running -------------------------------------------------------------------------------------


def scrape_tree(name: str, root: Path) -> tuple[ScrapeOutput | None, str]:
    """The scraper's whole run over `root`, as ingest does it; (None, error) when it raised."""
    s = SCRAPERS[name]
    files = s.store_files(root)
    fps = {str(p): fp for p in files if (fp := s.fingerprint(p)) is not None}
    try:
        out = scrape_group.fn(WorkItem(name, root, files, fps), ScrapeState())
        messages_table(out.messages, 8)
    except Exception as exc:  # what the bench counts as a crash
        return None, f"{type(exc).__name__}: {exc}"
    return out, ""


def report(label: str, written: int | str, out: ScrapeOutput | None, error: str, seconds: float) -> int:
    if out is None:
        print(f"{label:<12} CRASH {error[:200]}")
        return 1
    c = out.counts
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(c.malformed.items(), key=lambda kv: -kv[1]))
    parsed = c.records - c.n_malformed
    print(f"{label:<12} records {written!s:>7}  counted {c.records:>6}  parsed {parsed:>6} (messages {c.messages:>5},"
          f" ignored {c.ignored:>5}, unknown {c.n_unknown:>4})  malformed {c.n_malformed:>5}  crashes 0  {seconds:5.2f} s")
    if reasons:
        print(f"{'':<12} malformed by reason: {reasons}")
    sites = sorted({w.split(" at ", 1)[1].split(":", 2)[0] + ":" + w.split(" at ", 1)[1].split(":", 2)[1]
                    for w in out.warnings if "parser error" in w and " at " in w})
    if sites:
        print(f"{'':<12} caught parser errors at: {', '.join(sites)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--records", type=int, default=56_000, help="mutated records in all (split over 7 tools)")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--drift-git", action="append", default=[], metavar="GITDIR:FOLDER",
                    help="another project's fixture folder in a git mirror, to scrape")
    args = ap.parse_args()
    if not FIXTURES.is_dir():
        print(f"skipped: {FIXTURES} (seed records) is absent")
        return 0
    import logging

    logging.getLogger("ctxlake").setLevel(logging.ERROR)  # one warning per caught parser error is noise here
    crashes = 0
    per_tool = args.records // len(TOOLS)
    print(f"fuzz: {per_tool * len(TOOLS):,} mutated records, seed {args.seed}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ctx-fuzz-") as tmp:
        for tool in TOOLS:
            rng = random.Random(f"{args.seed}:{tool}")
            folder = Path(tmp) / tool
            folder.mkdir()
            build(tool, folder, per_tool, rng)
            t0 = time.perf_counter()
            out, error = scrape_tree(tool, folder)
            crashes += report(tool, per_tool, out, error, time.perf_counter() - t0)
    print(f"total {time.perf_counter() - started:.1f} s; crashes {crashes}")
    for spec in args.drift_git:
        crashes += drift(spec)
    return 1 if crashes else 0


ROUTES = (("claude", "claude"), ("codex", "codex"), ("rollout-", "codex"), ("gemini", "gemini"), ("cursor", "cursor"),
          ("copilot", "copilot"), ("opencode", "opencode"), ("antigravity", "antigravity"))


def drift(spec: str) -> int:
    """Scrape another project's fixture files (from its git mirror) with the scraper their name points to."""
    import subprocess
    import tarfile

    git_dir, _, folder = spec.partition(":")
    print(f"\nschema drift: {spec}")
    crashes = 0
    with tempfile.TemporaryDirectory(prefix="ctx-drift-") as tmp:
        archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", "HEAD", folder], check=True,
                                 capture_output=True).stdout
        src = Path(tmp) / "src"
        with tarfile.open(fileobj=__import__("io").BytesIO(archive)) as tar:
            tar.extractall(src, filter="data")
        roots: dict[str, Path] = {}
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            tool = next((t for prefix, t in ROUTES if path.name.startswith(prefix)), None)
            if tool is None or path.suffix not in (".json", ".jsonl"):
                continue
            root = roots.setdefault(tool, Path(tmp) / "by-tool" / tool)
            # Gemini's chats are JSON documents named session-*.json under <hash>/chats/.
            target = root / "h" / "chats" / f"session-{path.stem}{path.suffix}" if tool == "gemini" else root / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(path.read_bytes())
        for tool, root in roots.items():
            t0 = time.perf_counter()
            out, error = scrape_tree(tool, root)
            crashes += report(tool, f"{len(SCRAPERS[tool].store_files(root))} files", out, error, time.perf_counter() - t0)
    return crashes


if __name__ == "__main__":
    raise SystemExit(main())
