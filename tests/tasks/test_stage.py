"""Stages: Prefect task runs inside a flow run, plain calls (with the same retries) elsewhere."""

from __future__ import annotations

import pytest
from prefect import flow
from prefect.context import TaskRunContext

from ctxlake.tasks.stage import in_flow_run, stage

calls: list[str] = []


@stage("probe")
def probe(x: int) -> tuple[int, bool]:
    return x * 2, TaskRunContext.get() is not None


@stage("flaky", retries=2)
def flaky(fail_times: int) -> int:
    calls.append("try")
    if len(calls) <= fail_times:
        raise OSError("transient")
    return len(calls)


def test_outside_a_flow_a_stage_is_a_plain_call() -> None:
    assert not in_flow_run()
    assert probe(3) == (6, False)


def test_inside_a_flow_a_stage_is_a_task_run(prefect_server: None) -> None:
    @flow
    def wrapper() -> tuple[int, bool]:
        assert in_flow_run()
        return probe(4)

    assert wrapper() == (8, True)


def test_plain_calls_keep_the_stage_retries() -> None:
    calls.clear()
    assert flaky(2) == 3  # two failures, then the third try answers
    calls.clear()
    with pytest.raises(OSError, match="transient"):
        flaky(3)
    assert len(calls) == 3  # one try and two retries, no more
