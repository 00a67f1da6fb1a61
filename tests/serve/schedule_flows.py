"""Flows the orchestrator tests deploy: one that fails every time, one that succeeds fast."""

from __future__ import annotations

from prefect import flow


@flow(name="test-always-fails")
def always_fails() -> None:
    raise RuntimeError("deliberate failure for the back-off test")


@flow(name="test-quick")
def quick(marker: str) -> str:
    from pathlib import Path

    with Path(marker).open("a", encoding="utf-8") as out:
        out.write("ran\n")
    return marker
