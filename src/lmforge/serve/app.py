"""The FastAPI app: OpenAI-compatible endpoints over the served models.

    GET  /v1/models                 the models and their kinds
    POST /v1/completions            continue prompts (stream: server-sent events ending in ``data: [DONE]``)
    POST /v1/chat/completions       answer messages, rendered by the model's chat template
    POST /v1/embeddings             sentence embeddings (encoders)
    POST /v1/classify               labels and probabilities (fine-tuned task models; an extension)
    POST /v1/search                 top-k documents of an ``lmforge index build`` folder (an extension)
    POST /tokenize, /detokenize     text or messages -> token ids -> text (vLLM's shapes)
    GET  /tokenizer_info            the tokenizer's special tokens and chat template (what lm-evaluation-harness's
                                    remote tokenizer reads)
    GET  /health, GET /metrics      liveness, and Prometheus metrics (:mod:`lmforge.serve.metrics`)

A completion's ``retrieval`` (``{"index": NAME, "k": 3, "template": ...}``, an extension) fills each text prompt into
the template with its top-k passages from a served index (:mod:`lmforge.prompting.rag`); the answer's
``retrieved`` lists them per prompt (rank, index row, cosine, text).
    GET  /                          the playground page (:mod:`lmforge.serve.playground`); /favicon.ico its icon

Generation requests become :class:`~lmforge.serve.batching.job.Job` s (one per prompt and choice) that the
model's scheduler runs in its continuous batch; tokens come back through an asyncio queue. Completions take
the prompt forms of :mod:`lmforge.serve.prompts`; with ``echo`` the answer repeats the prompt, its tokens
scored by the same prefill (``max_tokens: 0`` scores without generating, as evaluation clients do).

Bad input gets a 4xx with OpenAI's error body (:func:`~lmforge.serve.openai_schema.error_body`): invalid
JSON or fields 400, a wrong key 401, an unknown model 404, a big body 413, a full queue 429 with
``Retry-After``, a draining server 503. A request that could never run (more prompts x n than the scheduler
holds, a prompt over the context, more tokens than ``--max-request-tokens``) gets 400/413 naming the limit.
Any other exception fails only its request: a 500 whose body carries an error id that the server's log
prints beside the traceback. A client that disconnects cancels its jobs, freeing their rows at the next
step.

Example (tests/test_serve_api.py runs it under a live server):
    >>> app = create_app({}, Limits())                   # no models: the routes are there all the same
    >>> sorted(r.path for r in app.routes if r.path.startswith("/v1/"))
    ['/v1/chat/completions', '/v1/classify', '/v1/completions', '/v1/embeddings', '/v1/models', '/v1/search']
"""


import asyncio
import base64
import time
import traceback
import uuid
from importlib import resources

import numpy as np
import torch

from lmforge.cost.inference import request_price
from lmforge.errors import LmforgeError
from lmforge.generation import encode_prompt
from lmforge.prompting import rag
from lmforge.serve import openai_schema as S
from lmforge.serve.batching.job import Echo, Job, Token
from lmforge.serve.batching.scheduler import Draining, QueueFull, TooLarge, error_id
from lmforge.serve.limits import Limits, OverBudget, check_budget, check_length, key_matches
from lmforge.serve.metrics import Metrics
from lmforge.serve.prompts import PromptError, legacy_logprobs, parse_prompt, top_strings
from lmforge.serve.served import ServedModel, search
from lmforge.tasks.data import Table
from lmforge.training.price_tag import PriceSettings

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
DEFAULT_CHAT_MAX_TOKENS = 256  # chat: up to this, or what the context leaves
API_PATHS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/classify", "/v1/search")
TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")
OPEN_PATHS = ("/", "/health", "/metrics", "/playground.js", "/playground.css", "/favicon.ico", "/docs",
              "/openapi.json")
# An anvil-grey square with an "lm": browsers ask every page's origin for /favicon.ico, and a 404 there is a red
# line in the console of a page that has no error.
FAVICON_SVG = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect width="32" height="32" rx="6" '
               'fill="#3b4252"/><text x="16" y="22" font-family="sans-serif" font-size="15" font-weight="bold" '
               'fill="#eceff4" text-anchor="middle">lm</text></svg>')


class ApiError(Exception):
    """An error answered with OpenAI's body: ``status``, message, type, param, and extra headers."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.headers, self.code = (
            status, message, type, param, headers or {}, code)


def _json_error(status: int, message: str, type: str, param=None, headers=None, code=None):
    from fastapi.responses import JSONResponse

    return JSONResponse(S.error_body(message, type, param, code), status_code=status, headers=headers)


class _Guard:
    """Pure-ASGI middleware: body size cap (413), API key (401), draining (503), request metrics."""

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state, path = self.state, scope["path"]
        start, status = time.monotonic(), {"code": 500}

        async def send_counted(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        async def answer(response):
            await response(scope, receive, send_counted)

        try:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if state.draining and path not in ("/health", "/metrics"):
                return await answer(_json_error(503, "the server is shutting down", "server_unavailable"))
            if state.api_key and path not in OPEN_PATHS and not key_matches(headers.get("authorization"),
                                                                               state.api_key):
                return await answer(_json_error(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                                "authentication_error"))
            if scope["method"] in ("POST", "PUT", "PATCH"):
                length = headers.get("content-length")
                if length is not None and length.isdigit() and int(length) > state.limits.max_body:
                    return await answer(_too_big(state.limits.max_body))
                body, more = b"", True
                while more:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body += message.get("body", b"")
                    more = message.get("more_body", False)
                    if len(body) > state.limits.max_body:
                        return await answer(_too_big(state.limits.max_body))
                sent = False

                async def replay():
                    nonlocal sent
                    if not sent:
                        sent = True
                        return {"type": "http.request", "body": body, "more_body": False}
                    return await receive()

                return await self.app(scope, replay, send_counted)
            return await self.app(scope, receive, send_counted)
        finally:
            if path.startswith("/v1/") or path in TOKENIZER_PATHS:
                # bounded label values, whatever clients send
                endpoint = path if path in API_PATHS + TOKENIZER_PATHS else "other"
                state.metrics.requests.labels(endpoint, str(status["code"])).inc()
                state.metrics.latency.labels(endpoint).observe(time.monotonic() - start)


def _too_big(limit: int):
    return _json_error(413, f"request body over {limit} bytes (the server's --max-body)", "invalid_request_error")


def create_app(served: dict[str, ServedModel], limits: Limits, api_key: str | None = None, metrics=None,
               price: dict | None = None):
    """The app over ``served`` (name -> model) with ``limits``; ``api_key`` makes every API call need it;
    ``price``: :meth:`PriceSettings.resolve`'s region, grid_intensity, power_watts, price_per_hour (for
    ``usage.price``; default: training's defaults for the model's device)."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    errors = {code: {"model": S.ErrorBody} for code in (400, 401, 404, 413, 429, 500, 503, 504)}
    app = FastAPI(title="lmforge", version="1", responses=errors,
                  description="OpenAI-compatible API over lmforge models, with continuous batching.")
    state = app.state
    state.served, state.limits, state.api_key = served, limits, api_key
    state.metrics = metrics or Metrics()
    state.draining = False

    def price_settings(m: ServedModel) -> PriceSettings:
        device = next(m.model.parameters()).device.type if isinstance(m.model, torch.nn.Module) else "cpu"
        return PriceSettings.resolve("cuda" if device == "cuda" else "cpu", **(price or {}))

    state.price_settings = price_settings
    app.add_middleware(_Guard, state=state)

    @app.exception_handler(ApiError)
    async def _api_error(request, exc: ApiError):
        return _json_error(exc.status, exc.message, exc.type, exc.param, exc.headers, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        # a body that is a union of models (/tokenize) puts the member's class name in the path: not a field
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.get("loc", ())
                        if p != "body" and not isinstance(getattr(S, str(p), None), type)).lstrip(".")
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = "the body is not valid JSON"
        elif where:
            message = f"{where}: {message}"
        return _json_error(400, message, "invalid_request_error", where or None)

    @app.exception_handler(HTTPException)
    async def _http(request, exc: HTTPException):
        return _json_error(exc.status_code, str(exc.detail), "invalid_request_error")

    @app.exception_handler(Exception)
    async def _bug(request, exc: Exception):
        eid = error_id()
        print(f"lmforge serve: error {eid} in {request.url.path}:\n"
              f"{''.join(traceback.format_exception(exc))}", flush=True)
        return _json_error(500, f"internal error (error id {eid}); the server log has the details", "server_error",
                           code=eid)

    def model_of(name: str, kind: str) -> ServedModel:
        m = served.get(name)
        if m is None:
            raise ApiError(404, f"the model {name!r} does not exist; the served models are: "
                           f"{', '.join(served) or 'none'}", param="model", code="model_not_found")
        if m.kind != kind:
            what = {"generate": "completions and chat", "embed": "/v1/embeddings", "classify": "/v1/classify",
                    "search": "/v1/search"}
            raise ApiError(400, f"model {name!r} serves {what[m.kind]}, not this endpoint", param="model")
        return m

    @app.get("/health")
    def health():
        return {"status": "draining" if state.draining else "ok", "models": list(served)}

    @app.get("/metrics", response_class=PlainTextResponse, responses={200: {"content": {"text/plain": {}}}})
    def prometheus():
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def playground():
        return HTMLResponse(_asset("index.html"))

    @app.get("/playground.js", include_in_schema=False)
    def playground_js():
        return Response(_asset("playground.js"), media_type="text/javascript")

    @app.get("/playground.css", include_in_schema=False)
    def playground_css():
        return Response(_asset("playground.css"), media_type="text/css")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon():
        return Response(FAVICON_SVG, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    @app.get("/v1/models", response_model=S.ModelList)
    def models():
        now = int(time.time())
        return {"object": "list", "data": [_model_card(m, now) for m in served.values()]}

    # stream=true answers server-sent events instead of the JSON body
    streamed = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}}

    @app.post("/v1/completions", response_model=S.Completion, responses=streamed)
    async def completions(body: S.CompletionRequest, request: Request):
        m = model_of(body.model, "generate")
        try:
            prompts = parse_prompt(body.prompt, m.model.config.vocab_size)
        except PromptError as exc:
            raise ApiError(400, str(exc), param=exc.param) from None
        retrieved = None
        if body.retrieval is not None:
            prompts, retrieved = with_passages(body.retrieval, prompts, body.stream)
        ids = [encode_prompt(m.model, m.tokenizer, p) if isinstance(p, str) else p for p in prompts]
        texts = [p if isinstance(p, str) else m.tokenizer.decode(p) for p in prompts] if body.echo else None
        run = _Generation(state, m, body, ids, DEFAULT_MAX_TOKENS, body.logprobs, request, echo=texts)
        if body.stream:
            return StreamingResponse(run.stream(chat=False), media_type="text/event-stream")
        answer = await run.complete(chat=False)
        return answer if retrieved is None else {**answer, "retrieved": retrieved}

    def with_passages(retrieval: S.Retrieval, prompts: list, stream: bool) -> tuple[list[str], list[list[dict]]]:
        """The text prompts with their passages in (:mod:`lmforge.prompting.rag`), and the passages of each."""
        if stream:  # the passages belong in the answer, which a stream does not have
            raise ApiError(400, "retrieval: not with stream=true; ask without streaming", param="retrieval")
        if not all(isinstance(p, str) for p in prompts):
            raise ApiError(400, "retrieval: the prompts must be texts (the question is what is searched for)",
                           param="prompt")
        index = model_of(retrieval.index, "search")
        try:
            template = rag.DEFAULT_TEMPLATE if retrieval.template is None else rag.check_template(
                retrieval.template, "retrieval.template")
            hits = [search(index, p, retrieval.k) for p in prompts]
        except LmforgeError as exc:
            raise ApiError(400, str(exc), param="retrieval") from None
        filled = [rag.build_prompt(p, [rag.Passage(h["id"], h["score"], h["text"]) for h in found], template)
                  for p, found in zip(prompts, hits)]
        return filled, hits

    @app.post("/v1/chat/completions", response_model=S.ChatCompletion, responses=streamed)
    async def chat(body: S.ChatRequest, request: Request):
        m = model_of(body.model, "generate")
        try:
            ids = m.chat_prompt([msg.model_dump() for msg in body.messages])
        except LmforgeError as exc:
            raise ApiError(400, str(exc), param="model" if m.chat_template is None else "messages") from None
        top = (body.top_logprobs or 0) if body.logprobs else None
        run = _Generation(state, m, body, [ids], DEFAULT_CHAT_MAX_TOKENS, top, request)
        if body.stream:
            return StreamingResponse(run.stream(chat=True), media_type="text/event-stream")
        return await run.complete(chat=True)

    @app.post("/v1/embeddings", response_model=S.EmbeddingList)
    def embeddings(body: S.EmbeddingRequest):
        m = model_of(body.model, "embed")
        texts = [body.input] if isinstance(body.input, str) else body.input
        if not texts:
            raise ApiError(400, "input: give a text or a non-empty list of texts", param="input")
        vectors = m.encoder.encode(texts)  # (N, D)
        tokens = sum(len(m.tokenizer.encode(t)) for t in texts)
        data = []
        for i, v in enumerate(np.asarray(vectors, dtype=np.float32)):
            vec = base64.b64encode(v.tobytes()).decode() if body.encoding_format == "base64" else v.tolist()
            data.append({"object": "embedding", "index": i, "embedding": vec})
        return {"object": "list", "data": data, "model": m.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/search", response_model=S.SearchResult)
    def search_index(body: S.SearchRequest):
        m = model_of(body.model, "search")
        try:
            hits = search(m, body.query, body.k)
        except LmforgeError as exc:
            raise ApiError(400, str(exc), param="model") from None
        return {"object": "list", "data": hits, "model": m.name}

    @app.post("/v1/classify", response_model=S.ClassificationList)
    def classify(body: S.ClassifyRequest):
        m = model_of(body.model, "classify")
        texts = [body.input] if isinstance(body.input, str) else body.input
        pairs = [body.input_pair] if isinstance(body.input_pair, str) else body.input_pair
        if not texts:
            raise ApiError(400, "input: give a text or a non-empty list of texts", param="input")
        columns = m.task.spec.columns()
        if pairs is not None and (len(pairs) != len(texts) or "text_pair" not in columns):
            raise ApiError(400, "input_pair: one per input, and only for a sentence-pair model", param="input_pair")
        rows = [{columns["text"]: t, **({columns["text_pair"]: pairs[i]} if pairs else {})}
                for i, t in enumerate(texts)]
        table = Table("request", rows, list(rows[0]))
        try:
            examples = m.task.encode(table, labelled=False)
        except LmforgeError as exc:
            raise ApiError(400, str(exc), param="input") from None
        device = str(next(m.model.parameters()).device)
        predictions, _ = m.task.evaluate(m.model, examples, 32, labelled=False, device=device)
        data = []
        for i, p in enumerate(predictions):
            label = p.get("label", p.get("labels", p.get("value", p.get("prediction"))))
            data.append({"index": i, "label": label, "probabilities": p.get("probabilities")})
        return {"object": "list", "data": data, "model": m.name}

    def tokenizer_model(name: str | None) -> ServedModel:
        if name is not None:
            return model_of(name, "generate")
        generating = [m for m in served.values() if m.kind == "generate"]
        if len(generating) != 1:
            raise ApiError(400, "model: name one of the served generating models ("
                           f"{', '.join(m.name for m in generating) or 'none'})", param="model")
        return generating[0]

    @app.post("/tokenize", response_model=S.TokenizeResponse)
    def tokenize(body: S.TokenizeRequest):
        m = tokenizer_model(body.model)
        if isinstance(body, S.TokenizeChatRequest):
            try:
                ids = m.chat_prompt([msg.model_dump() for msg in body.messages], body.add_generation_prompt)
            except LmforgeError as exc:
                raise ApiError(400, str(exc), param="messages") from None
        elif body.add_special_tokens:
            ids = encode_prompt(m.model, m.tokenizer, body.prompt)  # what /v1/completions feeds the model
        else:
            ids = m.tokenizer.encode(body.prompt, add_special_tokens=False)
        strs = [m.tokenizer.id_to_token(i) or "" for i in ids] if body.return_token_strs else None
        return {"count": len(ids), "max_model_len": m.max_len, "tokens": ids, "token_strs": strs}

    @app.post("/detokenize", response_model=S.DetokenizeResponse)
    def detokenize(body: S.DetokenizeRequest):
        m = tokenizer_model(body.model)
        vocab = m.model.config.vocab_size
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab), None)
        if bad is not None:
            raise ApiError(400, f"tokens[{bad}]: token id {body.tokens[bad]} is outside the vocabulary "
                           f"(0..{vocab - 1})", param=f"tokens[{bad}]")
        # special tokens kept: decoding is then the inverse of /tokenize (clients rely on it being lossless)
        return {"prompt": m.tokenizer.decode(body.tokens, skip_special_tokens=False)}

    @app.get("/tokenizer_info", response_model=S.TokenizerInfo)
    def tokenizer_info(model: str | None = None):
        m = tokenizer_model(model)
        tok = m.tokenizer
        roles = {f"{role}_token": tok.special_token(role) for role in ("bos", "eos", "pad", "unk")}
        return {"model": m.name, "tokenizer_class": "PreTrainedTokenizerFast", **roles,
                "model_max_length": m.max_len, "vocab_size": tok.vocab_size,
                "chat_template": m.chat_jinja()}

    return app


def _model_card(m: ServedModel, created: int) -> dict:
    """``/v1/models``' entry of ``m``: ``chat`` is true for an instruction-tuned model (its own chat template);
    ``chat_template`` says which template chat renders with, "model" or "default" (not instruction-tuned)."""
    card = {"id": m.name, "created": created, "kind": m.kind, "chat": False, "chat_template": None}
    if m.kind == "generate" and m.chat_template is not None:
        card["chat"] = not m.chat_template_default
        card["chat_template"] = "default" if m.chat_template_default else "model"
    return card


def _asset(name: str) -> str:
    return resources.files("lmforge.serve.playground").joinpath(name).read_text(encoding="utf-8")


def _sse(payload) -> bytes:
    import json

    return f"data: {json.dumps(payload) if not isinstance(payload, str) else payload}\n\n".encode()


class _Generation:
    """One completion or chat request: its jobs (prompts x n), and their events turned into a response."""

    def __init__(self, state, m: ServedModel, body, prompts: list[list[int]], default_max: int, logprobs,
                 request, echo: list[str] | None = None):
        self.state, self.m, self.body, self.request = state, m, body, request
        self.echo = echo  # completions with echo: each prompt's text, shown before its completion
        self.created, self.id = int(time.time()), f"cmpl-{uuid.uuid4().hex[:24]}"
        self.started, self._price = time.monotonic(), None
        stops = [body.stop] if isinstance(body.stop, str) else body.stop if body.stop is not None else []
        if (not isinstance(stops, list) or len(stops) > S.MAX_STOPS
                or any(not isinstance(s, str) or not s for s in stops)):
            raise ApiError(400, f"stop: give a string or a list of up to {S.MAX_STOPS} non-empty strings",
                           param="stop")
        if getattr(body, "messages", None) is not None:
            stops += m.chat_stops()
        temperature = 1.0 if body.temperature is None else body.temperature
        self.queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.jobs: list[Job] = []
        self.prompt_tokens = 0
        self.offsets: list[int] = []  # per choice: where its next logprobs token starts in its text
        budget = 0
        for p, ids in enumerate(prompts):
            room = m.max_len - len(ids)
            max_tokens = body.max_tokens if body.max_tokens is not None else max(1, min(default_max, room))
            try:
                check_length(len(ids), max_tokens, m.max_len)
            except LmforgeError as exc:
                where = "max_tokens" if room > 0 else "prompt" if len(prompts) == 1 else f"prompt[{p}]"
                raise ApiError(400, f"{where}: {exc}", param=where, code="context_length_exceeded") from None
            self.prompt_tokens += len(ids)
            budget += (len(ids) + max_tokens) * body.n
            for c in range(body.n):
                index = p * body.n + c
                seed = None if body.seed is None else body.seed + c
                self.jobs.append(Job(
                    list(ids), max_tokens, decode=m.tokenizer.decode, emit=self._emitter(loop, index),
                    temperature=temperature, top_p=1.0 if body.top_p is None else body.top_p,
                    top_k=body.top_k or None, seed=seed, eos_ids=[] if body.ignore_eos else m.eos_ids, stops=stops,
                    logprobs=logprobs, echo=echo is not None, timeout=state.limits.timeout))
                self.offsets.append(0)
        try:
            check_budget(budget, state.limits.max_request_tokens)
        except OverBudget as exc:
            raise ApiError(413, str(exc), param="prompt", code="request_too_large") from None

    def _emitter(self, loop, index: int):
        def emit(event) -> None:
            try:
                loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))
            except RuntimeError:  # the loop is gone (server stopping): nobody is listening
                pass

        return emit

    def submit(self) -> None:
        scheduler = self.m.scheduler
        try:
            scheduler.submit_many(self.jobs)
        except TooLarge as exc:
            what = "n" if self.body.n > 1 else "prompt"
            raise ApiError(400, f"{what}: {exc} (--max-batch + --max-queue): send fewer prompts or a smaller n",
                           param=what, code="request_too_large") from None
        except QueueFull as exc:
            self.cancel()
            raise ApiError(429, f"the server is busy: {exc}; retry later", "rate_limit_error",
                           headers={"Retry-After": str(self.state.limits.retry_after)}) from None
        except Draining:
            self.cancel()
            raise ApiError(503, "the server is shutting down", "server_unavailable") from None

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel()

    async def events(self):
        """(index, Token | ("done", reason) | ("error", exc)) until every job ended."""
        open_jobs = len(self.jobs)
        while open_jobs:
            try:
                index, event = await asyncio.wait_for(self.queue.get(), 0.25)
            except asyncio.TimeoutError:
                if await self.request.is_disconnected():
                    self.cancel()
                    return
                continue
            if isinstance(event, tuple):
                open_jobs -= 1
            yield index, event

    def _usage(self) -> dict:
        done = sum(job.generated for job in self.jobs)
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": done,
                "total_tokens": self.prompt_tokens + done, "price": self.price()}

    def price(self) -> dict:
        """What this request cost (``usage.price``), worked out once, when it ended, and added to /metrics.

        FLOPs: each job's KV-cached generation. Device-seconds: the request's wall span; requests batched
        together share the device, so over concurrent requests this is an upper bound of the device's time."""
        if self._price is None:
            self._price = request_price(self.m.model, [(len(job.ids), job.generated) for job in self.jobs],
                                        time.monotonic() - self.started, self.state.price_settings(self.m))
            self.state.metrics.add_price(self.m.name, self._price)
        return self._price

    def _error(self, index: int, exc: Exception) -> ApiError:
        eid = self.jobs[index].error_id or error_id()
        return ApiError(500, f"generation failed (error id {eid}): {type(exc).__name__}", "server_error", code=eid)

    async def complete(self, chat: bool):
        self.submit()
        texts = [""] * len(self.jobs)
        reasons: list[str | None] = [None] * len(self.jobs)
        logprobs = [[] for _ in self.jobs]
        echoes: list[Echo | None] = [None] * len(self.jobs)
        try:
            async for index, event in self.events():
                if isinstance(event, Echo):
                    echoes[index] = event
                elif isinstance(event, Token):
                    texts[index] += event.text
                    logprobs[index].append(event)
                elif event[0] == "error":
                    raise self._error(index, event[1])
                else:
                    reasons[index] = event[1]
        finally:
            self.cancel()  # a disconnect or an error: whatever still runs stops
        if "timeout" in reasons:
            raise ApiError(504, f"the request ran past the server's timeout of {self.state.limits.timeout:g} s",
                           "timeout")
        choices = []
        for i, text in enumerate(texts):
            lp = None
            if self.jobs[i].logprobs is not None:
                lp = self._logprobs(logprobs[i], chat, i, echoes[i])
            if echoes[i] is not None:
                text = self._echo_text(i) + text
            if chat:
                choices.append({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                                "finish_reason": reasons[i]})
            else:
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": reasons[i]})
        self.price()
        return {"id": self.id, "object": "chat.completion" if chat else "text_completion", "created": self.created,
                "model": self.m.name, "choices": choices, "usage": self._usage()}

    def _echo_text(self, index: int) -> str:
        return self.echo[index // self.body.n]

    def _logprobs(self, tokens: list[Token], chat: bool, index: int = 0, echo: Echo | None = None) -> dict:
        """The ``logprobs`` of choice ``index``'s new ``tokens`` (after its prompt's, with ``echo``)."""
        dec = self.m.tokenizer.decode

        def text(i):
            return dec([i], skip_special_tokens=False)

        if chat:
            return {"content": [{"token": text(t.id), "logprob": t.logprob, "bytes": list(text(t.id).encode()),
                                 "top_logprobs": [{"token": text(i), "logprob": lp, "bytes": list(text(i).encode())}
                                                  for i, lp in (t.top or {}).items()]} for t in tokens]}
        ids, lps, tops = [], [], []
        if echo is not None:
            ids, lps, tops = list(echo.ids), list(echo.logprobs), list(echo.top)
        ids += [t.id for t in tokens]
        lps += [t.logprob for t in tokens]
        tops += [t.top or {} for t in tokens]
        strs = [text(i) for i in ids]
        # as in OpenAI's legacy API, each position's alternatives include the token itself (up to logprobs + 1)
        top = [None if alt is None else top_strings([*alt.items(), (i, lp)], text)
               for alt, i, lp in zip(tops, ids, lps)]
        out = legacy_logprobs(strs, lps, top, self.offsets[index])
        self.offsets[index] += sum(len(s) for s in strs)
        return out

    def stream(self, chat: bool):
        """The event stream of this request; jobs are submitted first, so a full queue is still a 429."""
        self.submit()
        kind = "chat.completion.chunk" if chat else "text_completion"
        head = {"id": self.id, "object": kind, "created": self.created, "model": self.m.name}

        def chunk(index, text=None, reason=None, role=False, token=None, echo=None):
            lp = None
            if (token is not None or echo is not None) and self.jobs[index].logprobs is not None:
                lp = self._logprobs([token] if token is not None else [], chat, index, echo)
            if chat:
                delta = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason}
            else:
                choice = {"index": index, "text": text or "", "logprobs": lp, "finish_reason": reason}
            return _sse({**head, "choices": [choice]})

        return _stream_chunks(self, chunk, chat)


async def _stream_chunks(run: _Generation, chunk, chat: bool):
    """The server-sent events of a streamed request; a client that goes away cancels its jobs."""
    try:
        if chat:
            for i in range(len(run.jobs)):
                yield chunk(i, role=True)
        async for index, event in run.events():
            if isinstance(event, Echo):
                yield chunk(index, run._echo_text(index), echo=event)
            elif isinstance(event, Token):
                if event.text or run.jobs[index].logprobs is not None:
                    yield chunk(index, event.text, token=event)
            elif event[0] == "error":
                err = run._error(index, event[1])
                yield _sse(S.error_body(err.message, err.type, code=err.code))
                return
            else:
                reason = event[1]
                if reason == "timeout":
                    yield _sse(S.error_body(f"the request ran past the server's timeout of "
                                            f"{run.state.limits.timeout:g} s", "timeout"))
                    return
                yield chunk(index, reason=reason)
        options = run.body.stream_options
        if options is not None and options.include_usage:
            yield _sse({"id": run.id, "object": "chat.completion.chunk" if chat else "text_completion",
                        "created": run.created, "model": run.m.name, "choices": [], "usage": run._usage()})
        run.price()  # counted in /metrics whether or not the client asked for usage
        yield _sse("[DONE]")
    finally:
        run.cancel()
