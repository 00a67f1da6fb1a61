"""`@stage`: a Prefect task that imports Prefect only when a flow first calls it."""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


class Stage(Generic[P, R]):
    """A pipeline stage. Called inside a flow run it runs as a Prefect task run; called anywhere
    else (the service's watchers, the read side) it is the plain function, which never pays
    Prefect's 1.7 s import or starts its temporary API server. `.fn` is that function too.
    """

    def __init__(self, fn: Callable[P, R], name: str, retries: int) -> None:
        self.fn = fn
        self.name = name
        self.retries = retries
        self._task: Any = None
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if not in_flow_run():
            # Outside a flow run Prefect would make each call a standalone task run: a new API
            # client (an SSL context) and a result-storage request per call, 55% of the service
            # watcher's one-file batch on django, and a warning for every log line it writes.
            return self._plain(*args, **kwargs)
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

    def _plain(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """The function with the task's retries (1 s apart), as Prefect would run it."""
        for attempt in range(self.retries + 1):
            try:
                return self.fn(*args, **kwargs)
            except Exception:
                if attempt == self.retries:
                    raise
                time.sleep(1.0)
        raise AssertionError("unreachable")


def in_flow_run() -> bool:
    """True inside a Prefect flow run. Prefect not imported yet means no flow can be running, and
    the check must not import it (1.7 s)."""
    context = sys.modules.get("prefect.context")
    return context is not None and context.FlowRunContext.get() is not None


def stage(name: str, *, retries: int = 0) -> Callable[[Callable[P, R]], Stage[P, R]]:
    """Declare a stage; `retries` only for stages whose failures are transient I/O."""

    def wrap(fn: Callable[P, R]) -> Stage[P, R]:
        return Stage(fn, name, retries)

    return wrap
