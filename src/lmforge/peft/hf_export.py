"""Write an lmforge adapter in HF peft's format: ``adapter_config.json`` + ``adapter_model.safetensors``.

``peft.PeftModel.from_pretrained(hf_base, folder)`` then loads it onto the :func:`lmforge.to_hf` export of
the base model and computes the same outputs. Tensor names follow the base's HF layout through the same
rule tables :mod:`lmforge.interop` uses for the weights, so every supported family works.

    method   peft type       notes
    lora     LORA            one LoRA per HF module; fused modules (GPT-2's c_attn = q|k|v) get a block
                             LoRA: A' = [A_q; A_v], B' = blockdiag(B_q, 0_k, B_v) at rank 2r, alpha scaled
                             to keep alpha'/r' = alpha/r (listed in rank_pattern / alpha_pattern)
    qlora    LORA            the LoRA part; HF applies it to the full-precision base (QLoRA's own outputs
                             used the dequantised weights, so they differ by the NF4 rounding)
    ia3      IA3             fused modules get ones for their untargeted parts
    prefix   PREFIX_TUNING   decoder-only models; saved folded (prompt_embeddings = the prefix)
    prompt   PROMPT_TUNING   decoder-only models; HF returns logits for the P prompt positions too

Example:
    >>> import tempfile, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=1), PeftConfig(method="lora", r=2))
    >>> folder = export_hf(model, tempfile.mkdtemp() + "/hf-lora")
    >>> sorted(p.name for p in folder.iterdir())
    ['adapter_config.json', 'adapter_model.safetensors']
    >>> json.loads((folder / "adapter_config.json").read_text())["target_modules"]   # q and v live in c_attn
    ['h.0.attn.c_attn']
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lmforge.errors import LmforgeError
from lmforge.interop.hf import hf_config_for
from lmforge.interop.hf_family import Mapper
from lmforge.peft.layer import AdaptedModule
from lmforge.peft.nf4 import LINEARS
from lmforge.peft.targets import logical_name
from lmforge.utils.io import atomic_dir

HF_ADAPTER_CONFIG, HF_ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
EXPORTABLE = ("lora", "qlora", "ia3", "prefix", "prompt")
TASK_TYPES = {"lm": {"decoder": "CAUSAL_LM", "encoder-decoder": "SEQ_2_SEQ_LM"},
              "none": {"encoder": "FEATURE_EXTRACTION"}}


class HFExportError(LmforgeError, ValueError):
    """An adapter that HF peft cannot express; the message says why."""


def _layout(model, mapper) -> dict[str, list[tuple[int, str, int]]]:
    """HF module -> [(part index, our module path, out features)] for every linear of the stacks."""
    layout: dict[str, list[tuple[int, str, int]]] = {}
    for path, module in model.base_model.named_modules():
        parts = path.split(".")
        if parts[-1] == "base" or "adapters" in parts or "merged_base" in parts:
            continue
        if isinstance(module, AdaptedModule):
            module = module.base
        if not isinstance(module, LINEARS) or not path.startswith(("encoder.", "decoder.")):
            continue
        rule, theirs = mapper(logical_name(path) + ".weight")
        hf_module = theirs.removesuffix(".weight")
        layout.setdefault(hf_module, []).append((rule.part[0] if rule.part else 0, path, module.out_features))
    return {k: sorted(v) for k, v in layout.items()}


def _conv1d(mapper, path: str) -> bool:
    return mapper(logical_name(path) + ".weight")[0].conv1d


def export_hf(model, path: str | Path, name: str | None = None, base_model_name_or_path: str | None = None) -> Path:
    """Write adapter ``name`` (default: active) of PeftModel ``model`` as an HF peft folder.

    Args:
        model: a PeftModel.
        path: destination folder (written atomically).
        base_model_name_or_path: recorded in the config (default: the base model's name).

    Raises:
        HFExportError: the method (or this base) has no HF peft equivalent.
    """
    name = model._name(name)
    cfg = model.peft_configs[name]
    base_cfg = model.base_model.config
    if cfg.method not in EXPORTABLE:
        raise HFExportError(f"adapter {name!r} ({cfg.method}) has no HF peft equivalent; exportable: "
                            f"{', '.join(EXPORTABLE)}")
    family, arch_name, _ = hf_config_for(base_cfg)
    arch = family.architectures[arch_name]
    mapper = Mapper(family.rules(base_cfg))
    prefix = "base_model.model." + (family.prefix if arch.prefixed else "")
    hf_cfg: dict[str, Any] = {
        "task_type": TASK_TYPES.get(base_cfg.head, {}).get(base_cfg.arch),
        "base_model_name_or_path": base_model_name_or_path or base_cfg.name,
        "inference_mode": True,
        "revision": None,
    }
    if cfg.method in ("lora", "qlora"):
        tensors, extra = _lora(model, name, cfg, mapper, _layout(model, mapper), prefix)
    elif cfg.method == "ia3":
        tensors, extra = _ia3(model, name, mapper, _layout(model, mapper), prefix)
    else:
        tensors, extra = _virtual_tokens(model, name, cfg)
    hf_cfg.update(extra)
    path = Path(path)
    with atomic_dir(path) as tmp:
        (tmp / HF_ADAPTER_CONFIG).write_text(json.dumps(hf_cfg, indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / HF_ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})
    return path


def _targeted(model, name: str, layout) -> dict[str, list[tuple[int, str, int]]]:
    """The HF modules with at least one part carrying adapter ``name``."""
    carrying = {path for path, layer in model.wrappers() if name in layer.adapters}
    return {hf: parts for hf, parts in layout.items() if any(p in carrying for _, p, _ in parts)}


def _lora(model, name, cfg, mapper, layout, prefix):
    adapters = {path: layer.adapters[name] for path, layer in model.wrappers() if name in layer.adapters}
    tensors, ranks, alphas = {}, {}, {}
    conv1d = False
    for hf_module, parts in _targeted(model, name, layout).items():
        used = [(path, adapters[path]) for _, path, _ in parts if path in adapters]
        A = torch.cat([lo.A.weight.detach() for _, lo in used])  # (n r, in)
        B = A.new_zeros(sum(out for *_, out in parts), A.shape[0])  # (sum out, n r)
        row = col = 0
        for _, path, out in parts:
            if path in adapters:
                B[row:row + out, col:col + cfg.r] = adapters[path].B.weight.detach()
                col += cfg.r
            row += out
        tensors[f"{prefix}{hf_module}.lora_A.weight"] = A
        tensors[f"{prefix}{hf_module}.lora_B.weight"] = B
        conv1d |= _conv1d(mapper, parts[0][1])
        if len(used) > 1:  # keep alpha'/r' (or alpha'/sqrt(r')) equal to ours at rank n r
            r2 = len(used) * cfg.r
            ranks[re.escape(hf_module)] = r2
            alphas[re.escape(hf_module)] = cfg.scaling * (r2**0.5 if cfg.rslora else r2)
    return tensors, {
        "peft_type": "LORA", "r": cfg.r, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout,
        "use_rslora": cfg.rslora, "target_modules": sorted(_targeted(model, name, layout)), "bias": "none",
        "fan_in_fan_out": conv1d, "rank_pattern": ranks, "alpha_pattern": alphas, "init_lora_weights": True,
        "modules_to_save": None,
    }


def _ia3(model, name, mapper, layout, prefix):
    adapters = {path: layer.adapters[name] for path, layer in model.wrappers() if name in layer.adapters}
    tensors, feedforward = {}, []
    conv1d = False
    for hf_module, parts in _targeted(model, name, layout).items():
        used = [adapters[p] for _, p, _ in parts if p in adapters]
        if used[0].on_input:
            if len(parts) > 1:
                raise HFExportError(f"IA3 input scaling on the fused HF module {hf_module} cannot be expressed")
            tensors[f"{prefix}{hf_module}.ia3_l"] = used[0].scale.detach()[None, :]  # (1, in)
            feedforward.append(hf_module)
        else:
            vec = torch.cat([adapters[p].scale.detach() if p in adapters else
                             used[0].scale.new_ones(out) for _, p, out in parts])
            tensors[f"{prefix}{hf_module}.ia3_l"] = vec[:, None]  # (out, 1)
        conv1d |= _conv1d(mapper, parts[0][1])
    return tensors, {
        "peft_type": "IA3", "target_modules": sorted(_targeted(model, name, layout)),
        "feedforward_modules": sorted(feedforward), "fan_in_fan_out": conv1d, "init_ia3_weights": True,
        "modules_to_save": None,
    }


def _virtual_tokens(model, name, cfg):
    c = model.base_model.config
    if c.arch != "decoder":
        raise HFExportError(f"{cfg.method} export supports decoder-only models (HF peft places {cfg.method} "
                            f"differently for {c.arch} models); this base is {c.arch}")
    common = {"num_virtual_tokens": cfg.num_virtual_tokens, "num_transformer_submodules": 1,
              "num_layers": c.n_layers}
    if cfg.method == "prompt":
        emb = model.prompts[name].embedding.detach()
        return {"prompt_embeddings": emb}, {
            "peft_type": "PROMPT_TUNING", "token_dim": emb.shape[1], "num_attention_heads": c.n_heads,
            "prompt_tuning_init": "RANDOM", **common}
    if c.kv_heads != c.n_heads:
        raise HFExportError("prefix export needs n_kv_heads == n_heads (HF peft rescales GQA prefixes itself)")
    kv = model.prefixes[name].stacks["decoder"]().detach()  # (L, 2, H, P, hd)
    L, _, H, P, hd = kv.shape
    # peft views prompt_embeddings as (P, L * 2, H, hd): entry 2l is layer l's keys, 2l + 1 its values.
    emb = kv.permute(3, 0, 1, 2, 4).reshape(P, L * 2 * H * hd)
    return {"prompt_embeddings": emb}, {
        "peft_type": "PREFIX_TUNING", "token_dim": H * hd, "num_attention_heads": H, "prefix_projection": False,
        "encoder_hidden_size": H * hd, **common}
