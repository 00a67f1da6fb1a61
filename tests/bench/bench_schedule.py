"""Benchmark: the service's Prefect server start, a flow run served from it, and a cold `ctx run index`.

    python3 dev.py bench schedule              # 3 served runs of a tiny project's index_code deployment
    python3 dev.py bench schedule --runs 10

"Served": the Orchestrator's Runner picks a run created through the API (as `notify_logs_changed`
does) and executes it; measured from the API call to the run's COMPLETED state. "Cold": a separate
`ctx run index` process on the same unchanged project (it starts Prefect's temporary server).
Each run follows a one-file edit. Both use the fake embedder, so the figures are orchestration overhead, not embedding.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def edit(project: Path, i: int) -> None:
    with (project / "a.py").open("a", encoding="utf-8") as out:
        out.write(f"def edit_{i}():\n    return {i}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ctx-bench-schedule-"))
    project, home = base / "proj", base / "home"
    (project / ".ctx").mkdir(parents=True)
    (project / "a.py").write_text("def hello():\n    return 1\n" * 10, encoding="utf-8")
    (project / ".ctx" / "config.toml").write_text(
        '[embed]\nprovider = "fake"\nmodel = "hash"\n[memory]\ntools = ["claude"]\n'
        f'roots = {{ claude = "{base / "nologs"}" }}\n', encoding="utf-8")
    os.environ.pop("PREFECT_API_URL", None)
    os.environ["CTX_HOME"] = str(home)
    env = dict(os.environ)
    subprocess.run([str(Path(sys.executable).with_name("ctx")), "run", "index"], cwd=project, env=env,
                   check=True, capture_output=True)  # warm-up: Prefect's DB migration, first index
    cold = []
    for i in range(args.runs):
        edit(project, i)  # a one-file edit, so the flow runs (a no-op returns before Prefect starts)
        started = time.perf_counter()
        subprocess.run([str(Path(sys.executable).with_name("ctx")), "run", "index"], cwd=project, env=env,
                       check=True, capture_output=True)
        cold.append(time.perf_counter() - started)

    from prefect.client.orchestration import PrefectClient

    from ctxlake.flows.deployments import index_name
    from ctxlake.schemas.config import load_settings
    from ctxlake.serve.service.orchestrator import Orchestrator

    orch = Orchestrator(home, load_settings(project))
    orch.start()
    try:
        orch.register_project(project)
        dep_id = orch._deployments[index_name(project)]

        async def one() -> float:
            async with PrefectClient(orch.api_url) as client:
                started = time.perf_counter()
                run = await client.create_flow_run_from_deployment(dep_id)
                while True:
                    state = (await client.read_flow_run(run.id)).state
                    if state is not None and state.is_final():
                        if not state.is_completed():
                            raise SystemExit(f"run ended {state.type}: {state.message}")
                        return time.perf_counter() - started
                    await asyncio.sleep(0.1)

        served = []
        for i in range(args.runs):
            edit(project, 100 + i)
            served.append(asyncio.run(one()))
    finally:
        orch.stop()
    print(json.dumps({
        "prefect_server_start_s": round(orch.server_start_s or 0, 2),
        "served_run_s": [round(s, 2) for s in served], "served_run_p50_s": round(statistics.median(served), 2),
        "cold_ctx_run_index_s": [round(s, 2) for s in cold], "cold_p50_s": round(statistics.median(cold), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
