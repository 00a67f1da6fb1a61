"""Terminal rendering for the CLI: Rich progress on stderr, results on stdout (plain when piped).

Data (paths, chunk text, SQL cells, source names) never goes through Rich markup unescaped: a
`[/]` in a cell would raise, `[red]x.py` would print as `x.py`. Both consoles leave emoji codes
alone, so `root:x:0:0` is not printed as `root❌0:0`.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ctxlake.serve.api.models import SearchResult, Status

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID
    from rich.text import Text

    from ctxlake.tasks.progress import FdReporter


def stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, emoji=False)


def stdout_console() -> Console:
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, emoji=False)


def plain(value: object) -> Text:
    """A table cell or line of data, shown as it is (no markup, no emoji codes)."""
    from rich.text import Text

    return Text("" if value is None else str(value))


class RichReporter:
    """Progress bars for the index stages on stderr; silent when stderr is not a terminal."""

    def __init__(self, console: Console | None = None) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console or stderr_console()
        self.enabled = self.console.is_terminal
        self.progress: Progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description:<12}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            disable=not self.enabled,
        )
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> RichReporter:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, stage: str, total: int | None, description: str = "") -> None:
        if stage in self.tasks:
            self.progress.reset(self.tasks[stage], total=total)
            return
        self.tasks[stage] = self.progress.add_task(description or stage, total=total)

    def advance(self, stage: str, n: int = 1) -> None:
        if stage in self.tasks:
            self.progress.advance(self.tasks[stage], n)

    def finish(self, stage: str) -> None:
        task = self.tasks.get(stage)
        if task is not None:
            current = self.progress.tasks[task]
            total = current.total if current.total is not None else max(current.completed, 1)
            self.progress.update(task, total=total, completed=total)

    def note(self, message: str) -> None:
        if self.enabled:
            from rich.markup import escape

            self.progress.console.print(f"[green]•[/] {escape(message)}")


def stage_reporter() -> RichReporter | FdReporter:
    """Progress bars on a terminal's stderr; for a command the resident service runs for a client
    on a terminal, the progress feed the service hands on to it (tasks/progress.py, PROGRESS_FD_ENV)."""
    from ctxlake.tasks.progress import FdReporter, fd_from_env

    fd = fd_from_env()
    return FdReporter(fd) if fd is not None else RichReporter()


def print_search(result: SearchResult, console: Console) -> None:
    from rich.markup import escape

    if not result.hits:
        console.print(f"No results for {result.query!r} ({result.mode}).", markup=False)
    for i, hit in enumerate(result.hits, start=1):
        where = f"{hit.path}:{hit.start_line}-{hit.end_line}"
        if hit.source != "project":
            where = f"[{hit.source}] {where}"
        # Escaped: Rich would read "[name]" (a source, a path) as a style tag and drop it.
        where = escape(where)
        symbol = f"  {escape(hit.symbol)}" if hit.symbol else ""
        console.print(f"[bold]{i:>2}. {where}[/]{symbol}  [dim]({escape(hit.kind)}, {escape(hit.lang or 'text')})[/]",
                      markup=True, highlight=False)
        for line in hit.snippet.splitlines():
            console.print("      " + line, style="dim", markup=False, highlight=False)
        console.print()
    if result.omitted:
        console.print(f"[dim]{result.tokens_used} tokens shown; {result.omitted} more hit(s) over the budget[/]",
                      highlight=False)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _writer_kind(writer: dict[str, Any]) -> str:
    return "watcher" if "--watch" in str(writer.get("purpose", "")) else "indexer"


def _print_malformed(st: Status, console: Console) -> None:
    for tool, reasons in st.memory_malformed.items():
        shown = ", ".join(f"{reason} {n:,}" for reason, n in list(reasons.items())[:6])
        console.print(f"memory: {tool} logs: {sum(reasons.values()):,} malformed record(s) skipped ({shown})",
                      markup=False, highlight=False)


def print_status(st: Status, console: Console) -> None:
    if not st.indexed:
        console.print(f"{st.root}: not indexed yet (run `ctx run index`).", markup=False)
        if st.config_trust:
            console.print(f"config: {st.config_trust.get('summary', '')}", markup=False, highlight=False)
        if st.writer:
            console.print(f"A {_writer_kind(st.writer)} is running: pid {st.writer.get('pid')} "
                          f"since {st.writer.get('since')}.", markup=False)
        _print_malformed(st, console)
        return
    pct = (st.embedded / st.chunks * 100) if st.chunks else 100.0
    rows: list[tuple[str, Any]] = [
        ("root", st.root),
        ("files", f"{st.files:,}"),
        ("chunks", f"{st.chunks:,}"),
        ("embedded", f"{st.embedded:,} ({pct:.1f}%)" + (f", {st.pending_vectors:,} pending" if st.pending_vectors else "")),
        ("languages", ", ".join(f"{k} {v}" for k, v in list(st.languages.items())[:8]) or "-"),
        ("sources", ", ".join(f"{k} {v}" for k, v in st.sources.items()) or "-"),
        ("model", f"{st.provider}/{st.model} ({st.model_id}, {st.dims}d)"),
        ("lake", f"{st.lake_dir} ({human_bytes(st.lake_bytes)})"),
    ]
    if st.last_run:
        lr = st.last_run
        rows.append(("last run", f"{lr.get('finished_at', '?')}: +{lr.get('added', 0)} ~{lr.get('modified', 0)} "
                     f"-{lr.get('removed', 0)} files in {lr.get('seconds', 0):.1f} s"))
    for name, run in sorted(st.source_runs.items()):
        rows.append((f"last sync {name}", f"{run.get('finished_at', '?')}: +{run.get('added', 0)} "
                     f"~{run.get('modified', 0)} -{run.get('removed', 0)} files in {run.get('seconds', 0):.1f} s"))
    if st.secret_files_skipped or st.masked_chunks:
        rows.append(("secrets", f"{st.secret_files_skipped:,} file(s) skipped by name, "
                                f"{st.masked_chunks:,} chunk(s) with masked values"))
    if st.not_indexed:
        rows.append(("not indexed", ", ".join(f"{n:,} {why}" for why, n in sorted(st.not_indexed.items()))
                     + " (`ctx status --skipped` lists them)"))
    if not st.clean:
        rows.append(("state", "the last run did not finish; the next `ctx run index` repairs it"))
    if st.writer:
        rows.append((_writer_kind(st.writer), f"running: pid {st.writer.get('pid')} since {st.writer.get('since')}"))
    if st.stale:
        fresh = f"no: {st.stale_count} file(s) changed since the last run"
    else:
        fresh = f"no: {st.behind}" if st.behind else "yes"
    rows.append(("fresh", fresh))
    if st.config_trust:
        rows.append(("config", st.config_trust.get("summary", "")))
    width = max(len(k) for k, _ in rows)
    from rich.text import Text

    for key, value in rows:
        console.print(Text.assemble((f"{key:<{width}}", "bold"), "  ", str(value)), highlight=False)
        if key == "fresh":  # the changed files under the line that counts them
            for path in st.stale_paths[:10]:
                console.print(f"{'':<{width}}    {path}", style="yellow", markup=False, highlight=False)
    _print_malformed(st, console)


NOT_INDEXED_WHY = {
    "binary": "NUL bytes or a binary extension",
    "too_large": "over [index] max_file_bytes",
    "secret": "named like a secret (.env*, keys, credentials); [index] secret_files = \"mask\" indexes them masked",
    "generated": "minified or generated code",
    "special": "not a regular file (FIFO, socket, device, link loop)",
    "unreadable": "could not be read (permissions); fix them and run `ctx run index`",
    "unreadable_folder": "a folder that could not be listed (permissions): nothing below it is indexed",
    "bad_name": "the name is not valid UTF-8 (shown escaped); rename the file to index it",
}


def print_not_indexed(root: Path, rows: list[tuple[str, str, int]], as_json: bool) -> None:
    """`ctx status --skipped`: the files seen but not indexed, grouped by why."""
    if as_json:
        print_json({"root": str(root), "not_indexed": [
            {"path": path, "reason": why, "bytes": size} for path, why, size in rows]})
        return
    if not rows:
        print("Every file the last run saw is indexed (ignored files are not counted).")
        return
    for why in sorted({why for _, why, _ in rows}):
        paths = [(path, size) for path, reason, size in rows if reason == why]
        print(f"{why} ({len(paths):,}): {NOT_INDEXED_WHY.get(why, '')}")
        for path, size in paths:
            print(f"  {path}/" if why == "unreadable_folder" else f"  {path}  ({human_bytes(size)})")


# JSON documents this process printed on stdout: a `--json` command that fails prints its error as
# one only where it printed none (`ctx status --json` outside a project prints its answer, then exits 4).
_documents = 0


def print_json(data: Any, indent: int | None = 2) -> None:
    """The one way a `--json` command prints its document (indent None: on one line)."""
    import json

    global _documents
    try:
        text = json.dumps(data, indent=indent, default=str, ensure_ascii=False, allow_nan=False)
    except ValueError:  # NaN or infinity (`ctx sql` over a double column): not JSON, so null
        text = json.dumps(_finite(data), indent=indent, default=str, ensure_ascii=False, allow_nan=False)
    sys.stdout.write(text + "\n")
    _documents += 1


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def json_documents() -> int:
    """How many documents print_json has printed in this process."""
    return _documents
