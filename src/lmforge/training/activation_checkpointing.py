"""Activation checkpointing: keep only each layer's input, recompute its insides during backward.

Training memory is dominated by the activations saved for backward: attention scores, FFN hidden states,
norms, for every layer. With checkpointing, a Transformer layer saves only its input ``x`` (B, T, D); the
backward pass reruns the layer's forward to rebuild the rest. That trades about one extra forward pass
(~30% more compute) for activation memory that no longer grows with the layer's internals.

Dropout masks are reproduced exactly in the recomputation (``torch.utils.checkpoint`` restores the RNG state),
so gradients are the same as without checkpointing. The switch is made per module instance, so the model
code and its state-dict names stay untouched.

Example:
    >>> import lmforge, torch
    >>> model = lmforge.build_model("gpt-tiny", n_layers=2)
    >>> enable_activation_checkpointing(model)
    2
    >>> model.train()(torch.randint(0, 8192, (1, 8)), labels=torch.randint(0, 8192, (1, 8))).loss.backward()
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmforge.nn.block import Block


def _checkpointed_forward(self: nn.Module, *args, **kwargs):
    forward = type(self).forward.__get__(self)
    if self.training and torch.is_grad_enabled():
        # Non-reentrant checkpointing accepts non-tensor arguments (the AttentionContext) and keyword args.
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return forward(*args, **kwargs)


def enable_activation_checkpointing(model: nn.Module) -> int:
    """Checkpoint every Transformer layer (:class:`~lmforge.nn.block.Block`) of ``model``; return how many.

    Calling it twice changes nothing more. A bound method (not a closure) is installed, so ``copy.deepcopy``
    of the model checkpoints the copy's own layers.
    """
    count = 0
    for module in model.modules():
        if isinstance(module, Block):
            module.forward = types.MethodType(_checkpointed_forward, module)
            count += 1
    return count
