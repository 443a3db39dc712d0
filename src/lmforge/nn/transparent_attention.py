"""Transparent attention (Bapna et al. 2018): each decoder layer cross-attends to its own learned mix of every
encoder layer, not to the last one alone (a row of Narang et al. 2021's Table 1).

With encoder states ``h_0`` (the embeddings) .. ``h_N`` (the last layer, after the stack's final norm), decoder
layer ``j`` reads the memory

    m_j = sum_i softmax(W[j])_i * h_i          W: (decoder layers, N + 1) learned logits, initialised at 0

so at the start every decoder layer reads the plain average of the encoder's layers. Gradients then reach the
lower encoder layers straight from every decoder layer, which is what let Bapna et al. train deep encoders.

The encoder hands the decoder all ``N + 1`` states at once as one (B, S, N + 1, D) memory (what
``Transformer.encode`` returns under ``ModelConfig.transparent_attention``); generation's beam and batch
reordering index its first dimension as for an ordinary (B, S, D) memory, and each decoder layer's cross-
attention caches the keys and values of its own mix.

Example:
    >>> import torch
    >>> mix = TransparentMix(n_sources=3, n_layers=2)
    >>> memory = torch.stack([torch.zeros(1, 4, 8), torch.ones(1, 4, 8), 2 * torch.ones(1, 4, 8)], dim=2)
    >>> mix(memory, layer=0)[0, 0, :2].tolist()  # the average of 0, 1 and 2
    [1.0, 1.0]
"""

from __future__ import annotations

import torch
from torch import nn


def stack_states(hidden: list[torch.Tensor]) -> torch.Tensor:
    """The encoder's N + 1 states, each (B, S, D) -> one (B, S, N + 1, D) memory."""
    return torch.stack(hidden, dim=2)


class TransparentMix(nn.Module):
    """Per decoder layer, a softmax-weighted sum over the encoder's states: (B, S, N + 1, D) -> (B, S, D).

    Args:
        n_sources: N + 1, the encoder's layers and its embeddings.
        n_layers: decoder layers, each with its own weights.
    """

    def __init__(self, n_sources: int, n_layers: int) -> None:
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(n_layers, n_sources))  # W, uniform weights at the start

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.logits)

    def weights(self, layer: int) -> torch.Tensor:
        """softmax(W[layer]): (N + 1,), computed in fp32."""
        return torch.softmax(self.logits[layer].float(), dim=-1)

    def forward(self, memory: torch.Tensor, layer: int) -> torch.Tensor:
        if memory.dim() != 4 or memory.shape[2] != self.logits.shape[1]:
            raise ValueError(f"transparent attention mixes {self.logits.shape[1]} encoder states, but the memory "
                             f"has shape {tuple(memory.shape)}; pass Transformer.encode's (B, S, N + 1, D)")
        w = self.weights(layer).to(memory.dtype)
        return torch.einsum("bsnd,n->bsd", memory, w)  # (B, S, D)
