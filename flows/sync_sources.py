"""Pipeline: fetch (git shallow clone/fetch | llms.txt crawl | local folder) -> index_code(source) -> record SOURCES row."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prefect import flow

from ctxlake.errors import CtxError
from ctxlake.flows.index_code import index_code
from ctxlake.schemas.config import Settings
from ctxlake.schemas.sources import SourceSpec
from ctxlake.tasks import freshness
from ctxlake.tasks.progress import reporter
from ctxlake.tasks.source_store import (
    SyncReport,
    read_sources,
    record_failure,
    record_source,
    source_row,
)
from ctxlake.tasks.sources import Fetched, check_access, fetch_git, fetch_local, storage_dir
from ctxlake.tasks.webdocs import fetch_web


@flow(name="sync-sources", validate_parameters=False, log_prints=False)
def sync_sources(settings: Settings, specs: list[SourceSpec]) -> list[SyncReport]:
    """Fetch each source and index it into the lake under its own `source`; a failure is
    recorded for that source and the others go on."""
    previous = read_sources(settings.lake_dir)
    return [_sync_one(settings, spec, previous.get(spec.name)) for spec in specs]


def _fetch(settings: Settings, spec: SourceSpec) -> Fetched:
    # Every sync (add, update, the schedule) passes here: no system folder, nothing outside the
    # project that a cloned sources.toml declares until the user trusts it.
    check_access(spec, settings.root, settings.home)
    folder = storage_dir(settings.home, spec)
    if spec.type == "git":
        return fetch_git(spec, folder, settings.sources, settings.root)
    if spec.type == "web":
        return fetch_web(spec, folder, settings.sources, settings.root)
    return fetch_local(spec, settings.root)


def _sync_one(settings: Settings, spec: SourceSpec, previous: dict[str, Any] | None) -> SyncReport:
    started = time.perf_counter()
    progress = reporter()
    report = SyncReport(spec.name, spec.type, spec.origin, "failed")
    declared = {"type": spec.type, "origin": spec.origin, "ref": spec.ref, "paths": spec.paths,
                "excludes": spec.exclude}
    progress.start(f"fetch:{spec.name}", None, f"fetch {spec.name}")
    try:
        fetched = _fetch(settings, spec)
        progress.finish(f"fetch:{spec.name}")
        source_settings = settings.model_copy(update={"index": spec.index_settings(settings.index)})
        # Nothing fetched and nothing changed on disk: skip the index run (and its flow start).
        fresh = freshness.check(settings.lake_dir, spec.name, fetched.root, source_settings.index)
        if fetched.changed or not fresh.up_to_date:
            report.index = index_code(source_settings, source=spec.name, root=fetched.root).as_dict()
            report.changed = True
        report.status, report.message = fetched.status, fetched.message
        report.resolved, report.ref_kind, report.root = fetched.resolved, fetched.ref_kind, str(fetched.root)
        record_source(settings.lake_dir, source_row(
            spec.name, previous, **declared, ref_kind=fetched.ref_kind, resolved=fetched.resolved,
            root=str(fetched.root), updated_at=datetime.now(UTC), status=fetched.status,
            message=fetched.message,
        ))
    except CtxError as exc:
        progress.finish(f"fetch:{spec.name}")
        record_failure(settings.lake_dir, spec, previous, exc, report)
    report.seconds = round(time.perf_counter() - started, 3)
    return report
