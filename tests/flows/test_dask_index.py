"""[run] executor = "dask" on a real LocalCluster of 2 worker processes: the lake equals the one
built in the flow's process (files, chunk ids, vectors, graph), also when a worker is killed mid-run."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lancedb
import pytest
from helpers import lake_fingerprint, write_files

from ctxlake.flows import index_code as index_code_module
from ctxlake.tasks import dask_run
from ctxlake.tasks.embedders import FakeEmbedder
from ctxlake.tasks.graph_store import DEFINITIONS_TABLE, IMPORTS_TABLE, REFERENCES_TABLE

pytestmark = [pytest.mark.usefixtures("prefect_server", "fake_embedder"), pytest.mark.slow]


def source_tree(n: int = 24) -> dict[str, str]:
    """Eight src/ layouts with the same package inside (an import of it is ambiguous), modules that
    import and call each other, a secret to mask and a few non-code files."""
    files: dict[str, str] = {}
    for layout in ("alpha", "beta", "delta", "gamma", "kappa", "omega", "sigma", "zeta"):
        files[f"{layout}/src/tool/__init__.py"] = ""
        files[f"{layout}/src/tool/run.py"] = f"def run_{layout}(job):\n    return job.start()\n"
    for i in range(n):
        other = (i + 1) % n
        files[f"app/mod_{i:02d}.py"] = (
            "import tool.run\n"
            f"from app.mod_{other:02d} import Worker{other}\n\n\n"
            f"class Worker{i}:\n    '''Worker number {i}.'''\n\n"
            f"    def work(self, value):\n        helper = Worker{other}()\n"
            f"        return helper.work(value * {i}) + tool.run.run_alpha(value)\n\n"
            f"    def describe(self):\n        return 'worker {i}'\n"
        )
    files["app/__init__.py"] = ""
    files["app/settings.py"] = 'API_TOKEN = "ghp_' + "a1B2c3D4e5F6g7H8i9J0" * 2 + '"\n'
    files["docs/guide.md"] = "# Guide\n\n## Workers\n\nEach worker calls the next one.\n"
    files["notes.txt"] = "Plain notes, chunked by lines.\n" * 30
    return files


def graph_rows(lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    db = lancedb.connect(str(lake))
    out: dict[str, list[tuple[Any, ...]]] = {}
    for name in (DEFINITIONS_TABLE, REFERENCES_TABLE, IMPORTS_TABLE):
        rows = db.open_table(name).to_arrow().to_pylist()
        out[name] = sorted(tuple(sorted((k, str(v)) for k, v in row.items())) for row in rows)
    return out


def index(cli: Callable[..., Any], repo: Path, home: Path, monkeypatch: pytest.MonkeyPatch,
          address: str | None) -> Any:
    """`ctx run index` of `repo` with its own CTX_HOME (so no run reuses another's vectors)."""
    monkeypatch.setenv("CTX_HOME", str(home))
    if address is None:
        monkeypatch.setenv("CTX_RUN_EXECUTOR", "local")
    else:
        monkeypatch.setenv("CTX_RUN_EXECUTOR", "dask")
        monkeypatch.setenv("CTX_RUN_DASK_ADDRESS", address)
    return cli("run", "index", str(repo), "--json", cwd=repo)


def indexed_here_and_copied(tmp_path: Path, files: dict[str, str], cli: Callable[..., Any],
                            monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The same tree twice: `local` indexed in this process (the reference), `remote` not yet."""
    local, remote = tmp_path / "local", tmp_path / "dask"
    write_files(local, files)
    write_files(remote, files)
    assert index(cli, local, tmp_path / "home-local", monkeypatch, None).exit_code == 0
    return local, remote


def assert_same_lake(remote: Path, local: Path) -> None:
    got = lake_fingerprint(remote / ".ctx" / "lake")
    assert got["duplicate_ids"] == 0 and got["missing_vectors"] == 0
    assert got == lake_fingerprint(local / ".ctx" / "lake")
    assert graph_rows(remote / ".ctx" / "lake") == graph_rows(local / ".ctx" / "lake")


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # Several batches per worker, so both workers get some and results come back out of order.
    monkeypatch.setattr(index_code_module, "BATCH_FILES", 3)


@pytest.fixture
def clients() -> Iterator[None]:
    yield
    dask_run.close_clients()


def test_the_lake_built_on_dask_equals_the_lake_built_here(
        tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, small_batches: None,
        clients: None) -> None:
    files = source_tree()
    local, remote = indexed_here_and_copied(tmp_path, files, cli, monkeypatch)

    FakeEmbedder.reset_counters()
    done = index(cli, remote, tmp_path / "home-dask", monkeypatch, "local:2")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["executor"] == "dask local:2 (2 workers)"  # the report says where it ran
    # The work left this process: its embedder encoded nothing, the two workers did.
    client = dask_run.client_for("local:2")
    per_worker = client.run(lambda: FakeEmbedder.texts_embedded)
    assert FakeEmbedder.texts_embedded == 0
    assert len(per_worker) == 2 and sum(per_worker.values()) > 0

    assert_same_lake(remote, local)
    assert len(lake_fingerprint(remote / ".ctx" / "lake")["files"]) == len(files)  # type: ignore[arg-type]
    imports = lancedb.connect(str(remote / ".ctx" / "lake")).open_table(IMPORTS_TABLE).to_arrow().to_pylist()
    assert {r["resolved"] for r in imports if r["module"] == "tool.run"} == {"alpha/src/tool/run.py"}


def test_killing_a_worker_mid_run_still_converges(
        tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, small_batches: None,
        clients: None) -> None:
    from distributed import Client, LocalCluster

    files = source_tree(40)
    local, remote = indexed_here_and_copied(tmp_path, files, cli, monkeypatch)

    killed: list[int] = []
    after_kill = [0]
    original = dask_run.map_batches

    def kill_after_the_first_batch(client: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        # Fault injection in the flow's process: once the first batch is back, SIGKILL the worker
        # process that holds the most batches; the rest of the run must go on without it.
        for item in original(client, *args, **kwargs):
            if not killed:
                pids = client.run(os.getpid)
                busy = client.processing()
                victim = max(pids, key=lambda addr: len(busy.get(addr, ())))
                os.kill(pids[victim], signal.SIGKILL)
                killed.append(pids[victim])
            else:
                after_kill[0] += 1
            yield item

    monkeypatch.setattr(dask_run, "map_batches", kill_after_the_first_batch)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as own:
        address = cluster.scheduler_address
        done = index(cli, remote, tmp_path / "home-dask", monkeypatch, address)
        if done.exit_code != 0:  # the scheduler may give up on a batch: then a re-run must repair
            monkeypatch.setattr(dask_run, "map_batches", original)
            done = index(cli, remote, tmp_path / "home-dask", monkeypatch, address)
        assert done.exit_code == 0, done.stderr
        assert killed and after_kill[0] > 0, "the worker was not killed while batches were left"
        assert killed[0] not in own.run(os.getpid).values()
        dask_run.close_clients()

    assert_same_lake(remote, local)


def test_a_run_the_cluster_gives_up_on_fails_cleanly_and_the_rerun_converges(
        tmp_path: Path, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, small_batches: None,
        clients: None) -> None:
    import dask
    from distributed import LocalCluster

    files = source_tree(40)
    local, remote = indexed_here_and_copied(tmp_path, files, cli, monkeypatch)
    original = dask_run.map_batches

    def kill_every_worker_after_the_first_batch(client: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for n, item in enumerate(original(client, *args, **kwargs)):
            if n == 0:
                for pid in client.run(os.getpid).values():
                    os.kill(pid, signal.SIGKILL)
            yield item

    monkeypatch.setattr(dask_run, "map_batches", kill_every_worker_after_the_first_batch)
    # No second chance for a batch whose worker died: the run must fail, not hang or half-write.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        failed = index(cli, remote, tmp_path / "home-dask", monkeypatch, cluster.scheduler_address)
        assert failed.exit_code == 1, failed.stderr
        assert "the Dask cluster lost a batch of project" in failed.stderr and "Traceback" not in failed.stderr
        monkeypatch.setattr(dask_run, "map_batches", original)
        repaired = index(cli, remote, tmp_path / "home-dask", monkeypatch, cluster.scheduler_address)
        assert repaired.exit_code == 0, repaired.stderr
        dask_run.close_clients()

    assert_same_lake(remote, local)


def test_a_client_that_stopped_running_is_replaced_and_its_local_cluster_closed(clients: None) -> None:
    client = dask_run.client_for("local:1")
    cluster = client.cluster
    client.close()  # as a client whose scheduler went away: no longer "running"
    fresh = dask_run.client_for("local:1")
    assert fresh is not client and fresh.status == "running"
    # The old LocalCluster's worker processes do not outlive the client that started them.
    assert cluster is not None and cluster.status.name == "closed"


def test_the_local_cluster_takes_no_connection_without_its_key(clients: None) -> None:
    # Its scheduler listens on a TCP port of 127.0.0.1: without TLS and a key made for it, any
    # local user could connect and submit code that runs as the user indexing.
    from distributed import Client

    address = dask_run.client_for("local:1").scheduler.address
    assert address.startswith("tls://")
    with pytest.raises(Exception):  # noqa: B017 - refused one way or another, before any task runs
        Client(address.replace("tls://", "tcp://"), timeout=5)
