"""Embedders: registry, the fake, the API providers against a local HTTP server, the real models."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from pydantic import SecretStr

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import EmbedSettings, load_settings
from ctxlake.tasks import (
    embedder_api,
    embedder_base,
    embedder_static,
    embedder_transformer,
    embedders,
)
from ctxlake.tasks.embedder_api import GeminiEmbedder, OpenAIEmbedder
from ctxlake.tasks.embedders import (
    EMBEDDERS,
    FakeEmbedder,
    describe,
    make_embedder,
)

QUERY = "register a blueprint on the application"
BLUEPRINT_CODE = '''
    def register_blueprint(self, blueprint: Blueprint, **options: t.Any) -> None:
        """Attach the blueprint's routes and hooks to this app."""
        blueprint.register(self, options)
'''
DATE_CODE = '''
def parse_date(value: str) -> datetime:
    """Turn 2024-01-31 into a datetime."""
    return datetime.strptime(value, "%Y-%m-%d")
'''


def unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


# -- registry ------------------------------------------------------------------------------------


def test_registry_names_every_provider() -> None:
    assert {"local", "openai", "gemini", "fake"} <= set(EMBEDDERS)
    assert isinstance(make_embedder(EmbedSettings(provider="fake"), Path("unused")), FakeEmbedder)


def test_unknown_provider_lists_the_known_ones() -> None:
    with pytest.raises(EmbedderError) as err:
        make_embedder(EmbedSettings(provider="cohere"), Path("unused"))
    assert "cohere" in err.value.message
    assert err.value.hint is not None
    for name in ("local", "openai", "gemini", "fake"):
        assert name in err.value.hint


def test_import_and_construction_stay_light() -> None:
    """The MCP server imports this module: it must not pull torch, httpx or Prefect, and
    building the default embedder must not load the model."""
    code = """
import sys
from pathlib import Path
from ctxlake.schemas.config import EmbedSettings
from ctxlake.tasks.embedders import make_embedder
local = make_embedder(EmbedSettings(model="minilm"), Path("/nonexistent"))
static = make_embedder(EmbedSettings(model="static"), Path("/nonexistent"))
heavy = [m for m in ("torch", "sentence_transformers", "model2vec", "httpx", "prefect")
         if m in sys.modules]
print(local.model_id, local.dims, static.model_id, static.dims, heavy)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == [
        "local:all-MiniLM-L6-v2:384:t256", "384", "static:minilm-256:256", "256", "[]"
    ]


def test_model_id_names_truncation_and_document_prefix() -> None:
    short = make_embedder(EmbedSettings(model="minilm", max_tokens=128), Path("unused"))
    assert short.model_id == "local:all-MiniLM-L6-v2:384:t128"
    # The bundled model declares 256 tokens; asking for more changes nothing.
    assert make_embedder(EmbedSettings(model="minilm", max_tokens=1024), Path("unused")).model_id.endswith(":t256")
    prefixed = make_embedder(EmbedSettings(model="minilm", document_prefix="passage: "), Path("unused"))
    assert prefixed.model_id.startswith("local:all-MiniLM-L6-v2:384:t256:p")
    queried = make_embedder(EmbedSettings(model="minilm", query_prefix="query: "), Path("unused"))
    assert queried.model_id == "local:all-MiniLM-L6-v2:384:t256"


def test_describe_reports_provider_model_and_device() -> None:
    info = describe(make_embedder(EmbedSettings(provider="fake"), Path("unused")))
    assert info == {"provider": "fake", "model": "hash", "model_id": "fake:hash:64", "dims": 64,
                    "device": "cpu"}
    api = make_embedder(EmbedSettings(provider="openai", api_key=SecretStr("sk-x")), Path("unused"))
    assert describe(api) == {"provider": "openai", "model": "text-embedding-3-small",
                             "model_id": "openai:text-embedding-3-small:1536", "dims": 1536,
                             "device": "remote"}


# -- the fake ------------------------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeEmbedder]:
    FakeEmbedder.reset_counters()
    yield FakeEmbedder()
    FakeEmbedder.reset_counters()


def test_fake_is_deterministic_normalised_float32(fake: FakeEmbedder) -> None:
    texts = [BLUEPRINT_CODE, DATE_CODE, "", "x"]
    a = fake.embed_documents(texts)
    b = FakeEmbedder().embed_documents(texts)
    assert a.dtype == np.float32 and a.shape == (4, 64)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(fake.embed_query(QUERY), fake.embed_documents([QUERY])[0])
    assert fake.embed_documents([]).shape == (0, 64)


def test_fake_does_not_depend_on_the_hash_seed(fake: FakeEmbedder) -> None:
    code = ("from ctxlake.tasks.embedders import FakeEmbedder; "
            f"print(FakeEmbedder().embed_query({QUERY!r}).tolist())")
    runs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout
        for seed in ("1", "2")
    ]
    assert runs[0] == runs[1]
    np.testing.assert_allclose(json.loads(runs[0]), fake.embed_query(QUERY), rtol=1e-6)


def test_fake_empty_text_gets_a_fixed_unit_vector(fake: FakeEmbedder) -> None:
    empty = fake.embed_query("")
    np.testing.assert_array_equal(empty, fake.embed_documents(["  ...  "])[0])
    assert np.isclose(np.linalg.norm(empty), 1.0)


def test_fake_splits_identifiers(fake: FakeEmbedder) -> None:
    camel = fake.embed_query("getUserName")
    np.testing.assert_allclose(camel, fake.embed_query("get_user_name"), rtol=1e-6)
    np.testing.assert_allclose(camel, fake.embed_query("Get user NAME"), rtol=1e-6)


def test_fake_ranks_shared_words_above_unrelated_text(fake: FakeEmbedder) -> None:
    docs = fake.embed_documents([BLUEPRINT_CODE, DATE_CODE])
    scores = docs @ fake.embed_query(QUERY)
    assert scores[0] > scores[1]
    pairs = [("open the database connection", "close a database connection", "render html page"),
             ("HTTPServer request handler", "handle http request", "sort a list of numbers")]
    for query, near, far in pairs:
        q = fake.embed_query(query)
        near_v, far_v = fake.embed_documents([near, far])
        assert q @ near_v > q @ far_v


def test_fake_counts_document_calls(fake: FakeEmbedder) -> None:
    fake.embed_documents(["a b", "c"])
    FakeEmbedder().embed_documents(["d", "e", "f"])
    fake.embed_query("not counted as a document")
    assert (FakeEmbedder.calls, FakeEmbedder.texts_embedded, FakeEmbedder.queries) == (2, 5, 1)
    FakeEmbedder.reset_counters()
    assert (FakeEmbedder.calls, FakeEmbedder.texts_embedded, FakeEmbedder.queries) == (0, 0, 0)


def test_fake_dims_follow_settings() -> None:
    small = make_embedder(EmbedSettings(provider="fake", dimensions=16), Path("unused"))
    assert (small.model_id, small.dims) == ("fake:hash:16", 16)
    assert small.embed_documents(["a"]).shape == (1, 16)


# -- HTTP providers against a real local server ---------------------------------------------------


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Api:
    """A real HTTP server on 127.0.0.1: records each POST; answers from `script` first (status,
    body, headers), then from `responder`."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    script: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    responder: Callable[[str, Any], Any] = lambda path, body: {}


def raw_vector(text: str, dims: int) -> list[float]:
    """What the server answers for a text: deterministic, and not normalised on purpose."""
    rng = np.random.default_rng(xxhash.xxh3_64_intdigest(text.encode()))
    return (rng.normal(size=dims) * 5).tolist()


def expected(texts: list[str], dims: int) -> np.ndarray:
    return np.stack([unit(np.asarray(raw_vector(t, dims))) for t in texts]).astype(np.float32)


def openai_answer(path: str, body: Any) -> Any:
    dims = body.get("dimensions") or {"text-embedding-3-small": 1536}.get(body["model"], 12)
    items = [{"object": "embedding", "index": i, "embedding": raw_vector(t, dims)}
             for i, t in enumerate(body["input"])]
    # Answered back to front: the client must put them in order by `index`.
    return {"object": "list", "data": items[::-1], "model": body["model"]}


def gemini_answer(path: str, body: Any) -> Any:
    return {"embeddings": [
        {"values": raw_vector(r["content"]["parts"][0]["text"],
                              r.get("outputDimensionality", 3072))}
        for r in body["requests"]
    ]}


@pytest.fixture
def api() -> Iterator[Api]:
    state = Api()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            body = json.loads(raw)
            headers = {k.lower(): v for k, v in self.headers.items()}
            state.seen.append(Seen(self.path, headers, body))
            status, answer, extra = (state.script.pop(0) if state.script
                                     else (200, state.responder(self.path, body), {}))
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for key, value in extra.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def openai_settings(api: Api, **extra: Any) -> EmbedSettings:
    api.responder = openai_answer
    return EmbedSettings(provider="openai", api_key=SecretStr("sk-test"), base_url=api.url,
                         **extra)


def gemini_settings(api: Api, **extra: Any) -> EmbedSettings:
    api.responder = gemini_answer
    return EmbedSettings(provider="gemini", api_key=SecretStr("g-test"), base_url=api.url, **extra)


def test_openai_request_shape_batching_and_order(api: Api) -> None:
    embedder = make_embedder(openai_settings(api, dimensions=8), Path("unused"))
    assert (embedder.model_id, embedder.dims) == ("openai:text-embedding-3-small:8", 8)
    texts = [f"chunk number {i}" for i in range(300)]
    vectors = embedder.embed_documents(texts)
    np.testing.assert_allclose(vectors, expected(texts, 8), rtol=1e-5, atol=1e-6)
    assert [len(s.body["input"]) for s in api.seen] == [256, 44]
    first = api.seen[0]
    assert first.path == "/v1/embeddings"
    assert first.headers["authorization"] == "Bearer sk-test"
    assert first.body["model"] == "text-embedding-3-small"
    assert first.body["dimensions"] == 8
    assert api.seen[0].body["input"] + api.seen[1].body["input"] == texts


def test_openai_defaults_and_query(api: Api) -> None:
    embedder = make_embedder(openai_settings(api, query_prefix="q: "), Path("unused"))
    vector = embedder.embed_query("find the router")
    assert vector.shape == (1536,) and vector.dtype == np.float32
    np.testing.assert_allclose(vector, expected(["q: find the router"], 1536)[0], rtol=1e-5,
                               atol=1e-6)
    assert "dimensions" not in api.seen[0].body


def test_openai_empty_input_and_empty_text(api: Api) -> None:
    embedder = make_embedder(openai_settings(api, dimensions=4), Path("unused"))
    assert embedder.embed_documents([]).shape == (0, 4)
    assert api.seen == []
    embedder.embed_documents([""])
    assert api.seen[0].body["input"] == [" "]


def test_openai_unknown_model_probes_its_width_once(api: Api) -> None:
    embedder = make_embedder(openai_settings(api, model="my-local-embedder"), Path("unused"))
    assert api.seen == []  # building asks nothing
    assert embedder.model_id == "openai:my-local-embedder:12"
    assert embedder.dims == 12 and len(api.seen) == 1
    assert embedder.embed_documents(["a", "b"]).shape == (2, 12)
    assert len(api.seen) == 2


def test_openai_missing_key() -> None:
    with pytest.raises(EmbedderError, match="OPENAI_API_KEY is not set") as err:
        make_embedder(EmbedSettings(provider="openai"), Path("unused"))
    assert err.value.hint


def test_openai_key_comes_from_the_settings_loader(api: Api, tmp_path: Path) -> None:
    env = {"CTX_EMBED_PROVIDER": "openai", "CTX_EMBED_BASE_URL": api.url,
           "OPENAI_API_KEY": "sk-env", "CTX_HOME": str(tmp_path / "home")}
    settings = load_settings(tmp_path, env=env)
    api.responder = openai_answer
    make_embedder(settings.embed, settings.models_dir).embed_query("hello")
    assert api.seen[0].headers["authorization"] == "Bearer sk-env"


def test_openai_retries_429_then_succeeds(api: Api) -> None:
    settings = openai_settings(api, dimensions=4)
    api.script.append((429, {"error": {"message": "Rate limit reached"}}, {"Retry-After": "0"}))
    vectors = make_embedder(settings, Path("unused")).embed_documents(["a", "b"])
    assert len(api.seen) == 2
    np.testing.assert_allclose(vectors, expected(["a", "b"], 4), rtol=1e-5, atol=1e-6)


def test_openai_gives_up_after_bounded_retries(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedder_api, "RETRY_BASE_S", 0.001)
    settings = openai_settings(api, dimensions=4)
    api.script.extend([(503, {"error": {"message": "overloaded"}}, {})] * 5)
    with pytest.raises(EmbedderError, match="HTTP 503: overloaded"):
        make_embedder(settings, Path("unused")).embed_documents(["a"])
    assert len(api.seen) == embedder_api.RETRY_TRIES


def test_openai_spent_quota_is_not_retried(api: Api) -> None:
    settings = openai_settings(api, dimensions=4)
    api.script.append((429, {"error": {"message": "You exceeded your current quota",
                                       "code": "insufficient_quota"}}, {}))
    with pytest.raises(EmbedderError, match="exceeded your current quota"):
        make_embedder(settings, Path("unused")).embed_documents(["a"])
    assert len(api.seen) == 1


def test_openai_client_error_carries_the_api_message(api: Api) -> None:
    settings = openai_settings(api, dimensions=4)
    message = "Invalid 'input[0]': maximum context length is 8192 tokens."
    api.script.append((400, {"error": {"message": message, "type": "invalid_request_error"}}, {}))
    with pytest.raises(EmbedderError) as err:
        make_embedder(settings, Path("unused")).embed_documents(["a"])
    assert "HTTP 400" in str(err.value) and message in str(err.value)
    assert len(api.seen) == 1


def test_openai_unreachable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedder_api, "RETRY_BASE_S", 0.001)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = EmbedSettings(provider="openai", api_key=SecretStr("sk"),
                             base_url=f"http://127.0.0.1:{port}")
    with pytest.raises(EmbedderError, match="failed 4 times") as err:
        make_embedder(settings, Path("unused")).embed_documents(["a"])
    assert err.value.hint is not None and "base_url" in err.value.hint


def test_retry_delay_honours_retry_after_up_to_a_cap() -> None:
    assert embedder_api.retry_delay(1, "2") == 2.0
    assert embedder_api.retry_delay(1, "3600") == embedder_api.RETRY_AFTER_CAP_S
    assert embedder_api.retry_delay(1, "Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past
    base = embedder_api.RETRY_BASE_S
    assert base <= embedder_api.retry_delay(1, None) <= base * 1.25
    assert 4 * base <= embedder_api.retry_delay(3, "soon") <= 5 * base


def test_gemini_request_shape_batching_and_normalising(api: Api) -> None:
    embedder = make_embedder(gemini_settings(api, dimensions=8), Path("unused"))
    assert isinstance(embedder, GeminiEmbedder)
    assert embedder.model_id == "gemini:gemini-embedding-001:8"
    texts = [f"doc {i}" for i in range(250)]
    vectors = embedder.embed_documents(texts)
    np.testing.assert_allclose(vectors, expected(texts, 8), rtol=1e-5, atol=1e-6)
    assert [len(s.body["requests"]) for s in api.seen] == [100, 100, 50]
    first = api.seen[0]
    assert first.path == "/v1/models/gemini-embedding-001:batchEmbedContents"
    assert first.headers["x-goog-api-key"] == "g-test"
    assert first.body["requests"][0] == {
        "model": "models/gemini-embedding-001",
        "content": {"parts": [{"text": "doc 0"}]},
        "taskType": "RETRIEVAL_DOCUMENT",
        "outputDimensionality": 8,
    }
    embedder.embed_query("where is the router")
    assert api.seen[-1].body["requests"][0]["taskType"] == "RETRIEVAL_QUERY"


def test_gemini_default_width(api: Api) -> None:
    embedder = make_embedder(gemini_settings(api, model="models/gemini-embedding-001"),
                             Path("unused"))
    assert embedder.dims == 3072
    assert embedder.embed_query("x").shape == (3072,)
    assert "outputDimensionality" not in api.seen[0].body["requests"][0]


def test_gemini_missing_key() -> None:
    with pytest.raises(EmbedderError, match="GEMINI_API_KEY is not set"):
        make_embedder(EmbedSettings(provider="gemini"), Path("unused"))


def test_gemini_retries_then_reports_errors(api: Api) -> None:
    settings = gemini_settings(api, dimensions=4)
    embedder = make_embedder(settings, Path("unused"))
    api.script.append((429, {"error": {"code": 429, "message": "Resource has been exhausted",
                                       "status": "RESOURCE_EXHAUSTED"}}, {"Retry-After": "0"}))
    assert embedder.embed_documents(["a"]).shape == (1, 4)
    assert len(api.seen) == 2
    api.script.append((400, {"error": {"code": 400, "message": "API key not valid.",
                                       "status": "INVALID_ARGUMENT"}}, {}))
    with pytest.raises(EmbedderError, match="HTTP 400: API key not valid"):
        embedder.embed_documents(["a"])


def test_wrong_width_from_the_api_is_an_error(api: Api) -> None:
    settings = openai_settings(api, dimensions=8)
    api.script.append((200, {"data": [{"index": 0, "embedding": [0.1, 0.2]}]}, {}))
    with pytest.raises(EmbedderError, match="2-dim vectors, expected 8"):
        make_embedder(settings, Path("unused")).embed_documents(["a"])
    assert isinstance(make_embedder(settings, Path("unused")), OpenAIEmbedder)


# -- the real local models -----------------------------------------------------------------------


def assert_ranks_blueprint_first(vectors: np.ndarray, query: np.ndarray) -> None:
    scores = vectors @ query
    assert scores[0] > scores[1], scores


@pytest.mark.model
def test_bundled_minilm(tmp_path: Path) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm"), tmp_path)
    assert (embedder.model_id, embedder.dims) == ("local:all-MiniLM-L6-v2:384:t256", 384)
    vectors = embedder.embed_documents([BLUEPRINT_CODE, DATE_CODE])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert_ranks_blueprint_first(vectors, embedder.embed_query(QUERY))
    assert describe(embedder)["device"] in ("cpu", "cuda", "mps")


@pytest.mark.model
def test_a_local_model_serves_threads_that_embed_at_once(tmp_path: Path) -> None:
    # An in-process `ctx serve` embeds parallel tool calls' queries on several threads. The static
    # model (distilled here, offline) is the one whose tokenizer refused a second thread.
    embedder = make_embedder(EmbedSettings(model="static"), tmp_path)
    expected = embedder.embed_query(QUERY)
    errors: list[BaseException] = []
    wrong: list[int] = []

    def embed_repeatedly() -> None:
        for i in range(25):
            try:
                if i % 5 == 4:
                    embedder.embed_documents([BLUEPRINT_CODE, DATE_CODE])
                elif not np.allclose(embedder.embed_query(QUERY), expected, atol=1e-5):
                    wrong.append(i)
            except BaseException as exc:  # "Already borrowed" from the tokenizer, before the lock
                errors.append(exc)

    threads = [threading.Thread(target=embed_repeatedly) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert not wrong


# -- batch size and precision (the GPU path; what needs CUDA is measured by bench_gpu.py) ---------


def test_batch_size_auto_is_64_on_a_cpu_and_a_number_is_kept(tmp_path: Path) -> None:
    auto = make_embedder(EmbedSettings(model="minilm", device="cpu"), tmp_path)
    fixed = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=8), tmp_path)
    assert (auto.batch_size, fixed.batch_size) == (embedder_transformer.CPU_BATCH, 8)  # type: ignore[attr-defined]
    # A CPU keeps the embed stages' own group size; only a GPU asks for bigger ones.
    assert auto.encode_group is None  # type: ignore[attr-defined]
    assert describe(auto)["batch_size"] == 64 and describe(auto)["device"] == "cpu"


def test_batch_size_and_precision_from_config_and_environment(tmp_path: Path) -> None:
    (tmp_path / ".ctx").mkdir()
    (tmp_path / ".ctx" / "config.toml").write_text('[embed]\nbatch_size = 512\nprecision = "float16"\n')
    settings = load_settings(tmp_path, env={})
    assert (settings.embed.batch_size, settings.embed.precision) == (512, "float16")
    assert load_settings(tmp_path, env={"CTX_EMBED_BATCH_SIZE": "auto"}).embed.batch_size == "auto"
    assert load_settings(tmp_path, env={"CTX_EMBED_BATCH_SIZE": "96"}).embed.batch_size == 96
    with pytest.raises(Exception, match="batch_size"):
        EmbedSettings(batch_size="big")  # type: ignore[arg-type]
    with pytest.raises(Exception, match="precision"):
        EmbedSettings(precision="int8")  # type: ignore[arg-type]


def test_half_precision_applies_on_a_gpu_only(tmp_path: Path) -> None:
    on_cpu = make_embedder(EmbedSettings(model="minilm", device="cpu", precision="float16"), tmp_path)
    assert on_cpu.precision == "float32"  # type: ignore[attr-defined]
    assert on_cpu.model_id == "local:all-MiniLM-L6-v2:384:t256"  # same vectors, same cache as float32
    on_gpu = make_embedder(EmbedSettings(model="minilm", device="cuda", precision="bfloat16"), tmp_path)
    # Other vectors: their own model id, so they never mix with float32 ones in the cache or a lake.
    assert on_gpu.model_id == "local:all-MiniLM-L6-v2:384:t256:bfloat16"


class _RunsOutOfMemory:
    """Stands in for a sentence-transformers model on a device that fits `fits` texts per batch:
    CUDA's out-of-memory error cannot be produced on a machine without one."""

    def __init__(self, fits: int, error: str = "CUDA out of memory. Tried to allocate 2.00 GiB") -> None:
        self.fits, self.error, self.batches = fits, error, []

    def encode(self, texts: list[str], batch_size: int, **_: Any) -> np.ndarray:
        self.batches.append(batch_size)
        if batch_size > self.fits:
            raise RuntimeError(self.error)
        return np.ones((len(texts), 384), dtype=np.float32)


def test_out_of_memory_halves_the_batch_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=64), tmp_path)
    model = _RunsOutOfMemory(fits=16)
    vectors = embedder._encode(model, ["a", "b", "c"])  # type: ignore[attr-defined]
    assert vectors.shape == (3, 384)
    assert model.batches == [64, 32, 16] and embedder.batch_size == 16  # type: ignore[attr-defined]
    assert "batch size now 16" in capsys.readouterr().err
    embedder._encode(model, ["d"])  # type: ignore[attr-defined]
    assert model.batches[-1] == 16  # the smaller batch is kept, not probed again


def test_other_model_errors_are_not_retried(tmp_path: Path) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=64), tmp_path)
    model = _RunsOutOfMemory(fits=0, error="expected scalar type Half but found Float")
    with pytest.raises(RuntimeError, match="scalar type"):
        embedder._encode(model, ["a"])  # type: ignore[attr-defined]
    assert model.batches == [64]


# -- the direct encode loop: heads of long texts, the next batch tokenized while the GPU works ------


def test_text_head_cuts_where_a_word_ends() -> None:
    text = "alpha beta gamma delta"
    assert embedder_transformer.text_head(text, 100) is text  # short: the text itself
    assert embedder_transformer.text_head(text, 7) == "alpha beta"  # past 7 characters, at the end of "beta"
    assert embedder_transformer.text_head(text, 5) == "alpha"  # a word ends right there
    assert embedder_transformer.text_head("x" * 50, 10) == "x" * 50  # no end of a word after the limit: whole
    assert embedder_transformer.text_head("ab  \n\t cd ef", 3) == "ab  \n\t cd"  # never ends in whitespace


@pytest.mark.model
def test_direct_loop_gives_encodes_vectors_from_heads(tmp_path: Path) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=4), tmp_path)
    model = embedder._loaded()  # type: ignore[attr-defined]
    # The embedder modules' own source, in the order the code once stood in one module.
    source = "".join(Path(file).read_text() for file in (
        embedder_base.__file__, embedder_transformer.__file__, embedder_static.__file__, embedder_api.__file__,
        embedders.__file__)).splitlines()
    chunks = ["\n".join(source[i : i + 60]) for i in range(0, 600, 60)]  # ~2,500 characters each
    texts = [*chunks,
             "begin" + " " * 3000 + "the words after a long run of spaces",  # head has too few tokens
             "\u200b" * 2000 + " zero-width characters first" * 40,  # so has this one
             "y" * 4000, "short text", ""]
    seen: list[str] = []
    prepare = model.preprocess

    def spy(batch: list[str], *args: Any, **kwargs: Any) -> Any:
        seen.extend(batch)
        return prepare(batch, *args, **kwargs)

    model.preprocess = spy
    got = embedder.embed_documents(texts)
    del model.preprocess
    want = np.asarray(model.encode(texts, batch_size=4, normalize_embeddings=True, convert_to_numpy=True))
    np.testing.assert_allclose((got * want).sum(axis=1), 1.0, atol=2e-6)
    assert embedder._direct is True and embedder._cut is True  # type: ignore[attr-defined]
    limit = embedder.max_tokens * embedder_transformer.HEAD_CHARS_PER_TOKEN  # type: ignore[attr-defined]
    # Code chunks were tokenized from their heads; the texts whose heads were short, whole.
    assert all(len(text) > limit for text in chunks)
    assert max(len(t) for t in seen if t.startswith(chunks[0][:40])) < limit + 100
    assert texts[-5] in seen and texts[-4] in seen


class _TailModel:
    """A model whose tokens are its text's last characters, so a head gives other tokens than the
    whole text; runs out of memory above `fits` texts a batch, like a GPU."""

    max_seq_length = 8
    device = "cpu"

    def __init__(self, fits: int = 1000) -> None:
        self.fits = fits

    def preprocess(self, texts: list[str]) -> dict[str, Any]:
        import torch

        ids = torch.tensor([[ord(c) for c in t[-8:].rjust(8)] for t in texts])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def __call__(self, features: dict[str, Any]) -> dict[str, Any]:
        if len(features["input_ids"]) > self.fits:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"sentence_embedding": features["input_ids"].float()}


def test_direct_loop_stops_cutting_when_heads_give_other_tokens(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=8), tmp_path)
    texts = [("word " * 20) + f"end {i}" for i in range(5)]
    got = embedder._encode(_TailModel(), texts)  # type: ignore[attr-defined]
    assert embedder._cut is False and "whole texts are tokenized" in capsys.readouterr().err  # type: ignore[attr-defined]
    ends = np.array([[ord(c) for c in t[-8:]] for t in texts], dtype=np.float32)
    np.testing.assert_allclose(got, ends / np.linalg.norm(ends, axis=1, keepdims=True), rtol=1e-6)


def test_a_model_with_a_default_prompt_goes_through_encode(tmp_path: Path) -> None:
    class Prompted(_TailModel):
        default_prompt_name = "document"  # encode() would add the model's prompt; the loop does not

        def encode(self, texts: list[str], **_: Any) -> np.ndarray:
            return np.ones((len(texts), 3), dtype=np.float32)

    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=8), tmp_path)
    assert embedder._encode(Prompted(), ["a", "b"]).shape == (2, 3)  # type: ignore[attr-defined]
    assert embedder._direct is False  # type: ignore[attr-defined]


def test_direct_loop_halves_the_batch_when_out_of_memory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedder = make_embedder(EmbedSettings(model="minilm", device="cpu", batch_size=8), tmp_path)
    got = embedder._encode(_TailModel(fits=2), [f"text {i}" for i in range(5)])  # type: ignore[attr-defined]
    assert got.shape == (5, 8) and embedder.batch_size == 2  # type: ignore[attr-defined]
    assert "batch size now 2" in capsys.readouterr().err


@pytest.mark.model
def test_local_model_missing_offline_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="not available offline") as err:
        make_embedder(EmbedSettings(model="acme/no-such-embedder"), tmp_path)
    assert err.value.hint is not None and "local model folder" in err.value.hint


@pytest.mark.slow
def test_static_profile_is_distilled_once_and_reused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    settings = EmbedSettings(model="static")
    first = make_embedder(settings, models)
    assert (first.model_id, first.dims) == ("static:minilm-256:256", 256)
    vectors = first.embed_documents([BLUEPRINT_CODE, DATE_CODE])
    err = capsys.readouterr().err
    assert "distilling the static model once" in err
    assert "%|" not in err and "it/s" not in err, "tqdm bars printed to a stderr that is no terminal"
    assert first.setup_seconds > 1.0  # kept apart from the index run's own time
    assert vectors.shape == (2, 256) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    assert_ranks_blueprint_first(vectors, first.embed_query(QUERY))
    assert (models / "static-minilm-256" / "model.safetensors").is_file()

    def distil_again(*args: Any) -> None:
        raise AssertionError("the saved static model was not reused")

    monkeypatch.setattr(embedder_static, "build_static_model", distil_again)
    second = make_embedder(settings, models)
    assert (second.model_id, second.dims) == (first.model_id, 256)
    np.testing.assert_allclose(second.embed_documents([BLUEPRINT_CODE, DATE_CODE]), vectors,
                               rtol=1e-5, atol=1e-6)
    assert "distilling" not in capsys.readouterr().err


@pytest.mark.slow
def test_distilling_leaves_torch_out_of_the_process_that_asked(tmp_path: Path) -> None:
    """The distillation runs in a child: the index or ingest run that needed the model keeps
    neither torch nor the ~0.5 GB the distillation took."""
    import subprocess
    import sys

    script = ("import sys; from pathlib import Path; from ctxlake.tasks.embedder_static import build_static_model; "
              "build_static_model(Path(sys.argv[1]), 'cpu'); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "static")],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / "static" / "model.safetensors").is_file()
    assert not list(tmp_path.glob("static.tmp-*"))  # the child's folder was renamed into place


def test_a_failed_distillation_says_why_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedder_static, "bundled_model_path", lambda: tmp_path / "no-such-model")
    with pytest.raises(EmbedderError, match="distilling the static model") as err:
        embedder_static.build_static_model(tmp_path / "static", "cpu")
    assert "no-such-model" in str(err.value)  # the child's own error, its last line
    assert not (tmp_path / "static").exists() and not list(tmp_path.glob("static.tmp-*"))
