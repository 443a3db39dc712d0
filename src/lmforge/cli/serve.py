"""``lmforge serve``: an OpenAI-compatible HTTP server over model folders, with continuous batching.

Example::

    $ lmforge serve --model runs/gpt/model                      # http://127.0.0.1:8000, playground at /
    $ lmforge serve --model gpt=runs/gpt/model --model enc=runs/minilm --port 8080 --api-key s3cret
    $ lmforge serve --model runs/gpt/model --quantize int8      # int8 weights (and activations, on x86)
    $ curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
          -d '{"model": "model", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}'

Decoders serve /v1/completions (and /v1/chat/completions when the folder has a chat template),
encoders /v1/embeddings, fine-tuned task folders /v1/classify, index folders of ``lmforge index build``
/v1/search (see :mod:`lmforge.serve`). ``--quantize`` and ``--dtype`` apply to every model loaded (as in
``lmforge generate``); a folder written by ``lmforge quantize`` serves as saved. SIGTERM drains:
running requests finish, new ones get 503, then the server exits.
"""

from __future__ import annotations

import os
import sys

import torch

from lmforge.cli._load_args import add_load_flags, add_precision_flags
from lmforge.cli._price_args import add_price_flags
from lmforge.cli.main import UserError, plain_warnings
from lmforge.models.quantize import quantization_of
from lmforge.serve.limits import Limits
from lmforge.training.price_tag import PriceSettings

API_KEY_ENV = "LMFORGE_API_KEY"


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve models over an OpenAI-compatible HTTP API (continuous batching, playground at /)",
        description="Serve model folders over HTTP: /v1/models, /v1/completions, /v1/chat/completions (decoders; "
        "chat needs the folder's chat_template.json), /v1/embeddings (encoders), /v1/classify (fine-tuned task "
        "folders), /v1/search (index folders of lmforge index build), /health, /metrics, and a browser "
        "playground at /. A completion request with \"retrieval\": {\"index\": NAME, \"k\": 3} (extra_body in the "
        "openai client) puts the served index's passages into its prompts and lists them in the answer's "
        "\"retrieved\". Concurrent generation requests share decode steps (continuous batching). Needs the "
        "serve extra: pip install 'lmforge[serve]'.",
    )
    parser.add_argument("--model", action="append", required=True, metavar="[NAME=]DIR",
                        help="a model (or index) folder to serve, optionally named (default name: the folder's "
                        "name); repeatable")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (127.0.0.1: this machine only; 0.0.0.0 exposes the server)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (8000)")
    parser.add_argument("--api-key", default=None, metavar="KEY",
                        help=f"require 'Authorization: Bearer KEY' on every API call (default: ${API_KEY_ENV} if set)")
    parser.add_argument("--max-batch", type=int, default=16, metavar="N",
                        help="requests decoded together per model (rows of the running batch) (16)")
    parser.add_argument("--max-queue", type=int, default=64, metavar="N",
                        help="requests that may wait for a row; more get 429 with Retry-After (64)")
    parser.add_argument("--max-len", type=int, default=None, metavar="N",
                        help="prompt + completion tokens per request; more get 400 (default: the model's max_seq_len)")
    parser.add_argument("--max-request-tokens", type=int, default=1 << 16, metavar="N",
                        help="prompt + completion tokens of one request, over all its prompts and n; more get 413 "
                        "(65536)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="seconds a request may run before it is ended with 504 (600)")
    parser.add_argument("--max-body", type=int, default=1 << 20, metavar="BYTES",
                        help="largest request body accepted; more gets 413 (1 MiB)")
    parser.add_argument("--compile", action="store_true",
                        help="decode through torch.compile-d steps over the static KV cache (compiled at start-up, "
                        "tens of seconds per batch-size bucket; falls back to eager steps with a warning if "
                        "compiling fails); their attention spans all 2 x --max-len cache columns, so keep --max-len "
                        "near what requests need; decoders with learned/sinusoidal/RoPE positions only")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu (default) or cuda")
    add_load_flags(parser)
    add_precision_flags(parser)
    add_price_flags(parser.add_argument_group("price tag (usage.price of each response, /metrics counters)"))
    parser.set_defaults(func=run)


def _require_extra() -> None:
    try:
        import fastapi  # noqa: F401  (optional dependencies: the serve extra)
        import prometheus_client  # noqa: F401
        import pydantic  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise UserError(f"lmforge serve needs the serve extra ({exc.name} is missing): "
                        "pip install 'lmforge[serve]'") from None


def _traits(m) -> list[str]:
    """What the startup line says of a served model: its kind, chat, its quantisation and a non-fp32 dtype."""
    traits = [m.kind] + (["chat"] if m.chat_template is not None else [])
    if m.model is None:
        return traits
    record = quantization_of(m.model)
    bf16 = next(m.model.parameters()).dtype == torch.bfloat16
    return traits + ([record["mode"]] if record else []) + (["bf16"] if bf16 else [])


def run(args) -> int:
    with plain_warnings("serve"):
        return _run(args)


def _run(args) -> int:
    limits = Limits(max_batch=args.max_batch, max_queue=args.max_queue, max_len=args.max_len,
                    max_request_tokens=args.max_request_tokens, timeout=args.timeout, max_body=args.max_body)
    if not 0 < args.port < 65536:
        raise UserError(f"--port {args.port}: give a port in 1..65535")
    price = {"region": args.region, "grid_intensity": args.grid_intensity, "power_watts": args.power_watts,
             "price_per_hour": args.price_per_hour}
    PriceSettings.resolve("cpu", **price)  # a bad value is refused before any model loads
    _require_extra()
    # Imported here: the serve extra is optional, and every other command must work without it.
    from lmforge.serve.app import create_app
    from lmforge.serve.metrics import Metrics
    from lmforge.serve.served import load_served, parse_model_args
    from lmforge.serve.server import serve_forever

    metrics = Metrics()
    served = {}
    try:
        for name, folder in parse_model_args(args.model):
            served[name] = load_served(name, folder, limits, args.device, observe=metrics.observer(name),
                                       compile=args.compile)
    except BaseException:
        for m in served.values():
            m.close()
        raise
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV) or None
    app = create_app(served, limits, api_key=api_key, metrics=metrics, price=price)
    kinds = ", ".join(f"{m.name} ({', '.join(_traits(m))})" for m in served.values())
    print(f"lmforge serve: {kinds} on http://{args.host}:{args.port} (playground at /; Ctrl-C or SIGTERM to stop)",
          file=sys.stderr, flush=True)
    serve_forever(app, args.host, args.port)
    return 0
