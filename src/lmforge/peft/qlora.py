"""QLoRA: LoRA on a frozen base whose linear weights are stored as 4-bit NormalFloat (Dettmers et al. 2023,
"QLoRA: Efficient Finetuning of Quantized LLMs").

NF4 quantises each block of 64 weights to 4-bit indices into 16 levels placed at quantiles of N(0, 1)
(so they are equally used by normally distributed weights), scaled by the block's absmax. *Double
quantisation* stores those absmax scales in 8 bits, with one fp32 scale per 256 of them, which saves
another ~0.4 bit per weight. Storage per weight: 4 bits + 8/64 bits = 0.52 bytes, about 0.13x fp32.

The quantiser is torchao's ``NF4Tensor`` (maintained, pure PyTorch, so it runs on CPU and GPU alike);
bitsandbytes is not needed. The forward dequantises a block-exact copy of the weight on the fly
(``torchao``'s ``linear_nf4``), and its backward never materialises a weight gradient. LoRA
(:mod:`lmforge.peft.lora`) then trains on top in the base's original precision.

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

import contextlib
import functools
import logging
import math

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.peft.config import PeftConfig
from lmforge.peft.targets import STACKS

# The NF4 levels of Dettmers et al. 2023 (appendix E): quantiles of N(0, 1), normalised to [-1, 1],
# with an exact zero. Kept here to test the maintained quantiser against the paper.
NF4_CODEBOOK = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)


@functools.cache
def _torchao_nf4():
    """torchao's NF4 API. Its import logs that optional CUDA kernels are missing, which NF4 never uses."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    with contextlib.ExitStack() as stack:
        for lg, level in zip(loggers, levels):
            lg.setLevel(logging.ERROR)
            stack.callback(lg.setLevel, level)
        try:
            from torchao.quantization import NF4Tensor, to_nf4
            from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4
        except ImportError as exc:
            raise ImportError("QLoRA needs torchao for its NF4 weights: pip install 'torchao>=0.18'") from exc
    return NF4Tensor, to_nf4, linear_nf4


class NF4Linear(nn.Module):
    """A frozen linear whose weight is stored as NF4 with double-quantised scales.

    Shapes: x (..., in) -> (..., out), like the nn.Linear it replaces.

    Args:
        linear: the layer to quantise (its bias, if any, stays in full precision).
        block_size: weights per absmax scale (64 in the paper).
        scaler_block_size: scales per second-level fp32 scale (256 in the paper; lowered to a divisor of
            the number of blocks for small matrices).
    """

    def __init__(self, linear: nn.Linear, block_size: int = 64, scaler_block_size: int = 256):
        super().__init__()
        _, to_nf4, _ = _torchao_nf4()
        weight = linear.weight.detach()
        if weight.numel() % block_size:
            raise ConfigError(f"NF4: a {tuple(weight.shape)} weight does not split into blocks of {block_size}")
        n_blocks = weight.numel() // block_size
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.block_size, self.scaler_block_size = block_size, math.gcd(n_blocks, scaler_block_size)
        # A Parameter (frozen) rather than a buffer, so .to(), state_dict() and parameter counts see it.
        self.weight = nn.Parameter(to_nf4(weight.contiguous(), block_size, self.scaler_block_size), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, linear_nf4 = _torchao_nf4()
        y = linear_nf4(x, self.weight)  # dequantises in x's dtype; no gradient for the weight
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def dense_weight(self) -> torch.Tensor:
        """The dequantised (out, in) weight."""
        return self.weight.get_original_weight()

    def nbytes(self) -> int:
        """Bytes of the stored weight: 4-bit codes, 8-bit scales, fp32 second-level scales (bias excluded)."""
        w = self.weight
        return sum(t.numel() * t.element_size() for t in (w.quantized_data, w.quantized_scalers,
                                                          w.quantization_factor, w.scaler_mean, w.nf4))

    def dequantized(self) -> nn.Linear:
        """A plain nn.Linear holding the dequantised weight (for merged exports)."""
        from lmforge.peft.layer import plain_linear

        return plain_linear(self.dense_weight(), None if self.bias is None else self.bias.detach())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, nf4 block={self.block_size}"


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


def attach(model, name: str, cfg: PeftConfig, **kwargs) -> None:
    """Quantise the base (once per PeftModel), then add LoRA adapter ``name`` on top."""
    from lmforge.peft import lora

    if not model.quantized:
        quantize_base(model.base_model, cfg.nf4_block_size, cfg.nf4_scaler_block_size)
        model.quantized = True
    lora.attach(model, name, cfg, **kwargs)
