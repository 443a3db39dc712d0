"""``lmforge serve``: an OpenAI-compatible HTTP server over lmforge models, with continuous batching.

    app.py              the FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /v1/embeddings,
                        /v1/classify, /tokenize, /detokenize, /tokenizer_info, /health, /metrics, and the
                        playground at /
    openai_schema.py    request/response bodies (pydantic), OpenAI's error shape
    prompts.py          the completions prompt forms (texts, token ids), and the legacy logprobs object
    batching/           Job (one request's tokens, per-row sampling) and the Scheduler thread
    served.py           the models of a server, loaded from folders, each with its kind
    limits.py           max batch, queue, length, timeout, body size; the API key check
    metrics.py          Prometheus metrics
    server.py           uvicorn with a draining SIGTERM
    playground/         the browser page (plain HTML + JS, no build step, nothing from the internet)

FastAPI, uvicorn and prometheus-client are the ``serve`` extra (``pip install lmforge[serve]``).
"""
