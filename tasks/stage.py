"""`@stage`: a Prefect task that imports Prefect only when a flow first calls it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Stage(Generic[P, R]):
    """A pipeline stage. Called inside a flow it runs as a Prefect task run; `.fn` is the plain
    function, which the read side (CLI queries, the MCP server) uses so that it never pays
    Prefect's 1.7 s import or starts its temporary API server.
    """

    def __init__(self, fn: Callable[P, R], name: str, retries: int) -> None:
        self.fn = fn
        self.name = name
        self.retries = retries
        self._task: Any = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if self._task is None:
            from prefect import task
            from prefect.cache_policies import NO_CACHE

            # Stages pass Arrow tables and open handles: never hash or persist them as results.
            self._task = task(
                name=self.name,
                cache_policy=NO_CACHE,
                persist_result=False,
                retries=self.retries,
                retry_delay_seconds=1 if self.retries else 0,
            )(self.fn)
        from prefect.utilities.annotations import quote

        # Stages get concrete values, never futures; without quote() Prefect walks every argument
        # looking for some, which for a Merkle tree of django's 5,340 files cost 0.8 s a call
        # (most of watch mode's edit latency). Quoted arguments reach the function unwrapped.
        quoted_args = [quote(a) for a in args]
        quoted_kwargs = {k: quote(v) for k, v in kwargs.items()}
        result: R = self._task(*quoted_args, **quoted_kwargs)
        return result


def stage(name: str, *, retries: int = 0) -> Callable[[Callable[P, R]], Stage[P, R]]:
    """Declare a stage; `retries` only for stages whose failures are transient I/O."""

    def wrap(fn: Callable[P, R]) -> Stage[P, R]:
        return Stage(fn, name, retries)

    return wrap
