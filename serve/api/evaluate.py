"""`ctx eval`: file-localisation tasks -> materialised trees -> per-profile lakes -> ranked files -> metrics."""

from __future__ import annotations

import dataclasses
import hashlib
import platform
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ctxlake import __version__
from ctxlake.errors import CtxError, InputError
from ctxlake.schemas.config import IndexSettings, Settings
from ctxlake.schemas.tables import PROJECT_SOURCE
from ctxlake.serve.api.models import SearchMode
from ctxlake.serve.api.query_terms import query_title
from ctxlake.serve.api.ranking import VARIANTS, RankOptions, is_test_path
from ctxlake.tasks.evaluate import (
    EvalTask,
    Materialised,
    git_dir_for,
    load_tasks,
    materialise,
    resolve_commit,
    slug,
    tree_dir,
)
from ctxlake.tasks.lake import WriterLock
from ctxlake.tasks.metrics import METRICS, Estimate, first_gold_rank, score_ranking, summarise
from ctxlake.tasks.store import FTS_TAG

CORPORA = ("all", "non-test")
MODES: tuple[SearchMode, ...] = ("keyword", "semantic", "hybrid")
DEFAULT_INCLUDE = ["*.py"]
RANKED_FILES = 20  # files kept per task: enough for Recall@20
FULL = "full"
PLAIN = "plain-bm25"
CHUNK_SEARCH = "ctx-search"  # the chunk ranking of `ctx search`, collapsed to files
CHUNK_SEARCH_HITS = 150
LOCK_WAIT_S = 3600.0  # another eval indexing the same tree: wait for it (django takes a minute)


class IndexRecord(BaseModel):
    """How one task's lake was built (or found up to date)."""

    instance_id: str
    profile: str
    model_id: str
    files: int = 0
    chunks: int = 0
    embedded: int = 0
    vectors_from_cache: int = 0
    seconds: float = 0.0
    reused: bool = Field(False, description="the lake was already up to date; nothing was indexed")
    missing_files: list[str] = Field(default_factory=list, description="files whose content the mirror lacks")


class TaskResult(BaseModel):
    instance_id: str
    repo: str
    profile: str
    mode: SearchMode
    corpus: str
    variant: str
    gold: list[str]
    gold_indexed: bool = Field(description="every gold file is in the searched corpus")
    rank: int | None = Field(description="1-based rank of the first gold file; null when not ranked")
    ranked: list[str] = Field(description="the top files, best first")
    metrics: dict[str, float]
    took_ms: float = Field(description="retrieval for this corpus (shared by its modes and variants) plus this fusion")


class RunSummary(BaseModel):
    """One (profile, mode, corpus, variant) over all tasks: means with bootstrap 95% CIs."""

    profile: str
    mode: SearchMode
    corpus: str
    variant: str
    n: int
    gold_not_indexed: int
    overall: dict[str, dict[str, float | int]]
    per_repo: dict[str, dict[str, float]]


class EvalReport(BaseModel):
    created_at: str
    ctxlake_version: str
    python: str
    tasks_file: str = Field(description="the task file as given on the command line")
    tasks_sha256: str = Field(description="of the task file's bytes: which version of a dev set was run")
    tasks: int
    skipped_lines: list[str]
    failed_tasks: list[str] = Field(default_factory=list, description="tasks whose index failed: left out of the scores")
    profiles: list[str]
    modes: list[SearchMode]
    corpora: list[str]
    include: list[str]
    query: str = Field("full", description="full: the whole issue text is the query; title: its first line only")
    options: dict[str, Any] = Field(description="the ranking options of the `full` variant")
    runs: list[RunSummary]
    index: list[IndexRecord]
    results: list[TaskResult]
    seconds: float


@dataclasses.dataclass
class EvalPlan:
    tasks_file: Path
    modes: Sequence[SearchMode] = MODES
    profiles: Sequence[str] = ()  # empty: the configured embed.model
    mirrors: Sequence[Path] = ()
    corpora: Sequence[str] = CORPORA
    include: Sequence[str] = tuple(DEFAULT_INCLUDE)
    options: RankOptions = dataclasses.field(default_factory=RankOptions)
    ablate: bool = False
    only: Sequence[str] = ()
    limit: int | None = None
    query: str = "full"  # or "title": the first line alone, what an agent types


def task_query(task: EvalTask, part: str) -> str:
    """The query a task is scored with: its whole text, or only its title line."""
    if part == "title":
        return query_title(task.query) or task.query.strip().split("\n", 1)[0]
    return task.query


Log = Callable[[str], None]


def variants(plan: EvalPlan) -> dict[str, RankOptions]:
    """The ranking variants to score: the full pipeline, and with --ablate plain BM25 plus each
    technique switched off (`-X`) and each tried-and-dropped one switched on (`+X`)."""
    out = {FULL: plan.options}
    if plan.ablate:
        out[PLAIN] = plan.options.plain()
        out.update({name: plan.options.variant(name) for name in VARIANTS})
    return out


def lake_settings(base: Settings, lake_root: Path, profile: str | None, include: Sequence[str]) -> Settings:
    """Settings for one task's lake: the user's, with this profile and the eval's corpus globs."""
    embed = base.embed if profile is None else base.embed.model_copy(update={"model": profile})
    return base.model_copy(update={
        "root": lake_root,
        "index": IndexSettings(include=list(include), max_file_bytes=base.index.max_file_bytes),
        "embed": embed,
    })


def prepare_tree(task: EvalTask, base: Settings, mirrors: Sequence[Path]) -> Materialised:
    """The task's repository at its commit, as a folder (extracted once into the eval cache);
    a local folder without a commit is indexed as it is."""
    if task.base_commit is None:
        return Materialised(Path(task.source), [], [])
    git_dir = git_dir_for(task, mirrors)
    commit = resolve_commit(git_dir, task.base_commit)
    return materialise.fn(git_dir, commit, tree_dir(base.home / "eval" / "trees", task, commit))


def lake_name(task: EvalTask, tree: Path) -> str:
    """The lake folder of a task's tree: repo@commit, or repo@<hash of the path> for a local folder."""
    if task.base_commit is not None:
        return tree.name
    import xxhash

    return f"{slug(task.repo)}@local-{xxhash.xxh3_64_hexdigest(str(tree.resolve()).encode())[:10]}"


def index_tree(settings: Settings, tree: Path, embed: bool, task: EvalTask, model_id: str) -> IndexRecord:
    """Bring the task's lake up to date with its tree; a current lake starts no flow at all."""

    record = IndexRecord(instance_id=task.instance_id, profile=settings.embed.model, model_id=model_id)
    # Evals share the lake cache: a second one indexing the same tree would append every row
    # again. It waits here, then finds the lake current.
    lock = WriterLock(settings.lake_dir, purpose=f"ctx eval ({task.instance_id})").acquire(wait_s=LOCK_WAIT_S)
    try:
        return _index_locked(settings, tree, embed, record, model_id)
    finally:
        lock.release()


def _index_locked(settings: Settings, tree: Path, embed: bool, record: IndexRecord, model_id: str) -> IndexRecord:
    from ctxlake.tasks import freshness
    from ctxlake.tasks.lake import IndexState

    state = IndexState.read(settings.lake_dir)
    fresh = freshness.check(settings.lake_dir, PROJECT_SOURCE, tree, settings.index)
    # A keyword-only eval never embeds: vectors still to come do not make its lake stale.
    current = fresh.up_to_date or (fresh.vectors_only and not embed)
    if (current and state is not None and state.model_id == model_id
            and state.fts == FTS_TAG and not (embed and state.pending_vectors)):
        record.reused = True
        record.files = int((state.last_run or {}).get("files_seen", 0))
        return record
    from ctxlake.flows.index_code import index_code

    settings.root.mkdir(parents=True, exist_ok=True)
    report = index_code(settings, root=tree, embed=embed)
    record.files, record.chunks = report.files_seen, report.chunks_inserted
    record.embedded, record.vectors_from_cache = report.embedded, report.vectors_from_cache
    record.seconds = round(report.seconds, 2)
    return record


def add_history(settings: Settings, task: EvalTask, mirrors: Sequence[Path]) -> int:
    """Give a task's lake the co-change table of its repository's history up to the base commit
    (never past it: the fix and everything after stay unseen). A materialised tree has no .git, so
    the history is read from the mirror. Returns the commits read (0: already there)."""
    from ctxlake.tasks.cochange import update_cochange
    from ctxlake.tasks.lake import connect

    if task.base_commit is None:
        return 0
    git_dir = git_dir_for(task, mirrors)
    commit = resolve_commit(git_dir, task.base_commit)
    lock = WriterLock(settings.lake_dir, purpose=f"ctx eval history ({task.instance_id})").acquire(wait_s=LOCK_WAIT_S)
    try:
        return update_cochange(connect(settings.lake_dir), settings.lake_dir, git_dir, PROJECT_SOURCE, rev=commit)
    finally:
        lock.release()


def run_eval(base: Settings, plan: EvalPlan, log: Log | None = None) -> EvalReport:
    """Run every task of the plan for each profile, mode, corpus and variant; score and summarise."""
    from ctxlake.serve.api import file_search
    from ctxlake.serve.api.code_lake import Lake
    from ctxlake.serve.api.ranked_lists import build_filter

    started = time.perf_counter()
    say = log or (lambda _msg: None)
    bad_modes = [m for m in plan.modes if m not in MODES]
    if bad_modes:
        raise InputError(f"unknown mode(s) {', '.join(bad_modes)}", hint="keyword, semantic, hybrid")
    bad_corpora = [c for c in plan.corpora if c not in CORPORA]
    if bad_corpora:
        raise InputError(f"unknown corpus {', '.join(bad_corpora)}", hint="all, non-test")
    task_file = load_tasks(plan.tasks_file, limit=plan.limit, only=plan.only or None)
    for line in task_file.skipped:
        say(f"skipped {line}")
    tasks = task_file.tasks
    # Every repository and commit is checked before the first (long) index starts.
    for task in tasks:
        if task.base_commit is not None:
            resolve_commit(git_dir_for(task, plan.mirrors), task.base_commit)
    profiles: list[str | None] = list(plan.profiles) or [None]
    need_vectors = any(m in ("semantic", "hybrid") for m in plan.modes)
    ranking = variants(plan)
    results: list[TaskResult] = []
    index_records: list[IndexRecord] = []
    failed: list[str] = []
    from ctxlake.tasks.embedders import make_embedder

    for profile in profiles:
        label = profile or base.embed.model
        probe = lake_settings(base, base.home, profile, plan.include)
        # One query embedder per profile, shared by every task's lake (loading it is the slow part).
        embedder = make_embedder(probe.embed, probe.models_dir)
        for number, task in enumerate(tasks, start=1):
            materialised = prepare_tree(task, base, plan.mirrors)
            tree = materialised.tree
            lake_root = base.home / "eval" / "lakes" / slug(embedder.model_id) / lake_name(task, tree)
            settings = lake_settings(base, lake_root, profile, plan.include)
            try:
                record = index_tree(settings, tree, need_vectors, task, embedder.model_id)
                if task.base_commit is not None and (plan.ablate or plan.options.cochange_neighbours):
                    add_history(settings, task, plan.mirrors)
            except CtxError as exc:  # one broken lake must not cost the other tasks' scores
                failed.append(f"{task.instance_id}: {exc}")
                say(f"[{label} {number}/{len(tasks)}] {task.instance_id}: failed, left out of the scores: {exc}")
                continue
            record.missing_files = materialised.missing[:100]
            if materialised.missing:
                say(f"{task.instance_id}: {len(materialised.missing)} file(s) absent from the mirror, "
                    f"e.g. {materialised.missing[0]}")
            index_records.append(record)
            lake = Lake(settings, embedder=embedder)
            ranks: list[str] = []
            for corpus in plan.corpora:
                gold = [g for g in task.gold_files if corpus == "all" or not is_test_path(g)]
                if not gold:
                    continue  # a task about test files has no answer in the non-test corpus
                where = build_filter(exclude_tests=corpus == "non-test")
                indexed = {path for _, path in lake.catalog(where).files}
                cache: dict[tuple[bool, bool], tuple[Any, float]] = {}
                for variant, options in ranking.items():
                    # One retrieval per corpus serves every mode and variant that differs only in
                    # fusion; these two options change what is retrieved.
                    retrieval = (options.squeeze_logs, options.semantic_title)
                    if retrieval not in cache:
                        t0 = time.perf_counter()
                        mode_all: SearchMode = "hybrid" if need_vectors else "keyword"
                        gathered = file_search.file_evidence(
                            lake, task_query(task, plan.query), mode_all, where, dataclasses.replace(
                                plan.options, squeeze_logs=options.squeeze_logs, semantic_title=options.semantic_title,
                                import_neighbours=plan.options.import_neighbours or plan.ablate,
                                prose_list=plan.options.prose_list or plan.ablate,
                                title_symbols=plan.options.title_symbols or plan.ablate,
                                title_stems=plan.options.title_stems or plan.ablate,
                                typo_stems=plan.options.typo_stems or plan.ablate,
                                title_calls=plan.options.title_calls or plan.ablate,
                                cochange_neighbours=plan.options.cochange_neighbours or plan.ablate))
                        cache[retrieval] = (gathered, time.perf_counter() - t0)
                    evidence, gather_s = cache[retrieval]
                    t0 = time.perf_counter() - gather_s
                    for mode in plan.modes:
                        fused = file_search.fuse_files(evidence.for_mode(mode), options)
                        ranked = [path for (_, path), _ in fused[:RANKED_FILES]]
                        results.append(TaskResult(
                            instance_id=task.instance_id, repo=task.repo, profile=label, mode=mode,
                            corpus=corpus, variant=variant, gold=gold,
                            gold_indexed=all(g in indexed for g in gold),
                            rank=first_gold_rank(ranked, gold), ranked=ranked,
                            metrics=score_ranking(ranked, gold),
                            took_ms=round((time.perf_counter() - t0) * 1000, 1),
                        ))
                        if variant == FULL:
                            ranks.append(f"{mode}/{corpus}={results[-1].rank or '-'}")
                if plan.ablate:
                    results += chunk_search_results(lake, task, plan.modes, corpus, gold, indexed, label,
                                                    plan.query)
            what = "reused" if record.reused else f"indexed in {record.seconds:.1f} s"
            say(f"[{label} {number}/{len(tasks)}] {task.instance_id}: {what}; gold rank {' '.join(ranks)}")
    return EvalReport(
        created_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        ctxlake_version=__version__,
        python=f"{platform.python_implementation()} {sys.version.split()[0]}",
        tasks_file=str(plan.tasks_file),
        tasks_sha256=hashlib.sha256(plan.tasks_file.read_bytes()).hexdigest(),
        tasks=len(tasks),
        skipped_lines=task_file.skipped,
        failed_tasks=failed,
        profiles=[p or base.embed.model for p in profiles],
        modes=list(plan.modes),
        corpora=list(plan.corpora),
        include=list(plan.include),
        query=plan.query,
        options=dataclasses.asdict(plan.options),
        runs=summarise_runs(results),
        index=index_records,
        results=results,
        seconds=round(time.perf_counter() - started, 1),
    )


def chunk_search_results(
    lake: Any, task: EvalTask, modes: Sequence[SearchMode], corpus: str, gold: list[str],
    indexed: set[str], profile: str, query: str = "full",
) -> list[TaskResult]:
    """`ctx search` itself (chunks, as an agent sees them) collapsed to files in order of first hit."""
    from ctxlake.serve.api.code_search import search

    out = []
    for mode in modes:
        t0 = time.perf_counter()
        hits = search(lake, task_query(task, query), mode=mode, limit=CHUNK_SEARCH_HITS, check_stale=False,
                      exclude_tests=corpus == "non-test").hits
        ranked = list(dict.fromkeys(h.path for h in hits))[:RANKED_FILES]
        out.append(TaskResult(
            instance_id=task.instance_id, repo=task.repo, profile=profile, mode=mode, corpus=corpus,
            variant=CHUNK_SEARCH, gold=gold, gold_indexed=all(g in indexed for g in gold),
            rank=first_gold_rank(ranked, gold), ranked=ranked, metrics=score_ranking(ranked, gold),
            took_ms=round((time.perf_counter() - t0) * 1000, 1),
        ))
    return out


def summarise_runs(results: Sequence[TaskResult]) -> list[RunSummary]:
    """Task results -> one summary per (profile, mode, corpus, variant), overall and per repository."""
    groups: dict[tuple[str, SearchMode, str, str], list[TaskResult]] = defaultdict(list)
    for r in results:
        groups[(r.profile, r.mode, r.corpus, r.variant)].append(r)
    out: list[RunSummary] = []
    for (profile, mode, corpus, variant), rows in groups.items():
        overall: dict[str, Estimate] = summarise([r.metrics for r in rows])
        by_repo: dict[str, list[TaskResult]] = defaultdict(list)
        for r in rows:
            by_repo[r.repo].append(r)
        per_repo = {
            repo: {m: sum(r.metrics[m] for r in items) / len(items) for m in METRICS} | {"n": len(items)}
            for repo, items in sorted(by_repo.items())
        }
        out.append(RunSummary(
            profile=profile, mode=mode, corpus=corpus, variant=variant, n=len(rows),
            gold_not_indexed=sum(not r.gold_indexed for r in rows),
            overall={m: e.as_dict() for m, e in overall.items()}, per_repo=per_repo,
        ))
    return out
