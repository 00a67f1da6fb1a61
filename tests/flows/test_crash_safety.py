"""SIGKILL at many points of `ctx run index`, then a normal re-run: the lake equals a fresh index."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import lake_fingerprint, write_files

from ctxlake.serve.service.prefect_guard import TEMPORARY_FACTORY

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.slow]

# Fault injection, on the test side only: a sitecustomize module that small-batches the pipeline
# (so every stage has a "middle") and SIGKILLs the process right after the Nth call of a target.
KILLER = textwrap.dedent('''
    import os, signal
    spec = os.environ.get("CTX_TEST_KILL", "")
    import ctxlake.tasks.embed as embed
    import ctxlake.flows.index_code as index_code
    embed.ENCODE_GROUP, embed.FLUSH_ROWS = 8, 16
    index_code.BATCH_FILES = 6
    if spec:
        target, _, nth = spec.partition("#")
        nth, calls = int(nth or 1), [0]
        import lancedb.table, lancedb.merge
        import ctxlake.tasks.embedders as embedders, ctxlake.tasks.scan as scan, ctxlake.tasks.store as store
        owners = {
            "merge_execute": (lancedb.merge.LanceMergeInsertBuilder, "execute"),
            "add": (lancedb.table.LanceTable, "add"),
            "create_index": (lancedb.table.LanceTable, "create_index"),
            "compact": (store, "compact"),  # the code lake's optimize, a table at a time
            "encode": (embedders.FakeEmbedder, "embed_documents"),
            "write_vectors": (embed, "write_vectors"),
            "save_snapshot": (index_code, "save_snapshot"),
            "hash_file": (scan, "hash_file"),
        }
        owner, name = owners[target]
        original = getattr(owner, name)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            calls[0] += 1
            if calls[0] >= nth:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        setattr(owner, name, staticmethod(wrapper) if owner in (embed, index_code, scan, store) else wrapper)
''')

# (target, nth call after which the process dies): a spread over every stage of a run.
KILL_POINTS = [
    ("hash_file", 5),          # mid-scan, nothing written yet
    ("add", 1),                # cold run: chunks of the first batch appended, their FILES rows not
    ("add", 4),                # cold run: a later batch
    ("create_index", 1),       # between the two FTS indexes
    ("encode", 2),             # mid-embedding
    ("write_vectors", 1),      # vectors in the cache, some chunk updates committed
    ("compact", 1),            # chunks compacted, files not yet
    ("save_snapshot", 1),      # everything written, snapshot and clean state not
]
INCREMENTAL_KILL_POINTS = [
    ("merge_execute", 1),      # chunks of a batch replaced, their FILES rows not
    ("merge_execute", 3),
    ("encode", 1),
    ("save_snapshot", 1),
]


def source_files(n: int, tag: str = "") -> dict[str, str]:
    files = {}
    for i in range(n):
        body = "".join(
            f"    def method_{j}(self, value):\n        '''Method {j} of class {i}{tag}.'''\n"
            f"        total = value * {j} + {i}\n        return total - {len(tag)}\n\n"
            for j in range(4))
        files[f"pkg/mod_{i:02d}.py"] = f"class Thing{i}:\n    '''Thing number {i}.'''\n\n{body}"
    files["README.md"] = "# Crash\n\nSections.\n\n## Usage\n\nRun it.\n"
    return files


def run_ctx(repo: Path, kill: str | None, killer_dir: Path) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, "PYTHONPATH": str(killer_dir), "CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash",
           "PREFECT_API_URL": str(PREFECT_API_URL.value()), "CTX_TEST_KILL": kill or ""}
    return subprocess.run([str(Path(sys.executable).parent / "ctx"), "run", "index", str(repo)], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


@pytest.fixture
def killer(tmp_path: Path) -> Path:
    folder = tmp_path / "killer"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(KILLER)
    return folder


def reference(tmp_path: Path, files: dict[str, str], killer: Path, name: str) -> dict[str, object]:
    repo = tmp_path / name
    write_files(repo, files)
    done = run_ctx(repo, None, killer)
    assert done.returncode == 0, done.stderr
    return lake_fingerprint(repo / ".ctx" / "lake")


def converge(repo: Path, kill: str, killer: Path, expected: dict[str, object]) -> None:
    killed = run_ctx(repo, kill, killer)
    assert killed.returncode == -9, f"{kill}: expected SIGKILL, got {killed.returncode}: {killed.stderr[-800:]}"
    repaired = run_ctx(repo, None, killer)
    assert repaired.returncode == 0, f"{kill}: {repaired.stderr[-2000:]}"
    got = lake_fingerprint(repo / ".ctx" / "lake")
    assert got["duplicate_ids"] == 0 and got["missing_vectors"] == 0, kill
    assert got == expected, f"lake after a kill at {kill} differs from a fresh index"


def test_kill_during_a_cold_index_then_rerun_equals_a_fresh_index(tmp_path: Path, killer: Path, ctx_home: Path) -> None:
    files = source_files(20)
    expected = reference(tmp_path, files, killer, "fresh")
    survived = 0
    for target, nth in KILL_POINTS:
        repo = tmp_path / f"cold-{target}-{nth}"
        write_files(repo, files)
        shutil.rmtree(ctx_home / "embeddings", ignore_errors=True)  # progress must come from the cache
        converge(repo, f"{target}#{nth}", killer, expected)
        survived += 1
    assert survived == len(KILL_POINTS)


def test_kill_during_an_incremental_run_then_rerun_equals_a_fresh_index(
    tmp_path: Path, killer: Path, ctx_home: Path
) -> None:
    before = source_files(20)
    after = dict(before)
    for i in (1, 4, 9):
        after[f"pkg/mod_{i:02d}.py"] = after[f"pkg/mod_{i:02d}.py"].replace("return total", "return -total")
    for i in (2, 3):
        del after[f"pkg/mod_{i:02d}.py"]
    after["pkg/moved.py"] = after.pop("pkg/mod_05.py")
    after.update({f"pkg/new_{i}.py": f"def added_{i}():\n    return {i}\n" for i in range(3)})
    expected = reference(tmp_path, after, killer, "fresh-after")
    for target, nth in INCREMENTAL_KILL_POINTS:
        repo = tmp_path / f"inc-{target}-{nth}"
        write_files(repo, before)
        assert run_ctx(repo, None, killer).returncode == 0
        shutil.rmtree(repo / "pkg")
        write_files(repo, after)
        shutil.rmtree(ctx_home / "embeddings", ignore_errors=True)  # so the new chunks need the model
        converge(repo, f"{target}#{nth}", killer, expected)


def _cmdline(proc: Any) -> str:
    """A process's command line, or "" once it is gone or a zombie (the run's short-lived `git`
    children end while the test looks at them)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.parametrize("sig", [9, 15])
def test_a_killed_run_takes_its_temporary_prefect_server_with_it(tmp_path: Path, sig: int) -> None:
    """Without a configured Prefect server a run starts a temporary one (~220 MB); a `kill -9` or
    SIGTERM of the run used to leave it running for good, one more per killed run."""
    import psutil

    repo = tmp_path / "repo"
    write_files(repo, source_files(3))
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update({"CTX_EMBED_PROVIDER": "fake", "CTX_EMBED_MODEL": "hash", "PREFECT_HOME": str(tmp_path / "prefect")})
    run = subprocess.Popen([str(Path(sys.executable).parent / "ctx"), "run", "index", str(repo)], cwd=repo, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    server = None
    try:
        for _ in range(1200):  # the server is spawned a few seconds in, after the imports
            server = next((c for c in psutil.Process(run.pid).children(recursive=True)
                           if TEMPORARY_FACTORY in _cmdline(c)), None)
            if server is not None or run.poll() is not None:
                break
            time.sleep(0.05)
        assert server is not None, "the run started no temporary Prefect server"
        os.kill(run.pid, sig)
        run.wait(30)
        _, alive = psutil.wait_procs([server], timeout=20)
        assert not alive, f"the temporary Prefect server (pid {server.pid}) outlived the run killed by signal {sig}"
    finally:
        if run.poll() is None:
            run.kill()
        if server is not None and server.is_running():  # a failed check leaves nothing behind
            server.kill()


RACE = textwrap.dedent('''
    import http.server, threading
    import prefect.server.api.server as prefect_server
    from prefect import flow
    from ctxlake.serve.cli.base import start_prefect_shielded

    class Ok(http.server.BaseHTTPRequestHandler):  # another process's server, as the health check sees it
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"true")
        def log_message(self, *args):
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    real_choice, choices = prefect_server.SubprocessASGIServer.find_available_port, []
    def choose(self):  # the first port was free when chosen, then the other process bound it
        choices.append(1)
        return other.server_address[1] if len(choices) == 1 else real_choice(self)
    prefect_server.SubprocessASGIServer.find_available_port = choose
    start_prefect_shielded()
    other.shutdown()
    other.server_close()  # that other command ended: its server is gone

    @flow
    def answer():
        return 42

    print("ports chosen", len(choices), "answer", answer())
''')


def test_a_port_another_process_takes_first_does_not_become_the_runs_server(tmp_path: Path) -> None:
    """Prefect's start() returned at the first healthy answer on its port, whoever gave it: when
    another `ctx` command's temporary server took the port first, this run's flows went to that
    server and failed ("Connection refused") once its command ended."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run([sys.executable, "-c", RACE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ports chosen 2 answer 42" in done.stdout, done.stdout + done.stderr[-2000:]


REVIVE = textwrap.dedent('''
    import prefect.server.api.server as prefect_server
    from prefect import flow
    from ctxlake.serve.cli.base import start_prefect_shielded

    start_prefect_shielded()
    first = prefect_server.SubprocessASGIServer().server_process
    first.kill()
    first.wait()
    start_prefect_shielded()  # the next run of a long-lived process (the service) starts another

    @flow
    def answer():
        return 42

    print("answer", answer())
''')


def test_a_temporary_server_that_died_is_started_again(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    done = subprocess.run([sys.executable, "-c", REVIVE], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "answer 42" in done.stdout, done.stderr[-3000:]
