"""The request and response bodies of the OpenAI-compatible API, as pydantic models (FastAPI validates
requests with them and publishes them in the app's OpenAPI schema).

Requests refuse unknown fields (``extra="forbid"``): a misspelt ``max_token`` would otherwise be ignored
silently. Fields of OpenAI's API that lmforge does not implement are absent, so they are refused the same
way, with a 400 naming them. ``top_k`` is an extension (as in vLLM). Bounds are checked here (negative
``max_tokens``, ``n`` over :data:`MAX_N`, ...); limits that depend on the model (prompt + completion
length) are checked by the app.

Errors have OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Example:
    >>> CompletionRequest(model="m", prompt="Hi", max_tokens=4).max_tokens
    4
    >>> try:
    ...     CompletionRequest(model="m", prompt="Hi", max_token=4)
    ... except Exception as exc:
    ...     print(type(exc).__name__)
    ValidationError
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 8  # choices per request
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's own cap)
MAX_STOPS = 4


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    model: str = Field(min_length=1, description="a model name from GET /v1/models")
    max_tokens: int | None = Field(None, ge=1, le=1_000_000, description="tokens to generate at most")
    temperature: float | None = Field(None, ge=0, le=2, description="0 = greedy; default 1 (sampling)")
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0, le=1_000_000, description="extension: sample among the k most likely")
    n: int = Field(1, ge=1, le=MAX_N, description="choices to generate")
    stop: str | list[str] | None = Field(None, description="stop strings (up to 4); the text ends before one")
    # 2**53 - 1: the largest integer a JSON number holds exactly (a larger bound rounds up in clients and fuzzers)
    seed: int | None = Field(None, ge=0, le=2**53 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="extension: generate max_tokens tokens even past EOS (benchmarks)")
    user: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] = Field(description="the text to continue (a list: several prompts)")
    logprobs: int | None = Field(None, ge=0, le=5, description="log-probabilities of the top tokens (legacy API)")
    echo: Literal[False] = False


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class EmbeddingRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[str] = Field(description="a text or a list of texts")
    encoding_format: Literal["float", "base64"] = "float"
    user: str | None = None


class ClassifyRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[str] = Field(description="a text or a list of texts")
    input_pair: str | list[str] | None = Field(None, description="second texts, for sentence-pair tasks")


class SearchRequest(_Request):
    model: str = Field(min_length=1, description="an index served from an `lmforge index build` folder")
    query: str = Field(min_length=1, max_length=10_000)
    k: int = Field(5, ge=1, le=100)


class SearchHit(BaseModel):
    rank: int
    id: int
    score: float
    text: str


class SearchResult(BaseModel):
    object: Literal["list"] = "list"
    data: list[SearchHit]
    model: str


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lmforge"
    kind: str = Field(description="extension: generate, embed, classify or search")
    chat: bool = Field(False, description="extension: whether the model has a chat template")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: dict | None = None
    finish_reason: str | None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: dict | None = None
    finish_reason: str | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str = Field(description="floats, or base64 of little-endian float32")


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: dict


class Classification(BaseModel):
    index: int
    label: str | list[str] | float | None
    probabilities: dict[str, float] | None = None


class ClassificationList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Classification]
    model: str
