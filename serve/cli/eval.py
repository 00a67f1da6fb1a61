"""Retrieval-quality commands: `ctx files` (files ranked for a query) and `ctx eval` (score file
localisation on a task file: table, JSON, Markdown, chart)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ctxlake.errors import InputError
from ctxlake.schemas.config import load_settings
from ctxlake.schemas.names import PROJECT_SOURCE
from ctxlake.schemas.roots import find_root
from ctxlake.serve.cli.base import MAX_LIMIT

if TYPE_CHECKING:
    from ctxlake.serve.api.evaluate import EvalReport, RunSummary

ACC_COLUMNS = ("acc@1", "acc@3", "acc@5", "acc@10", "recall@20")


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def eval_command(
    tasks: Annotated[Path, typer.Argument(help="JSONL task file: problem_statement, gold_files, repo|fetch_source, base_commit")],
    modes: Annotated[list[str] | None, typer.Option("--modes", help="comma-separated: keyword, semantic, hybrid")] = None,
    profiles: Annotated[list[str] | None, typer.Option("--profile", help="embedding profile or model (repeatable); default: embed.model")] = None,
    mirrors: Annotated[list[Path] | None, typer.Option("--mirrors", help="folder of git mirrors, owner+name/repo (repeatable; default: eval.mirrors)")] = None,
    corpora: Annotated[list[str] | None, typer.Option("--corpus", help="all, non-test (comma-separated; default both)")] = None,
    include: Annotated[list[str] | None, typer.Option("--include", help="glob of files to index (repeatable; default: eval.include, *.py)")] = None,
    only: Annotated[list[str] | None, typer.Option("--only", help="instance ids or repos to run (repeatable)")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="run the first N tasks only")] = None,
    ablate: Annotated[bool, typer.Option("--ablate", help="also score plain BM25 and each technique switched off")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as one JSON document on stdout")] = False,
    report_path: Annotated[Path | None, typer.Option("--report", help="write the JSON report to this file")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="write the tables (and ablation) as Markdown")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="draw Acc@k per mode/profile to this PNG (needs matplotlib)")] = None,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="no per-task lines on stderr")] = False,
    query: Annotated[str, typer.Option("--query", help="full: the whole issue text; title: its first line only")] = "full",
) -> None:
    """Score file localisation on a task file: Acc@1/3/5/10, Recall@20 and MRR with 95% CIs."""
    from ctxlake.serve.api.evaluate import CORPORA, MODES, EvalPlan, run_eval
    from ctxlake.serve.cli.base import _prefect_quietly, start_prefect_shielded

    if not tasks.is_file():
        raise InputError(f"no task file at {tasks}")
    chosen_modes = _split(modes) or list(MODES)
    unknown = [m for m in chosen_modes if m not in MODES]
    if unknown:
        raise InputError(f"unknown mode(s) {', '.join(unknown)}", hint="keyword, semantic, hybrid")
    chosen_corpora = _split(corpora) or list(CORPORA)
    if any(c not in CORPORA for c in chosen_corpora):
        raise InputError(f"unknown corpus in {', '.join(chosen_corpora)}", hint="all, non-test")
    if query not in ("full", "title"):
        raise InputError(f"unknown --query {query!r}", hint="full or title")
    if plot is not None:
        _require_matplotlib()
    cwd = Path.cwd()
    settings = load_settings(find_root(cwd) or cwd)
    mirror_dirs = list(mirrors or []) or [Path(m).expanduser() for m in settings.eval.mirrors]
    for folder in mirror_dirs:
        if not folder.is_dir():
            raise InputError(f"--mirrors {folder} is not a folder")
    _prefect_quietly(verbose=False)
    # An eval runs for many minutes; on a loaded machine Prefect's temporary server can take
    # longer than its default 20 s to answer, which would fail the whole run at its first index.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    start_prefect_shielded()  # the guarded temporary server, as `ctx run` starts it
    from ctxlake.serve.api.ranking import RankOptions

    plan = EvalPlan(
        tasks_file=tasks, modes=chosen_modes,  # type: ignore[arg-type]
        profiles=_split(profiles), mirrors=mirror_dirs, corpora=chosen_corpora,
        include=_split(include) or settings.eval.include,
        options=RankOptions(rrf_k=settings.search.rrf_k), ablate=ablate, only=_split(only), limit=limit,
        query=query,
    )
    log = None if quiet else (lambda msg: typer.echo(msg, err=True))
    report = run_eval(settings, plan, log=log)
    document = report.model_dump(mode="json")
    if report_path is not None:
        _write(report_path, _json(document))
    if markdown is not None:
        _write(markdown, report_markdown(report))
    if plot is not None:
        draw_chart(report, plot)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(document)
        return
    print_report(report)
    for target in (report_path, markdown, plot):
        if target is not None:
            typer.echo(f"wrote {target}", err=True)


def files_command(
    query: Annotated[str, typer.Argument(help="what to look for: an issue text, a traceback, identifiers, words")],
    limit: Annotated[int | None, typer.Option("-n", "--limit", min=1, max=MAX_LIMIT, help="number of files")] = None,
    mode: Annotated[str | None, typer.Option("--mode", help="hybrid | keyword | semantic")] = None,
    path_glob: Annotated[str | None, typer.Option("--path", help="only paths matching this glob")] = None,
    lang: Annotated[str | None, typer.Option("--lang", help="only this language, e.g. python")] = None,
    no_tests: Annotated[bool, typer.Option("--no-tests", help="leave test files out")] = False,
    sources: Annotated[str | None, typer.Option("--sources", help="comma-separated source names (default all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON document on stdout")] = False,
) -> None:
    """Rank the indexed files for a query: which files to open first (same ranking as `ctx eval`)."""
    from ctxlake.schemas.roots import resolve_root

    if mode is not None and mode not in ("hybrid", "keyword", "semantic"):
        raise InputError(f"unknown --mode {mode!r}", hint="hybrid, keyword or semantic")
    settings = load_settings(resolve_root(None, for_write=False))
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.serve.api.file_search import search_files
    from ctxlake.serve.api.source_queries import check_names, parse_names

    names = parse_names(sources)
    check_names(settings, names)
    result = search_files(Lake(settings), query, mode=mode, limit=limit, path_glob=path_glob,  # type: ignore[arg-type]
                          lang=lang, exclude_tests=no_tests, sources=names)
    if as_json:
        from ctxlake.serve.cli.render import print_json

        print_json(result.model_dump())
        return
    from rich.markup import escape

    from ctxlake.serve.cli.render import stdout_console

    console = stdout_console()
    if not result.files:
        console.print(f"No files for {result.query[:60]!r} ({result.mode}).", markup=False)
    for i, hit in enumerate(result.files, start=1):
        where = f"  best match: lines {hit.start_line}-{hit.end_line}" if hit.start_line else ""
        symbol = f" {hit.symbol}" if hit.symbol else ""
        # Another source's file is named as `ctx search` names it: two sources may hold the same path.
        path = hit.path if hit.source == PROJECT_SOURCE else f"[{hit.source}] {hit.path}"
        # Escaped: a path or symbol may hold "[red]", which Rich would read as a style.
        console.print(f"[bold]{i:>2}. {escape(path)}[/]  [dim]{escape(where.strip() + symbol)}[/]",
                      highlight=False)
    for warning in result.warnings:
        typer.echo(f"warning: {warning}", err=True)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command("files")(files_command)


def _json(document: Any) -> str:
    import json

    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def _write(path: Path, text: str) -> None:
    from ctxlake.tasks.lake import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise InputError("--plot needs matplotlib, which is not installed",
                         hint="pip install 'ctxlake[eval]' (or matplotlib>=3.8)") from exc


# -- rendering ------------------------------------------------------------------------------------


def _pct(est: dict[str, float | int]) -> str:
    return f"{100 * float(est['mean']):.1f}"


def _ci(est: dict[str, float | int], scale: float = 100.0, digits: int = 1) -> str:
    return f"{scale * float(est['low']):.{digits}f}–{scale * float(est['high']):.{digits}f}"


def _run_label(run: RunSummary) -> list[str]:
    return [run.profile, run.mode, run.corpus, run.variant]


def summary_rows(report: EvalReport) -> list[list[str]]:
    """One row per run: profile, mode, corpus, variant, n, Acc@k, Recall@20, MRR (95% CI)."""
    rows = []
    for run in report.runs:
        o = run.overall
        rows.append([*_run_label(run), str(run.n), *(_pct(o[m]) for m in ACC_COLUMNS),
                     f"{float(o['mrr']['mean']):.3f}", f"{_ci(o['acc@1'])}", f"{_ci(o['mrr'], 1.0, 2)}"])
    return rows


SUMMARY_HEADER = ["profile", "mode", "corpus", "variant", "n", "Acc@1", "Acc@3", "Acc@5", "Acc@10",
                  "R@20", "MRR", "Acc@1 95% CI", "MRR 95% CI"]


def repo_rows(report: EvalReport, corpus: str) -> tuple[list[str], list[list[str]]]:
    """Per-repository Acc@1 / Acc@5 / MRR of each full-pipeline (profile, mode) on one corpus."""
    runs = [r for r in report.runs if r.variant == "full" and r.corpus == corpus]
    repos = sorted({repo for r in runs for repo in r.per_repo})
    header = ["repo", "n"] + [f"{r.profile}/{r.mode} A@1 · A@5 · MRR" for r in runs]
    rows = []
    for repo in repos:
        n = next((int(r.per_repo[repo]["n"]) for r in runs if repo in r.per_repo), 0)
        cells = []
        for r in runs:
            m = r.per_repo.get(repo)
            cells.append("-" if m is None else
                         f"{100 * m['acc@1']:.0f} · {100 * m['acc@5']:.0f} · {m['mrr']:.2f}")
        rows.append([repo, str(n), *cells])
    return header, rows


def ablation_rows(report: EvalReport) -> list[list[str]]:
    """Each variant against the full pipeline on the same tasks: paired differences with 95% CIs."""
    from ctxlake.tasks.metrics import paired_difference

    by_key: dict[tuple[str, str, str, str], dict[str, dict[str, float]]] = {}
    for r in report.results:
        by_key.setdefault((r.profile, r.mode, r.corpus, r.variant), {})[r.instance_id] = r.metrics
    rows = []
    for (profile, mode, corpus, variant), tasks in sorted(by_key.items()):
        full = by_key.get((profile, mode, corpus, "full"))
        if variant == "full" or full is None:
            continue
        ids = sorted(set(tasks) & set(full))
        cells = [profile, mode, corpus, variant, str(len(ids))]
        for metric in ("acc@1", "acc@5", "mrr"):
            diff = paired_difference([tasks[i][metric] for i in ids], [full[i][metric] for i in ids])
            scale, digits = (1.0, 3) if metric == "mrr" else (100.0, 1)
            cells.append(f"{scale * diff.mean:+.{digits}f} ({scale * diff.low:+.{digits}f}…{scale * diff.high:+.{digits}f})")
        rows.append(cells)
    return rows


ABLATION_HEADER = ["profile", "mode", "corpus", "variant", "n", "ΔAcc@1 (95% CI)", "ΔAcc@5 (95% CI)", "ΔMRR (95% CI)"]


def print_report(report: EvalReport) -> None:
    from rich.table import Table

    from ctxlake.serve.cli.render import plain, stdout_console

    console = stdout_console()
    if not console.is_terminal:
        console.width = 240  # piped into a file or a log: keep every table row on one line
    table = Table(title=plain(f"File localisation on {Path(report.tasks_file).name}: {report.tasks} tasks "
                              f"(Acc and Recall in %, 95% bootstrap CIs)"))
    for col in SUMMARY_HEADER:
        table.add_column(col, justify="left" if col in ("profile", "mode", "corpus", "variant") else "right")
    for row in summary_rows(report):
        table.add_row(*map(plain, row))
    console.print(table)
    for corpus in report.corpora:
        header, rows = repo_rows(report, corpus)
        if rows:
            per_repo = Table(title=f"Per repository ({corpus} files; Acc@1 · Acc@5 in %, MRR)")
            for col in header:
                per_repo.add_column(col, justify="left" if col == "repo" else "right")
            for row in rows:
                per_repo.add_row(*map(plain, row))
            console.print(per_repo)
    ablation = ablation_rows(report)
    if ablation:
        table = Table(title="Ablation: each variant minus the full pipeline (paired, same tasks)")
        for col in ABLATION_HEADER:
            table.add_column(col)
        for row in ablation:
            table.add_row(*map(plain, row))
        console.print(table)
    unindexed = [r for r in report.runs if r.gold_not_indexed]
    for run in unindexed[:1]:
        console.print(f"note: {run.gold_not_indexed} task(s) have a gold file outside the indexed corpus "
                      "(counted as misses)")


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def report_markdown(report: EvalReport) -> str:
    """The report's tables as Markdown (for data/eval/ and the README)."""
    parts = [
        f"# ctx eval: {Path(report.tasks_file).name}",
        "",
        f"{report.tasks} tasks; profiles {', '.join(report.profiles)}; corpus globs "
        f"{', '.join(report.include)}; query: {'the title line alone' if report.query == 'title' else 'the whole issue text'}; "
        f"ctxlake {report.ctxlake_version}; {report.created_at}; {report.seconds:.0f} s.",
        "Acc@k and Recall@20 in %, MRR in 0..1; intervals are 95% percentile bootstraps over tasks.",
        "",
        _md_table(SUMMARY_HEADER, summary_rows(report)),
    ]
    for corpus in report.corpora:
        header, rows = repo_rows(report, corpus)
        if rows:
            parts += ["", f"## Per repository ({corpus} files)", "", _md_table(header, rows)]
    ablation = ablation_rows(report)
    if ablation:
        parts += ["", "## Ablation", "",
                  "Each variant minus the full pipeline on the same tasks (paired bootstrap). "
                  "`plain-bm25` switches every technique off; `-X` switches off X alone.", "",
                  _md_table(ABLATION_HEADER, ablation)]
    return "\n".join(parts) + "\n"


def draw_chart(report: EvalReport, path: Path) -> None:
    """A grouped bar chart of Acc@k per (profile, mode), one panel per corpus, full pipeline."""
    _require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    ks = ("acc@1", "acc@3", "acc@5", "acc@10")
    corpora = report.corpora
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 4.2), squeeze=False, sharey=True)
    for ax, corpus in zip(axes[0], corpora, strict=True):
        runs = [r for r in report.runs if r.corpus == corpus and r.variant in ("full", "plain-bm25")
                and not (r.variant == "plain-bm25" and r.mode != "keyword")]
        width = 0.8 / max(len(runs), 1)
        for i, run in enumerate(runs):
            means = [100 * float(run.overall[k]["mean"]) for k in ks]
            lows = [m - 100 * float(run.overall[k]["low"]) for m, k in zip(means, ks, strict=True)]
            highs = [100 * float(run.overall[k]["high"]) - m for m, k in zip(means, ks, strict=True)]
            label = "plain BM25" if run.variant == "plain-bm25" else f"{run.profile} / {run.mode}"
            xs = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(ks))]
            ax.bar(xs, means, width, yerr=[lows, highs], capsize=2, label=label)
        ax.set_xticks(range(len(ks)), [k.replace("acc", "Acc") for k in ks])
        ax.set_title(f"{corpus} files (n={runs[0].n if runs else 0})")
        ax.set_ylim(0, 100)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("% of tasks with the gold file in the top k")
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.suptitle(f"ctx eval: {Path(report.tasks_file).name} ({report.tasks} tasks), 95% CIs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
