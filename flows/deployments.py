"""The service's scheduled flows as Prefect deployments: which flow, which parameters, which schedule.

The pipeline flows take a Settings object, which a deployment cannot carry (its parameters are JSON),
so each deployment runs a thin flow that takes a project root, loads its settings, and calls the
pipeline flow as a subflow. Only sequencing here; the Runner and server live in serve/service/.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

from prefect import flow
from prefect.deployments.runner import RunnerDeployment

from ctxlake.schemas.config import Settings, load_settings

INGEST = "ingest_conversations"
SYNC = "sync_sources"
INDEX_PREFIX = "index_code"


@flow(name="scheduled-ingest-conversations", log_prints=False)
def scheduled_ingest(root: str) -> dict[str, Any]:
    """Read new agent log lines into the memory lake (the same flow `ctx memory ingest` runs)."""
    from ctxlake.flows.ingest_conversations import ingest_conversations
    from ctxlake.tasks.scrape import resolve_roots

    settings = load_settings(Path(root))
    roots = resolve_roots(settings.memory, Path.home())
    return ingest_conversations(settings, roots).as_dict()


@flow(name="scheduled-sync-sources", log_prints=False)
def scheduled_sync(root: str) -> list[dict[str, Any]]:
    """Fetch the project's declared sources again and re-index what changed."""
    from dataclasses import asdict

    from ctxlake.flows.sync_sources import sync_sources
    from ctxlake.schemas.sources import load_registry
    from ctxlake.tasks.lake import WriterLock

    settings = load_settings(Path(root))
    specs = list(load_registry(settings.root).values())
    if not specs:
        return []
    # A scheduled run waits for an interactive `ctx update` rather than failing at once.
    lock = WriterLock(settings.lake_dir, purpose="scheduled sync").acquire(wait_s=600)
    try:
        return [asdict(r) for r in sync_sources(settings, specs)]
    finally:
        lock.release()


@flow(name="scheduled-index-code", log_prints=False)
def scheduled_index(root: str) -> dict[str, Any]:
    """Consistency run: re-index the project incrementally (a no-op when nothing changed)."""
    from dataclasses import asdict

    from ctxlake.flows.index_code import index_code
    from ctxlake.tasks.lake import WriterLock

    settings = load_settings(Path(root))
    lock = WriterLock(settings.lake_dir, purpose="scheduled index").acquire(wait_s=600)
    try:
        return asdict(index_code(settings))
    finally:
        lock.release()


def index_name(root: Path) -> str:
    """One deployment per project: readable and unique (two checkouts may share a folder name)."""
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:8]
    return f"{INDEX_PREFIX}-{root.name}-{digest}"


def service_deployments(settings: Settings) -> list[RunnerDeployment]:
    """The always-present deployments, scheduled as `settings.schedule` says."""
    sched = settings.schedule
    root = str(settings.root)
    # to_deployment is sync-or-async by caller; called outside a loop it returns the deployment.
    return [
        cast(RunnerDeployment, scheduled_ingest.to_deployment(
            INGEST, interval=timedelta(seconds=sched.ingest_every_s), parameters={"root": root})),
        cast(RunnerDeployment, scheduled_sync.to_deployment(SYNC, cron=sched.sync_cron, parameters={"root": root})),
    ]


def project_deployment(root: Path, settings: Settings) -> RunnerDeployment:
    """The periodic consistency run of one registered project."""
    return cast(RunnerDeployment, scheduled_index.to_deployment(
        index_name(root), interval=timedelta(seconds=settings.schedule.index_every_s),
        parameters={"root": str(root.resolve())}))
