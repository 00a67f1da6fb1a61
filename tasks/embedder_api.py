"""Embedders for the embed stage and queries: the HTTP API providers (OpenAI and compatible, Gemini)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ctxlake.errors import EmbedderError
from ctxlake.schemas.config import API_KEY_ENV, EmbedSettings
from ctxlake.tasks.embedder_base import STATIC_PROFILE, _prefix_tag, normalise

if TYPE_CHECKING:
    import httpx

HTTP_TIMEOUT_S = 60.0
RETRY_TRIES = 4
RETRY_BASE_S = 0.5
RETRY_AFTER_CAP_S = 30.0


# -- HTTP providers ------------------------------------------------------------------------------


class _HttpEmbedder:
    """Shared by the API providers: key check, batching, retries, checks on what comes back."""

    provider: ClassVar[str]
    default_base: ClassVar[str]
    default_model: ClassVar[str]
    known_dims: ClassVar[dict[str, int]]
    max_batch: ClassVar[int]
    # Inputs are cut to stay under the API's per-input token limit (no tokenizer here: code runs
    # 3-4 characters a token), and batches under its per-request total.
    max_input_chars: ClassVar[int]
    max_request_chars: ClassVar[int]
    device = "remote"

    def __init__(self, embed: EmbedSettings) -> None:
        key_env = API_KEY_ENV[self.provider]
        key = embed.api_key.get_secret_value() if embed.api_key is not None else ""
        if not key:
            raise EmbedderError(
                f"{key_env} is not set",
                hint=f"export {key_env}=... to embed with embed.provider = {self.provider!r}, "
                "or use the local provider",
            )
        self._key = key
        self._embed = embed
        name = embed.model.strip()
        # The local profiles are the settings' defaults, i.e. "no model chosen" for an API.
        self.model = self.default_model if name in ("", "minilm", STATIC_PROFILE) else name
        self.base_url = (embed.base_url or self.default_base).rstrip("/")
        self._dims = embed.dimensions or self.known_dims.get(self.model)
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    @property
    def dims(self) -> int:
        if self._dims is None:
            # An unknown model tells its width in answer to one tiny request, once.
            self._dims = len(self._request(["dimension probe"], query=False)[0])
        return self._dims

    @property
    def model_id(self) -> str:
        return f"{self.provider}:{self.model}:{self.dims}{_prefix_tag(self._embed)}"

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return self._embed_all([self._embed.document_prefix + t for t in texts], query=False)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed_all([self._embed.query_prefix + text], query=True)[0]

    def _embed_all(self, texts: list[str], query: bool) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        # APIs reject empty inputs outright; one space embeds as "nothing" instead.
        texts = [t[: self.max_input_chars] or " " for t in texts]
        rows: list[list[float]] = []
        for batch in _batches(texts, self.max_batch, self.max_request_chars):
            rows.extend(self._request(batch, query))
        try:
            matrix = np.asarray(rows, dtype=np.float32)
        except ValueError as exc:
            raise EmbedderError(f"{self.provider} API returned vectors of mixed lengths") from exc
        if self._dims is None and matrix.ndim == 2:
            self._dims = matrix.shape[1]  # no probe needed when real texts come first
        if matrix.ndim != 2 or matrix.shape[1] != self.dims:
            raise EmbedderError(
                f"{self.provider} API returned {matrix.shape[-1]}-dim vectors, "
                f"expected {self.dims}",
                hint="check embed.dimensions against what the model supports",
            )
        # Shortened vectors (dimensions / outputDimensionality) come back un-normalised.
        return normalise(matrix)

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        raise NotImplementedError

    def _http(self) -> httpx.Client:
        import httpx

        with self._lock:
            if self._client is None:
                self._client = httpx.Client(timeout=httpx.Timeout(HTTP_TIMEOUT_S, connect=10.0))
        return self._client

    def _post(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> Any:
        """POST JSON, retrying 429, 5xx and network failures with bounded backoff."""
        import httpx

        client = self._http()
        for attempt in range(1, RETRY_TRIES + 1):
            last = attempt == RETRY_TRIES
            try:
                response = client.post(url, json=payload, headers=headers)
            except httpx.TransportError as exc:  # timeouts, resets, refused connections
                if last:
                    raise EmbedderError(
                        f"{self.provider} API at {self.base_url} failed {RETRY_TRIES} times: "
                        f"{type(exc).__name__} {exc}".rstrip(),
                        hint="check the network and embed.base_url",
                    ) from exc
                time.sleep(retry_delay(attempt, None))
                continue
            if response.is_success:
                try:
                    return response.json()
                except ValueError as exc:
                    raise EmbedderError(f"{self.provider} API returned invalid JSON") from exc
            message, code = _api_error(response)
            status = response.status_code
            # A spent quota also answers 429, but waiting will not refill it.
            retryable = status in (408, 429) or status >= 500
            if retryable and code != "insufficient_quota" and not last:
                time.sleep(retry_delay(attempt, response.headers.get("retry-after")))
                continue
            raise EmbedderError(
                f"{self.provider} API returned HTTP {status}: {message}", hint=self._hint(status)
            )
        raise AssertionError("unreachable")

    def _hint(self, status: int) -> str | None:
        if status in (401, 403):
            return f"check {API_KEY_ENV[self.provider]}"
        if status == 404:
            return f"check embed.model ({self.model}) and embed.base_url ({self.base_url})"
        if status == 429 or status >= 500:
            return f"gave up after {RETRY_TRIES} tries; try again later"
        return None


def _batches(texts: list[str], max_items: int, max_chars: int) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and (len(batch) == max_items or size + len(text) > max_chars):
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


def _api_error(response: httpx.Response) -> tuple[str, str]:
    """(message, code) from an error body: both APIs answer {"error": {"message": ..., ...}}."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        code = error.get("code") or error.get("status") or ""
        return str(error["message"]), str(code)
    if isinstance(error, str):
        return error, ""
    return (response.text.strip()[:300] or response.reason_phrase), ""


def retry_delay(attempt: int, retry_after: str | None) -> float:
    """Seconds to wait after failed try `attempt`: the server's Retry-After when it sends one
    (capped), else exponential backoff with jitter so parallel indexers do not retry in step."""
    if retry_after:
        seconds: float | None
        try:
            seconds = float(retry_after)
        except ValueError:
            try:
                when = parsedate_to_datetime(retry_after)
                seconds = (when - datetime.now(UTC)).total_seconds()
            except (TypeError, ValueError):
                seconds = None
        if seconds is not None:
            return min(max(seconds, 0.0), RETRY_AFTER_CAP_S)
    delay = RETRY_BASE_S * 2 ** (attempt - 1)
    return delay + random.uniform(0.0, delay / 4)


def _malformed(provider: str, detail: str) -> EmbedderError:
    return EmbedderError(f"{provider} API answered without the expected embeddings ({detail})")


class OpenAIEmbedder(_HttpEmbedder):
    """OpenAI's /embeddings API, or any server that speaks it (set embed.base_url)."""

    provider = "openai"
    default_base = "https://api.openai.com/v1"
    default_model = "text-embedding-3-small"
    known_dims: ClassVar[dict[str, int]] = {
        "text-embedding-3-small": 1536,
        "text-embedding-3-large": 3072,
        "text-embedding-ada-002": 1536,
    }
    max_batch = 256
    max_input_chars = 16_000  # 8,191 tokens per input
    max_request_chars = 600_000  # 300,000 tokens per request

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        payload: dict[str, Any] = {"model": self.model, "input": texts}
        if self._embed.dimensions:
            payload["dimensions"] = self._embed.dimensions
        body = self._post(
            f"{self.base_url}/embeddings", payload, {"Authorization": f"Bearer {self._key}"}
        )
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != len(texts):
            raise _malformed(self.provider, f"{len(texts)} inputs sent")
        try:
            # Order by `index`: the API does not promise to answer in input order.
            ordered = sorted(data, key=lambda item: int(item["index"]))
            return [item["embedding"] for item in ordered]
        except (KeyError, TypeError, ValueError) as exc:
            raise _malformed(self.provider, f"bad item: {exc}") from exc


class GeminiEmbedder(_HttpEmbedder):
    """Google's Gemini API, models/{model}:batchEmbedContents."""

    provider = "gemini"
    default_base = "https://generativelanguage.googleapis.com/v1beta"
    default_model = "gemini-embedding-001"
    known_dims: ClassVar[dict[str, int]] = {
        "gemini-embedding-001": 3072,
        "text-embedding-004": 768,
        "embedding-001": 768,
    }
    max_batch = 100  # the API's limit on requests per batch
    max_input_chars = 8_000  # 2,048 tokens per input for gemini-embedding-001
    max_request_chars = 600_000

    def __init__(self, embed: EmbedSettings) -> None:
        super().__init__(embed)
        self.model = self.model.removeprefix("models/")
        self._dims = embed.dimensions or self.known_dims.get(self.model)

    def _request(self, texts: list[str], query: bool) -> list[list[float]]:
        task = "RETRIEVAL_QUERY" if query else "RETRIEVAL_DOCUMENT"
        requests: list[dict[str, Any]] = []
        for text in texts:
            request: dict[str, Any] = {
                "model": f"models/{self.model}",
                "content": {"parts": [{"text": text}]},
                "taskType": task,
            }
            if self._embed.dimensions:
                request["outputDimensionality"] = self._embed.dimensions
            requests.append(request)
        body = self._post(
            f"{self.base_url}/models/{self.model}:batchEmbedContents",
            {"requests": requests},
            {"x-goog-api-key": self._key},
        )
        embeddings = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(embeddings, list) or len(embeddings) != len(texts):
            raise _malformed(self.provider, f"{len(texts)} inputs sent")
        try:
            return [item["values"] for item in embeddings]
        except (KeyError, TypeError) as exc:
            raise _malformed(self.provider, f"bad item: {exc}") from exc

