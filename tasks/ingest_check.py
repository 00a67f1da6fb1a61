"""Freshness of conversation memory: would `ctx run ingest` do anything? Decided from saved positions, without Prefect."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ctxlake.schemas.config import Settings
from ctxlake.tasks.knowledge import manifest_changed
from ctxlake.tasks.lake import IndexState
from ctxlake.tasks.scrape import Plan, ScrapeState, plan


@dataclass
class IngestCheck:
    up_to_date: bool
    reason: str
    plan: Plan
    state: ScrapeState
    knowledge_changed: bool
    seconds: float


def check(settings: Settings, roots: dict[str, list[Path]], model_id: str) -> IngestCheck:
    """Stat every store file and knowledge file against what the last run saved; open none."""
    started = time.perf_counter()
    scrape_state = ScrapeState.load(settings.memory_dir)
    found = plan(roots, scrape_state)
    knowledge = manifest_changed(settings.lake_dir, settings.knowledge_dir, model_id)
    state = IndexState.read(settings.memory_dir)
    if state is None:
        reason = "nothing ingested yet"
    elif not state.clean:
        reason = "the last run did not finish"
    elif state.model_id != model_id:
        reason = f"vectors were made with {state.model_id}, the configuration says {model_id}"
    elif found.changed_files:
        reason = f"{found.changed_files} log file(s) changed"
    elif knowledge:
        reason = "knowledge files changed"
    elif state.pending_vectors:
        reason = f"{state.pending_vectors} row(s) still to embed"
    else:
        return IngestCheck(True, "up to date", found, scrape_state, False, time.perf_counter() - started)
    return IngestCheck(False, reason, found, scrape_state, knowledge, time.perf_counter() - started)
