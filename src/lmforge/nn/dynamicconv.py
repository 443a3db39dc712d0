"""Dynamic convolution in place of self-attention (Wu et al. 2019, "Pay Less Attention with Lightweight and
Dynamic Convolutions"): ``attention="dynamicconv"``.

Lightweight convolution (:mod:`lmforge.nn.lightconv`) with a kernel that changes from position to position:
it is predicted from the current position's input alone, by a linear map to H k logits, softmaxed over the
width per head:

    DynamicConv(u)_{i,c} = sum_{j=1..k} softmax(u_i W_Q)_{h,j} * u_{i + j - p, c}      W_Q (d, H k), h = c // (d / H)

Because the kernel reads position i only, never its neighbours, the cost stays linear in the sequence length,
and a decoder stays causal with the window ending at i. The block around it is the lightweight one's
(GLU input projection, the convolution, an output projection), and so are padding, weight dropout and
incremental decoding: each step predicts its kernel from its own input and reaches back into the cached ones.

Example:
    >>> import torch
    >>> from lmforge.config import ModelConfig
    >>> from lmforge.nn.attention import AttentionContext
    >>> cfg = ModelConfig(d_model=32, n_heads=4, d_ff=64, vocab_size=10, attention="dynamicconv", conv_kernel=3)
    >>> conv = DynamicConv(cfg, causal=True)
    >>> conv.kernel(torch.randn(2, 5, 32)).shape  # (B, T, H, k): one kernel per position and head
    torch.Size([2, 5, 4, 3])
    >>> conv(torch.randn(2, 5, 32), AttentionContext(is_causal=True)).shape
    torch.Size([2, 5, 32])
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.config import ModelConfig
from lmforge.nn.lightconv import LightweightConv
from lmforge.nn.linear import apply_linear


class DynamicConv(LightweightConv):
    """The dynamic-convolution block: :class:`~lmforge.nn.lightconv.LightweightConv` whose (H, k) kernel
    is replaced by ``kernel_proj`` (D -> H k), applied to each position's own input."""

    def __init__(self, cfg: ModelConfig, causal: bool):
        super().__init__(cfg, causal)
        self.kernel_proj = nn.Linear(cfg.d_model, self.heads * self.k, bias=cfg.bias)

    def _kernel_weight(self) -> None:
        return None  # the kernels are predicted, not stored

    def kernel(self, u: torch.Tensor) -> torch.Tensor:
        """u (B, T, D) -> softmaxed kernels (B, T, H, k), each from its own position's input."""
        B, T, _ = u.shape
        return apply_linear(self.kernel_proj, u).view(B, T, self.heads, self.k).softmax(-1)


# What ``ModelConfig.attention`` names, for the layers that build their token mixer from it.
CONVOLUTIONS = {"lightconv": LightweightConv, "dynamicconv": DynamicConv}
