"""Dask executor: batches of changed paths -> BatchRows (CHUNKS, FILES, graph tables) on cluster
workers, and chunk texts -> vectors; the flow's process stays the lake's only writer.

Workers get plain top-level functions and settings objects, never a lake or cache handle: they
read the source files, compute, and return Arrow tables. Prefect's DaskTaskRunner would do the
same through Prefect task runs, which needs the Prefect API reachable from every worker and wraps
each result; a plain `distributed.Client` keeps workers free of Prefect and of the lake.
"""

from __future__ import annotations

import atexit
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import CancelledError
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ctxlake.errors import ConfigError, CtxError
from ctxlake.schemas.config import EmbedSettings, IndexSettings
from ctxlake.tasks.chunk_stage import BatchRows, chunk_files, with_graph

if TYPE_CHECKING:
    from distributed import Client

    from ctxlake.tasks.embedder_base import Embedder

# Batches in flight per worker: enough that a worker never waits for the flow to hand it the
# next one, few enough that finished results (Arrow tables) do not pile up in the flow's memory.
IN_FLIGHT_PER_WORKER = 2
# Texts per encode task on a worker: shipping them costs far less than encoding them.
MIN_ENCODE_PART = 256
# Texts the flow hands to the cluster per call, split across the workers: large, so the round
# trip (a few ms) stays small beside the encoding, and a progress step still comes every second or so.
ENCODE_GROUP = 4096
CONNECT_TIMEOUT_S = 30

_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


# -- on the workers ------------------------------------------------------------------------------


def index_batch(root: str, source: str, paths: list[str], index: IndexSettings, dims: int,
                known: frozenset[str] | None) -> BatchRows:
    """Changed paths of one batch -> BatchRows: chunked, masked and graphed on a worker."""
    rows = chunk_files.fn(Path(root), source, paths, index, dims)
    return with_graph(rows, source, known, index.graph)


_embedders: dict[tuple[str, str], Embedder] = {}


def encode_texts(texts: list[str], embed: EmbedSettings, models_dir: str) -> np.ndarray:
    """Texts -> document vectors, with the model loaded once per worker process."""
    from ctxlake.tasks.embedders import make_embedder

    key = (embed.model_dump_json(), models_dir)
    embedder = _embedders.get(key)
    if embedder is None:
        embedder = _embedders[key] = make_embedder(embed, Path(models_dir))
    return embedder.embed_documents(texts)


# -- in the flow ---------------------------------------------------------------------------------


def client_for(address: str) -> Client:
    """A client of the cluster at `address` ("local:N" starts a LocalCluster of N worker
    processes), kept for the life of the process so later runs (sources, watch) reuse it."""
    with _clients_lock:
        client = _clients.get(address)
        if client is not None and client.status == "running":
            return client
        if client is not None:  # its scheduler went away: a LocalCluster it started must not linger
            _close(_clients.pop(address))
        from distributed import Client, LocalCluster

        try:
            if address.startswith("local:"):
                # One thread per worker: the stages hold the GIL, threads would only contend. TLS
                # with a key made for this cluster (security=True): its scheduler listens on a TCP
                # port of 127.0.0.1, where any local user could otherwise submit code run as us.
                cluster = LocalCluster(n_workers=int(address.removeprefix("local:")), threads_per_worker=1,
                                       processes=True, dashboard_address=None, security=True)
                client = Client(cluster)
            else:
                client = Client(address, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise ConfigError(f"cannot reach the Dask scheduler at {address}: {exc}",
                              hint="start it (`dask scheduler`) or set [run] executor = \"local\"") from exc
        _clients[address] = client
        return client


def close_clients() -> None:
    """Close every client (and the LocalClusters they started) this process opened."""
    with _clients_lock:
        for client in _clients.values():
            _close(client)
        _clients.clear()


def _close(client: Client) -> None:
    cluster = client.cluster
    client.close()
    if cluster is not None:
        cluster.close()


atexit.register(close_clients)


def worker_count(client: Client) -> int:
    return max(1, len(client.scheduler_info().get("workers", {})))


def describe(address: str) -> str:
    """Where a run's work went, for its report: the cluster and its workers, if this process used it."""
    with _clients_lock:
        client = _clients.get(address)
    if client is None or client.status != "running":
        return f"dask {address} (not needed: nothing to chunk or embed)"
    return f"dask {address} ({worker_count(client)} workers)"


def map_batches(client: Client, root: Path, source: str, jobs: Sequence[tuple[list[str], list[str]]],
                index: IndexSettings, dims: int, known: set[str]) -> Iterator[tuple[list[str], BatchRows]]:
    """(batch, changed paths) jobs -> (batch, BatchRows) as workers finish them, in any order.

    A worker that dies mid-batch loses nothing: the scheduler gives its batches to another.
    """
    from distributed import KilledWorker, as_completed

    if not jobs:
        return
    # Every path of the source, sent to each worker once instead of with every batch.
    # (In a list: scatter would otherwise send each path as a piece of data of its own.)
    shared = client.scatter([frozenset(known)], broadcast=True, hash=False)[0] if known else None
    window = IN_FLIGHT_PER_WORKER * worker_count(client)
    pending = iter(enumerate(jobs))
    batches: dict[object, list[str]] = {}  # future key -> its batch
    run = uuid.uuid4().hex[:12]  # keys unique to this run: a scheduler may serve several flows

    def submit() -> Any:
        n, (batch, changed) = next(pending)
        future = client.submit(index_batch, str(root), source, changed, index, dims, shared, pure=False,
                               key=f"ctx-index-{run}-{n}")
        batches[future.key] = batch
        return future

    running = as_completed([submit() for _ in range(min(window, len(jobs)))])
    submitted = min(window, len(jobs))
    for future in running:
        try:
            rows: BatchRows = future.result()
        except (KilledWorker, CancelledError, OSError) as exc:
            raise _lost(exc, f"a batch of {source}") from exc
        batch = batches.pop(future.key)
        future.release()
        if submitted < len(jobs):
            running.add(submit())
            submitted += 1
        yield batch, rows


class ClusterEmbedder:
    """An Embedder whose document encoding runs on the cluster's workers, split across them;
    queries and the model's identity stay with the flow's own embedder. The cluster is reached
    on the first texts to encode, so a run with nothing to embed never starts one."""

    def __init__(self, local: Embedder, address: str, embed: EmbedSettings, models_dir: Path) -> None:
        self.local, self.address, self.embed, self.models_dir = local, address, embed, str(models_dir)

    @property
    def model_id(self) -> str:
        return self.local.model_id

    @property
    def dims(self) -> int:
        return self.local.dims

    def embed_query(self, text: str) -> np.ndarray:
        return self.local.embed_query(text)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        from distributed import KilledWorker

        client = client_for(self.address)
        parts = max(1, min(worker_count(client), len(texts) // MIN_ENCODE_PART))
        size = -(-len(texts) // parts)
        slices = [list(texts[i : i + size]) for i in range(0, len(texts), size)]
        futures = client.map(encode_texts, slices, embed=self.embed, models_dir=self.models_dir, pure=False)
        try:
            return np.concatenate(client.gather(futures))
        except (KilledWorker, CancelledError, OSError) as exc:
            raise _lost(exc, "an embedding batch") from exc


def _lost(exc: BaseException, what: str) -> CtxError:
    # Workers died too often for one batch (allowed-failures), the scheduler dropped the batches
    # queued behind it (cancelled), or the scheduler went away (OSError).
    return CtxError(f"the Dask cluster lost {what}: {type(exc).__name__}: {exc}",
                    hint="the next run redoes what this one left unfinished; see the workers' logs")
