"""ELMo's scalar mix: one learned, softmax-weighted combination of a model's layer representations.

It sits here, below the models, because the biLM owns one and sentence encoders build their own.
"""

from __future__ import annotations

import torch
from torch import nn


class ScalarMix(nn.Module):
    """ELMo's task-specific layer combination: ``gamma * sum_j softmax(s)_j * h_j`` (Peters et al. 2018, eq. 1).

    The softmax keeps the layer weights positive and summing to one, so ``gamma`` alone sets the scale.
    Initialised at s = 0, i.e. the plain average of the layers.

    Args:
        n_layers: number of layers mixed (N+1 for a Transformer: embeddings and every block).

    Example:
        >>> mix = ScalarMix(3)
        >>> layers = [torch.full((1, 2, 4), float(i)) for i in range(3)]   # 3 x (B, T, D)
        >>> mix(layers)[0, 0].tolist(), float(mix.weights.sum().detach())
        ([1.0, 1.0, 1.0, 1.0], 1.0)
    """

    def __init__(self, n_layers: int):
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    @property
    def weights(self) -> torch.Tensor:
        """(L,) softmax-normalised layer weights."""
        return torch.softmax(self.scalars, dim=0)

    def forward(self, layers: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        if len(layers) != self.scalars.numel():
            raise ValueError(f"ScalarMix expects {self.scalars.numel()} layers, got {len(layers)}")
        stacked = torch.stack(list(layers), dim=0)  # (L, ..., D)
        w = self.weights.view(-1, *([1] * (stacked.dim() - 1))).to(stacked.dtype)
        return self.gamma * (w * stacked).sum(0)
