"""Read and change the service's schedules through its Prefect server's API (used by the CLI and the service)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from ctxlake.errors import InputError
from ctxlake.schemas.config import check_cron

_EVERY = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# Each run is a process of its own (imports alone take seconds): a shorter interval would keep the
# service busy starting runs, and with two parallel runs, queue them without end.
MIN_EVERY_S = 60
MAX_EVERY_S = 366 * 86400  # a year: longer is a pause, which has its own command


def parse_every(text: str) -> timedelta:
    """'90s', '10m', '2h', '1d' (a bare number is seconds); at least MIN_EVERY_S."""
    match = _EVERY.match(text.strip().lower())
    if not match or float(match.group(1)) <= 0:
        raise InputError(f"invalid interval {text!r}", hint="use e.g. 90s, 10m, 2h, 1d")
    seconds = float(match.group(1)) * _UNIT_S[match.group(2) or "s"]
    if seconds > MAX_EVERY_S:  # timedelta overflowed past ~2.7 million years (an OverflowError traceback)
        raise InputError(f"interval {text!r} is too long: at most {MAX_EVERY_S // 86400} days",
                         hint="use e.g. 1d or 7d; `ctx schedule pause` stops a schedule")
    every = timedelta(seconds=seconds)
    if every.total_seconds() < MIN_EVERY_S:
        raise InputError(f"interval {text!r} is too short: a schedule runs at most once every {MIN_EVERY_S} s",
                         hint="use 1m or more; the file watchers already catch edits as they happen")
    return every


def parse_cron(text: str) -> str:
    try:
        return check_cron(text.strip())
    except ValueError as exc:
        raise InputError(str(exc), hint='five fields, e.g. "0 3 * * *" (03:00 daily)') from exc


def _iso(value: datetime | None) -> str | None:
    return value.astimezone(UTC).isoformat() if value is not None else None


async def _read(api_url: str) -> list[dict[str, Any]]:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.schedules import CronSchedule, IntervalSchedule
    from prefect.client.schemas.sorting import FlowRunSort

    scheduled_only = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])))
    finished = FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(
        any_=[StateType.COMPLETED, StateType.FAILED, StateType.CRASHED, StateType.CANCELLED])))

    async def one(client: Any, dep: Any) -> dict[str, Any]:
        by_dep = DeploymentFilter(id=DeploymentFilterId(any_=[dep.id]))
        scheduled, done = await asyncio.gather(
            client.read_flow_runs(deployment_filter=by_dep, sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=1,
                                  flow_run_filter=scheduled_only),
            client.read_flow_runs(deployment_filter=by_dep, sort=FlowRunSort.END_TIME_DESC, limit=1,
                                  flow_run_filter=finished))
        kind, spec = "none", ""
        if dep.schedules:
            sched = dep.schedules[0].schedule
            if isinstance(sched, IntervalSchedule):
                kind, spec = "interval", f"{int(sched.interval.total_seconds())}s"
            elif isinstance(sched, CronSchedule):
                kind, spec = "cron", sched.cron
        last: dict[str, Any] | None = None
        if done:
            run = done[0]
            state = run.state
            error = state.message if state is not None and state.type != StateType.COMPLETED else None
            last = {"state": state.type.value if state else None, "start": _iso(run.start_time),
                    "end": _iso(run.end_time), "error": error}
        next_run = scheduled[0].expected_start_time if scheduled and not dep.paused else None
        return {"name": dep.name, "kind": kind, "spec": spec, "paused": bool(dep.paused),
                "next_run": _iso(next_run), "last_run": last}

    async with PrefectClient(api_url) as client:
        # Every deployment's two reads at once: one round trip's wait instead of 1 + 2 per deployment.
        out = list(await asyncio.gather(*(one(client, dep) for dep in await client.read_deployments())))
    return sorted(out, key=lambda s: str(s["name"]))


def read_schedules(api_url: str) -> list[dict[str, Any]]:
    """name, kind (interval/cron), spec, paused, next_run (iso), last_run {state, start, end, error}."""
    return _in_new_loop(_read(api_url))


async def _deployment(client: Any, name: str) -> Any:
    for dep in await client.read_deployments():
        if dep.name == name:
            return dep
    known = ", ".join(sorted(d.name for d in await client.read_deployments()))
    raise InputError(f"unknown schedule {name!r}", hint=f"known: {known or 'none'}")


async def _set(api_url: str, name: str, every: timedelta | None, cron: str | None) -> None:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.schedules import SCHEDULE_TYPES, CronSchedule, IntervalSchedule

    schedule: SCHEDULE_TYPES = (
        IntervalSchedule(interval=every) if every is not None else CronSchedule(cron=str(cron)))
    async with PrefectClient(api_url) as client:
        dep = await _deployment(client, name)
        if dep.schedules:
            await client.update_deployment_schedule(dep.id, dep.schedules[0].id, schedule=schedule)
        else:
            await client.create_deployment_schedules(dep.id, [(schedule, True)])
        # Runs already planned under the old schedule would still fire: drop them.
        await _drop_planned(client, dep.id)


async def _drop_planned(client: Any, deployment_id: Any) -> None:
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    planned = await client.read_flow_runs(
        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
        flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
            type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
    for run in planned:
        await client.delete_flow_run(run.id)


def set_schedule(api_url: str, name: str, every: str | None = None, cron: str | None = None) -> None:
    if (every is None) == (cron is None):
        raise InputError("give exactly one of --every and --cron")
    _in_new_loop(_set(api_url, name, parse_every(every) if every else None, parse_cron(cron) if cron else None))


async def _pause(api_url: str, name: str, paused: bool) -> None:
    from prefect.client.orchestration import PrefectClient

    async with PrefectClient(api_url) as client:
        dep = await _deployment(client, name)
        if paused:
            await client.pause_deployment(dep.id)
            await _drop_planned(client, dep.id)  # planned runs would still be picked up
        else:
            await client.resume_deployment(dep.id)


async def _drop_missed(api_url: str, before: datetime) -> int:
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    dropped = 0
    async with PrefectClient(api_url) as client:
        while True:
            missed = await client.read_flow_runs(limit=200, flow_run_filter=FlowRunFilter(
                expected_start_time=FlowRunFilterExpectedStartTime(before_=before),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
            for run in missed:
                await client.delete_flow_run(run.id)
            dropped += len(missed)
            if len(missed) < 200:
                return dropped


def drop_missed_runs(api_url: str, before: datetime) -> int:
    """Delete the runs planned to start before `before` that never started (the service was
    down); how many. Left in place, a restarted service would run them all at once."""
    result: int = _in_new_loop(_drop_missed(api_url, before))
    return result


def pause_schedule(api_url: str, name: str, paused: bool = True) -> None:
    _in_new_loop(_pause(api_url, name, paused))


def _in_new_loop(coro: Any) -> Any:
    # The service calls these from threads that may already run a loop (the runner's own).
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:
            error.append(exc)

    import threading

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
