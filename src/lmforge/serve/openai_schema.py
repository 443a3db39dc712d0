"""The request and response bodies of the OpenAI-compatible API, as pydantic models (FastAPI validates
requests with them and publishes them in the app's OpenAPI schema).

Requests refuse unknown fields (``extra="forbid"``): a misspelt ``max_token`` would otherwise be ignored
silently. Fields of OpenAI's API that lmforge does not implement are absent, so they are refused the same
way, with a 400 naming them. ``top_k`` is an extension (as in vLLM). Bounds are checked here (negative
``max_tokens``, ``n`` over :data:`MAX_N`, ...); limits that depend on the model (prompt + completion
length, token ids within the vocabulary) are checked by the app. ``prompt`` and ``stop`` take several
forms: the schema publishes each, and the app checks the value itself, so that a wrong one gets one message
naming it rather than pydantic's error per member of a union.

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

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

MAX_N = 8  # choices per request
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's own cap)
MAX_STOPS = 16  # OpenAI takes 4; evaluation clients send a task's stop strings plus EOS, often more

_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
# The four forms of OpenAI's API, published in the schema; the app checks the value itself
# (:func:`lmforge.serve.prompts.parse_prompt`), so a wrong form gets one message naming it, not pydantic's
# error per union member (``prompt.str: Input should be a valid string``).
Prompt = Annotated[Any, WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}, _IDS,
              {"type": "array", "minItems": 1, "items": _IDS}],
    "description": "a text, a list of texts, a list of token ids, or a list of lists of token ids"})]


_STOP = {"type": "string", "minLength": 1}
# Checked by the app (one message naming ``stop``), published as what it takes.
Stop = Annotated[Any, WithJsonSchema({"anyOf": [_STOP, {"type": "array", "maxItems": MAX_STOPS, "items": _STOP},
                                                {"type": "null"}]})]


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
    stop: Stop = Field(None, description="stop strings (up to 16); the text ends before one")
    # 2**53 - 1: the largest integer a JSON number holds exactly (a larger bound rounds up in clients and fuzzers)
    seed: int | None = Field(None, ge=0, le=2**53 - 1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = Field(False, description="extension: generate max_tokens tokens even past EOS (benchmarks)")
    user: str | None = None


class Retrieval(_Request):
    """Retrieval-augmented generation: each text prompt becomes the template filled with its top-k passages."""

    index: str = Field(min_length=1, description="an index the server holds (`lmforge serve --model NAME=INDEX_DIR`)")
    k: int = Field(3, ge=1, le=100, description="passages per prompt")
    template: str | None = Field(None, max_length=10_000, description="with {passages} and {question} once each "
                                 "(default: 'Passages:\\n{passages}\\n\\nQuestion: {question}\\nAnswer:')")


class CompletionRequest(_Sampling):
    prompt: Prompt = Field(description="the text to continue: a text, a list of texts, a list of token ids, or "
                           "a list of lists of token ids (several prompts)")
    max_tokens: int | None = Field(None, ge=0, le=1_000_000,
                                   description="tokens to generate at most; 0 with echo scores the prompt only")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="log-probabilities of the top tokens per position (legacy API)")
    echo: bool = Field(False, description="return the prompt too, with its tokens' log-probabilities "
                       "(the first token's is null)")
    retrieval: Retrieval | None = Field(None, description="put passages of a served index into each prompt; the "
                                        "answer's `retrieved` lists them per prompt (not with stream)")


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class TokenizeCompletionRequest(_Request):
    model: str | None = Field(None, description="a served generating model (optional when there is one)")
    prompt: str = Field(description="a text")
    add_special_tokens: bool = Field(True, description="the ids /v1/completions gives this text (a leading BOS "
                                     "where the model has one); false: the text's tokens alone")
    return_token_strs: bool = Field(False, description="also return each token's string")


class TokenizeChatRequest(_Request):
    model: str | None = Field(None, description="a served generating model (optional when there is one)")
    messages: list[ChatMessage] = Field(min_length=1, description="a conversation, rendered by the model's chat "
                                        "template")
    add_generation_prompt: bool = Field(True, description="end with the assistant's header")
    return_token_strs: bool = Field(False, description="also return each token's string")


# vLLM's two forms: a text, or a conversation
TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    model: str | None = Field(None, description="a served generating model (optional when there is one)")
    tokens: list[Annotated[int, Field(ge=0)]] = Field(description="token ids")


class DetokenizeResponse(BaseModel):
    prompt: str


class TokenizerInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    tokenizer_class: str
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    model_max_length: int
    vocab_size: int
    chat_template: str | None = Field(None, description="a Jinja template over messages and add_generation_prompt "
                                      "(as in HF's tokenizer_config.json)")


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


class Price(BaseModel):
    """An lmforge extension of ``usage``: what the request cost (:func:`lmforge.cost.inference.request_price`).
    OpenAI's clients keep unknown ``usage`` fields (``usage.model_extra["price"]``), so they still parse it."""
    flops: int
    device_s: float
    energy_j: float
    co2e_g: float
    cost_usd: float


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    price: Price | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lmforge"
    kind: str = Field(description="extension: generate, embed, classify or search")
    chat: bool = Field(False, description="extension: whether the model has its own chat template "
                       "(instruction-tuned)")
    chat_template: Literal["model", "default"] | None = Field(
        None, description="extension: the template chat renders with: 'model' (the folder's chat_template.json) "
        "or 'default' (plain User:/Assistant: lines; the model was not instruction-tuned); none for other kinds")


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
    retrieved: list[list[SearchHit]] | None = Field(None, description="with `retrieval`: per prompt, the passages "
                                                   "put into it (rank, index row id, cosine score, text)")


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
