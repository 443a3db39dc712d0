"""``lmforge model``: inspect model presets and checkpoint folders."""

from __future__ import annotations

import json

from lmforge.config import list_presets, resolve_config
from lmforge.models import Transformer
from lmforge.utils.folder_kinds import MODELS, require_kind


def register(subparsers) -> None:
    parser = subparsers.add_parser("model", help="inspect models (presets and checkpoint folders)")
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    info = sub.add_parser(
        "info",
        help="architecture, parameter counts and training FLOPs per token",
        description="Print a model's architecture, its parameter count (total and non-embedding; for a "
        "mixture of experts also the active parameters a token multiplies by: router + top-k experts) and the "
        "estimated training FLOPs per token (6N + 12·L·d·T, N counting active weights only). NAME_OR_DIR is "
        "a preset name, a config file (.json/.yaml) or a model folder. Nothing is allocated: the model is built "
        "on the meta device.",
    )
    info.add_argument("model", metavar="NAME_OR_DIR", help=f"a preset ({', '.join(list_presets())}) or a path")
    info.add_argument("--seq-len", type=int, default=None, help="context length for the FLOPs estimate (default: max_seq_len)")
    info.add_argument("--json", action="store_true", help="end with one JSON line holding every number")
    info.set_defaults(func=run_info)
    lst = sub.add_parser("list", help="list the bundled presets", description="List the bundled presets with sizes.")
    lst.set_defaults(func=run_list)
    parser.set_defaults(func=lambda args: parser.print_help() or 0)


def describe(name_or_path: str, seq_len: int | None = None) -> dict:
    import torch

    cfg = resolve_config(name_or_path)
    with torch.device("meta"):
        model = Transformer(cfg)
    T = seq_len or cfg.max_seq_len
    return {
        "name": cfg.name,
        "arch": cfg.arch,
        "layers": cfg.n_layers if cfg.arch != "encoder-decoder" else f"{cfg.n_layers}+{cfg.decoder_layers}",
        "d_model": cfg.d_model,
        "heads": cfg.n_heads if cfg.kv_heads == cfg.n_heads else f"{cfg.n_heads} (kv {cfg.kv_heads})",
        "d_ff": cfg.d_ff,
        "vocab_size": cfg.vocab_size,
        "position": cfg.position,
        "norm": f"{cfg.norm} ({cfg.norm_position})",
        "activation": cfg.activation,
        **({"experts": f"{cfg.moe_experts} (top-{cfg.moe_top_k}, in "
                       f"{'every layer' if cfg.moe_every == 1 else f'1 of every {cfg.moe_every} layers'})"}
           if cfg.moe_experts else {}),
        "parameters": model.num_parameters(),
        "non_embedding_parameters": model.num_parameters(exclude_embeddings=True),
        **({"active_parameters": model.active_parameters()} if cfg.moe_experts else {}),
        "seq_len": T,
        "train_flops_per_token": model.flops_per_token(T),
    }


def run_info(args) -> int:
    require_kind(args.model, MODELS, "model info", "NAME_OR_DIR")  # a preset name passes
    info = describe(args.model, args.seq_len)
    width = max(map(len, info))
    for key, value in info.items():
        shown = f"{value:,}" if isinstance(value, int) and key not in ("d_model", "d_ff", "seq_len") else value
        print(f"{key:<{width}}  {shown}")
    if args.json:
        print(json.dumps(info))
    return 0


def run_list(args) -> int:
    for name in list_presets():
        info = describe(name)
        print(f"{name:<14} {info['arch']:<16} {info['parameters'] / 1e6:8.1f}M  {info['position']}")
    return 0
