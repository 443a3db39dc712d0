"""QLoRA: LoRA on a frozen base whose linear weights are stored as 4-bit NormalFloat (Dettmers et al. 2023,
"QLoRA: Efficient Finetuning of Quantized LLMs").

NF4 quantises each block of 64 weights to 4-bit indices into 16 levels placed at quantiles of N(0, 1)
(so they are equally used by normally distributed weights), scaled by the block's absmax. *Double
quantisation* stores those absmax scales in 8 bits, with one fp32 scale per 256 of them, which saves
another ~0.4 bit per weight. Storage per weight: 4 bits + 8/64 bits = 0.52 bytes, about 0.13x fp32.

The quantiser is torchao's ``NF4Tensor`` (maintained, pure PyTorch, so it runs on CPU and GPU alike), held by
:class:`~lmforge.peft.nf4.NF4Linear`; bitsandbytes is not needed. The forward dequantises a block-exact copy
of the weight on the fly (``torchao``'s ``linear_nf4``), and its backward never materialises a weight
gradient. LoRA (:mod:`lmforge.peft.lora`) then trains on top in the base's original precision.

Only the linears of the Transformer stacks are quantised; embeddings, norms and output heads keep their
precision, as in the paper. Merging a QLoRA adapter folds ``(alpha/r) B A`` into the *dequantised* weight,
the base the adapter was trained against.

Example:
    >>> import torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=1), PeftConfig(method="qlora", r=4))
    >>> q = model.base_model.decoder.layers[0].ffn.up
    >>> type(q).__name__, round(q.nbytes() / (q.in_features * q.out_features * 4), 2)
    ('NF4Linear', 0.13)
"""

from __future__ import annotations

from torch import nn

from lmforge.peft.lora import LORA_OPTIONS
from lmforge.peft.lora import attach as attach_lora
from lmforge.peft.method import PeftMethod
from lmforge.peft.nf4 import NF4Linear
from lmforge.peft.targets import STACKS

# The NF4 levels of Dettmers et al. 2023 (appendix E): quantiles of N(0, 1), normalised to [-1, 1],
# with an exact zero. Kept here to test the maintained quantiser against the paper.
NF4_CODEBOOK = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


def quantize_base(model: nn.Module, block_size: int = 64, scaler_block_size: int = 256) -> list[str]:
    """Swap every nn.Linear of the Transformer stacks for an :class:`NF4Linear`, in place.

    Returns the names of the quantised layers. Call it before any adapter is attached: a base that
    adapters were trained against must not change under them (PeftModel enforces this).
    """
    done = []
    for name, module in list(model.named_modules()):
        if not name.startswith(STACKS) or not isinstance(module, nn.Linear):
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, leaf, NF4Linear(module, block_size, scaler_block_size))
        done.append(name)
    return done


def base_weight_bytes(model: nn.Module) -> tuple[int, int]:
    """(stored bytes of the NF4 weights, bytes the same weights take in fp32)."""
    stored = full = 0
    for module in model.modules():
        if isinstance(module, NF4Linear):
            stored += module.nbytes()
            full += module.in_features * module.out_features * 4
    return stored, full


def attach(model, name: str, cfg, **kwargs) -> None:
    """Quantise the base (once per PeftModel), then add LoRA adapter ``name`` on top (``cfg``: a PeftConfig)."""
    if not model.quantized:
        quantize_base(model.base_model, cfg.nf4_block_size, cfg.nf4_scaler_block_size)
        model.quantized = True
    attach_lora(model, name, cfg, **kwargs)


METHOD = PeftMethod("qlora", attach, options=(*LORA_OPTIONS, "nf4_block_size", "nf4_scaler_block_size"),
                    default_targets=("q", "v"), mergeable=True)
